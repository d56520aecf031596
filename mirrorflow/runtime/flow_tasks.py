"""A flow's periodic tasks, run by its job's scheduler beside the copying: what MirrorMaker 2's
connectors do on their intervals, and what keeps the flow's job known to be alive.

- the flow's lease renewed every :data:`~mirrorflow.replication.lease.RENEW_S`;
- heartbeats (``emit.heartbeats.interval.seconds``, MirrorHeartbeatConnector);
- the topic refresh (``refresh.topics.interval.seconds``) and the offset map's runs whose
  records retention removed, on the same interval;
- config and ACL sync (``sync.topic.configs``/``sync.topic.acls``, at start then every interval,
  as MirrorSourceConnector does);
- checkpoints, the group list and group offset sync (MirrorCheckpointConnector's);
- the flow's progress report and its lag as the source says it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from mirrorflow.errors import MirrorflowError
from mirrorflow.replication import lag
from mirrorflow.replication.checkpoint_stores import expire_offset_map
from mirrorflow.replication.checkpoint_task import GroupCheckpoints
from mirrorflow.replication.config_sync import AclSync, TopicSync
from mirrorflow.replication.group_offset_sync import GroupOffsetSync
from mirrorflow.replication.heartbeats import HeartbeatEmitter
from mirrorflow.replication.lease import RENEW_S
from mirrorflow.replication.scheduler import Scheduler, TaskFailed
from mirrorflow.replication.topics import client_principal
from mirrorflow.runtime import trend

if TYPE_CHECKING:
    from mirrorflow.runtime.driver import MirrorJob

log = logging.getLogger("mirrorflow.mirror")

REPORT_PROGRESS_S = 10.0  # progress.json is rewritten this often, busy or idle (liveness)


class FlowTasks:
    """The periodic tasks of ``job``'s flow; its checkpoint task and group offset sync are kept
    across the job's retries (their state: the groups seen, the checkpoints written)."""

    def __init__(self, job: MirrorJob) -> None:
        self.job = job
        self.checkpoints: GroupCheckpoints | None = None
        self.group_sync: GroupOffsetSync | None = None

    def schedule(self, once: bool) -> Scheduler:
        """A scheduler holding the flow's tasks (``once``: only the lease, heartbeats and the
        report), not started yet; tasks that run at start have run."""
        job, spec = self.job, self.job.spec
        scheduler = Scheduler(spec.flow)
        scheduler.add("renew-lease", RENEW_S, job.renew_lease, alone=True)
        if spec.emit_heartbeats:
            heartbeats = HeartbeatEmitter(
                spec.source,
                spec.target,
                {spec.target: job.producers[spec.target]},
                spec.heartbeats_topic,
                {spec.target: client_principal(spec.target_client)},
            )
            beat = self._beat(heartbeats)
            scheduler.run_now(
                scheduler.add("heartbeats", spec.heartbeats_interval_s, beat, alone=True)
            )
        if spec.refresh_topics_enabled and not once:
            scheduler.add("refresh-topics", spec.refresh_topics_interval_s, job.refresh_topics)
        if not once:  # runs whose records retention removed from the source
            scheduler.add(
                "expire-offset-map", spec.refresh_topics_interval_s, self._expire_offset_map
            )
        # Config and ACL sync run at start, then every interval, as in MirrorMaker 2: changes
        # made while no job ran reach the target before the first batch.
        for enabled, name, interval, sync in (
            (
                spec.sync_configs_enabled,
                "sync-topic-configs",
                spec.sync_configs_interval_s,
                TopicSync,
            ),
            (spec.sync_acls_enabled, "sync-topic-acls", spec.sync_acls_interval_s, AclSync),
        ):
            if enabled and not once:
                run = sync(spec, job.admins).scheduled_run
                scheduler.run_now(scheduler.add(name, interval, run))
        if spec.emit_checkpoints_enabled and not once:
            self._schedule_checkpoints(scheduler)
        if spec.flow_dir:  # progress.json fresh even during a long batch: the flow is alive
            report = trend.sampled(job, job.report.report_progress, REPORT_PROGRESS_S)
            scheduler.add("report-progress", REPORT_PROGRESS_S, report, alone=True)
            # The lag as the source says it is, busy or idle, the target away or not.
            scheduler.add("measure-lag", lag.MEASURE_EVERY_S, job.report.measure_lag, alone=True)
        return scheduler

    def _beat(self, heartbeats: HeartbeatEmitter) -> Callable[[], None]:
        """The heartbeat task: one heartbeat, its acknowledgement noted in the metrics."""
        metrics = self.job.metrics
        if metrics is None:
            return heartbeats.beat

        def beat() -> None:
            heartbeats.beat()
            metrics.heartbeat()

        return beat

    def _expire_offset_map(self) -> None:
        job, spec = self.job, self.job.spec
        try:
            dropped = expire_offset_map(
                spec, job.admins[spec.source], job.offset_map, job.producers[spec.target]
            )
        except MirrorflowError as exc:  # the copying notices an unreachable cluster itself
            raise TaskFailed(str(exc)) from None
        if dropped:
            log.info(
                "%s: %d runs of the offset map expired with the source's records",
                spec.flow,
                dropped,
            )

    def _schedule_checkpoints(self, scheduler: Scheduler) -> None:
        """MirrorMaker 2's checkpoint task, inside the job: checkpoints every
        ``emit.checkpoints.interval.seconds``, the group list every
        ``refresh.groups.interval.seconds``, and, if enabled, the group offset sync."""
        job, spec = self.job, self.job.spec
        if self.checkpoints is None:
            self.checkpoints = GroupCheckpoints(
                spec,
                job.admins,
                job.offset_map,
                lambda: dict(job.positions),
                job.producers[spec.target],
                on_written=job.metrics.checkpoints if job.metrics is not None else None,
            )
        scheduler.add(
            "emit-checkpoints", spec.emit_checkpoints_interval_s, self.checkpoints.scheduled_emit
        )
        if spec.refresh_groups_enabled:
            scheduler.add(
                "refresh-groups", spec.refresh_groups_interval_s, self.checkpoints.scheduled_refresh
            )
        if spec.sync_group_offsets_enabled:
            if self.group_sync is None:
                self.group_sync = GroupOffsetSync(
                    spec, job.admins, self.checkpoints.snapshot, self.checkpoints.still_on_source
                )
            scheduler.add(
                "sync-group-offsets",
                spec.sync_group_offsets_interval_s,
                self.group_sync.scheduled_run,
            )
