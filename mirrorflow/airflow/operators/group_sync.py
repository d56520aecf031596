"""The operator of the ``groups`` task of a site's sync DAG (``sync__<target>``): the
consumer-group checkpoints and offset sync of its flows
(:func:`mirrorflow.replication.group_offset_sync.run_group_sync`).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowException

from mirrorflow.airflow.operators.flow_files import FlowsOperator, flow_file_paths
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import project_root


class GroupSyncOperator(FlowsOperator):
    """The ``groups`` task of a site's sync DAG: for each of ``flows``, checkpoint its consumer
    groups now and, where the flow sets ``sync.group.offsets.enabled``, commit the translated
    offsets into the target's idle groups (``mirrorflow sync-groups``; the logic is
    :func:`mirrorflow.replication.group_offset_sync.run_group_sync`).

    Each group's translation table (source partition, committed offset, target partition,
    resume offset, exactness, what was done) is logged, with the groups skipped because they
    have members on the target; the runs are returned (XCom). A run's Param ``dry_run``
    translates and logs only: no checkpoint is written, no offset committed. An unreachable
    cluster or a refusal fails the task with one line naming cluster and principal.

    :param flows: the flows (``"SOURCE->TARGET"`` each); those with
        ``emit.checkpoints.enabled = false`` are passed over
    :param flow_files: their flow files (mm2.properties or YAML), merged in order
    """

    ui_color = "#e0e8f0"

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from mirrorflow.replication.group_offset_sync import run_group_sync
        from mirrorflow.replication.spec import spec_for_flow

        dry_run = bool((context.get("params") or {}).get("dry_run"))
        paths = flow_file_paths(self.flow_files, ", ".join(self.flows))
        runs = []
        for flow in self.flows:
            try:
                # ${file:…} references resolve from the project root, as for the mirror job.
                spec = spec_for_flow(paths, flow, base_dir=project_root())
                if not spec.emit_checkpoints_enabled:
                    self.log.info("%s: emit.checkpoints.enabled = false: no checkpoints", flow)
                    continue
                run = run_group_sync(
                    spec, sync_offsets=spec.sync_group_offsets_enabled, dry_run=dry_run
                )
            except MirrorflowError as exc:
                raise AirflowException(f"group sync of {flow}: {exc}") from None
            for line in run.lines():  # the groups skipped are warned of as they are
                self.log.info("%s", line)
            runs.append(run.as_dict())
        return runs
