"""mirrorflow as an Airflow provider: the provider info Airflow reads through the
``apache_airflow_provider`` entry point of an installed mirrorflow (``airflow providers list``,
the UI's Providers page), naming its hook and operators. Its plugin (the Replication page) is
registered through the ``airflow.plugins`` entry point (:mod:`mirrorflow.airflow.ui.plugin`).

mirrorflow has no connection type of its own: its hook runs mirror jobs on the Spark provider's
``spark`` connections (the master), and ``${airflow:CONN_ID:FIELD}`` in a flow file reads a
field of any connection (:mod:`mirrorflow.airflow.connections`)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

PACKAGE = "mirrorflow"
INTEGRATION = "mirrorflow"
# mirrorflow.airflow.operators' modules, one per concept
OPERATORS = ("mirror", "flow_control", "config_sync", "group_sync", "dr")


def get_provider_info() -> dict[str, Any]:
    """The provider info, as Airflow's ``provider_info.schema.json`` describes it."""
    try:
        versions = [version(PACKAGE)]
    except PackageNotFoundError:  # a checkout on the path, not installed
        versions = []
    return {
        "package-name": PACKAGE,
        "name": "mirrorflow",
        "description": "Kafka replication with MirrorMaker 2's semantics: flows, mirror jobs on "
        "Spark, topic-config/ACL sync, checkpoints, failover, failback and DR drills.",
        "versions": versions,
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://kafka.apache.org/documentation/#georeplication",
                "tags": ["service"],
            }
        ],
        "hooks": [
            {"integration-name": INTEGRATION, "python-modules": ["mirrorflow.airflow.hooks"]}
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [f"mirrorflow.airflow.operators.{name}" for name in OPERATORS],
            }
        ],
    }
