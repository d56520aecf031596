"""mirrorflow: Kafka replication with MirrorMaker 2's semantics, run by Airflow and Spark.

The package is layered; each layer imports only the layers below it (checked by the tests,
``[tool.importlinter]`` in ``pyproject.toml``):

* :mod:`mirrorflow.cli`: the ``mirrorflow`` command, thin.
* :mod:`mirrorflow.devtools`: local clusters (sandbox), a local Airflow, the demo.
* :mod:`mirrorflow.airflow`: the operators and hook of the generated DAGs, and their rendering;
  the only place that imports Airflow.
* :mod:`mirrorflow.runtime`: mirror jobs on Spark: the driver, launching, the JVM artefacts,
  job processes and their control files.
* :mod:`mirrorflow.replication`: what a flow does to clusters (topics, positions, heartbeats,
  offsets, batch plans, the periodic-work scheduler), with Kafka clients and without Spark.
* :mod:`mirrorflow.config`: flow definitions: properties and YAML files, config providers, the
  topology model, validation.
* :mod:`mirrorflow.mm2`: MirrorMaker 2's own concepts (configuration definitions, replication
  policies, filters, wire formats, the offset-sync rule and store), usable without Spark,
  Airflow or a Kafka client.
* :mod:`mirrorflow.errors`, :mod:`mirrorflow.paths`: the ground floor.
"""
