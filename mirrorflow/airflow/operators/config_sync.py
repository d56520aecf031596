"""The operator of the ``sync`` task of a site's sync DAG (``sync__<target>``): the
topic-config, partition and ACL sync of its flows (:mod:`mirrorflow.replication.config_sync`).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowException

from mirrorflow.airflow.operators.flow_files import FlowsOperator, flow_file_paths
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import project_root


class SyncOperator(FlowsOperator):
    """The task of a site's sync DAG: the topic-config, partition and ACL sync of ``flows``
    (``mirrorflow sync``), each change logged, the reports returned (XCom).

    A run's Param ``dry_run`` shows the diff without applying it. A refused change (or an
    unreachable cluster) fails the task with one line naming cluster, principal and resource.

    :param flows: the flows to sync (``"SOURCE->TARGET"`` each)
    :param flow_files: their flow files (mm2.properties or YAML), merged in order
    """

    ui_color = "#e8f0e0"

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from mirrorflow.replication.config_sync import run_syncs
        from mirrorflow.replication.spec import spec_for_flow

        dry_run = bool((context.get("params") or {}).get("dry_run"))
        paths = flow_file_paths(self.flow_files, ", ".join(self.flows))
        reports, failures = [], []
        try:
            for flow in self.flows:
                # ${file:…} references resolve from the project root, as for the mirror job.
                spec = spec_for_flow(paths, flow, base_dir=project_root())
                for report in run_syncs(spec, dry_run)[0]:
                    for line in report.lines():
                        self.log.info("%s", line)
                    reports.append(report.as_dict())
                    failures += [f"{flow}: {failure}" for failure in report.failures]
        except MirrorflowError as exc:
            raise AirflowException(f"sync of {', '.join(self.flows)}: {exc}") from None
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise AirflowException(failures[0] + more)
        return reports
