"""The Airflow plugin of mirrorflow's Replication page (Airflow 3's plugin interfaces: a FastAPI
app at ``/mirrorflow`` and a nav entry showing it, under Browse).

Installed as a package (``pip install mirrorflow``, or the checkout's own editable install),
Airflow loads it through mirrorflow's ``airflow.plugins`` entry point, with nothing copied into
its plugins folder; ``plugins/mirrorflow_ui.py`` serves a checkout that is not installed."""

from __future__ import annotations

from importlib.metadata import entry_points

from airflow.plugins_manager import AirflowPlugin

from mirrorflow.airflow.ui.app import create_app

ENTRY_POINT_GROUP = "airflow.plugins"


class MirrorflowUiPlugin(AirflowPlugin):
    """The Replication page: ``/mirrorflow/`` on the api-server, in the Browse menu."""

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


def registered_by_entry_point() -> bool:
    """Whether Airflow loads this plugin through mirrorflow's installed entry point."""
    return any(
        point.value.startswith(f"{__name__}:") for point in entry_points(group=ENTRY_POINT_GROUP)
    )
