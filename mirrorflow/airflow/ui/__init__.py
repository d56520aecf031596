"""mirrorflow's page inside the Airflow UI: a FastAPI app (its plugin, :mod:`.plugin`, mounts
it at ``/mirrorflow``) showing every cluster and flow of the rendered mirror DAGs with its health
(:mod:`mirrorflow.health`); every route needs Airflow's login and DAG read permission."""
