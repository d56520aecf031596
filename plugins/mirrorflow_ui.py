"""Airflow plugin: mirrorflow's replication health page in the Airflow UI (Airflow 3's plugin
interfaces: a FastAPI app at ``/mirrorflow`` and a nav entry showing it). The logic lives in
:mod:`mirrorflow.airflow.ui`; every route requires Airflow's login and DAG read permission."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from mirrorflow.airflow.ui.app import create_app


class MirrorflowUiPlugin(AirflowPlugin):
    name = "mirrorflow"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/mirrorflow", "name": "mirrorflow"}]
    external_views = [
        {
            "name": "Replication",
            "href": "mirrorflow/",
            "url_route": "mirrorflow",
            "destination": "nav",
            "category": "browse",
        }
    ]
