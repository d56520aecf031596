"""Group offset sync, MirrorMaker 2's ``sync.group.offsets`` (the part of its
``MirrorCheckpointTask`` that commits checkpoints into the target's groups).

:class:`GroupOffsetSync`: every ``sync.group.offsets.interval.seconds`` it commits the latest
checkpoints (:mod:`~mirrorflow.replication.checkpoint_task`) into the target's groups that have no
members there. A group absent from the target gets them all; an EMPTY group only moves forwards; a
group with members on the target is never touched, and is reported.

A group deleted on the source (or left without committed offsets on the flow's partitions)
leaves the checkpoints that are synced at the next checkpoint run, as does one the source no
longer lists; and before the sync creates a group absent from the target it asks the source
whether the group still has offsets there. So a group deleted on the source, then on the target,
stays deleted, where MirrorMaker 2 re-creates it on the target until its next group refresh.
When the source does not answer, the last checkpoints stand.

:func:`run_group_sync` does both once, now, for ``mirrorflow sync-groups`` and the sync DAG's
``groups`` task, with a translation table per group; as a dry run it only reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException

from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.formats import Checkpoint
from mirrorflow.replication.checkpoint_stores import GroupKey, read_offset_map
from mirrorflow.replication.checkpoint_task import GroupCheckpoints
from mirrorflow.replication.group_offsets_client import (
    COORDINATOR_MOVING,
    COORDINATOR_WAIT_S,
    GroupOffsetsClient,
)
from mirrorflow.replication.remote_cluster import (
    PartitionTranslation,
    checkpoint_offset,
    flow_admins,
    flow_positions,
    translation_rows,
)
from mirrorflow.replication.scheduler import TaskFailed
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ADMIN_TIMEOUT_S, ClusterAdmin, cluster_error

log = logging.getLogger(__name__)


@dataclass
class GroupSyncReport:
    """What one group offset sync did on the target."""

    written: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)  # groups with members there: untouched
    kept: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # already further
    gone: list[str] = field(default_factory=list)  # absent on both clusters: not re-created

    def describe(self) -> str:
        parts = [f"{sum(map(len, self.written.values()))} offsets of {len(self.written)} groups"]
        if self.active:
            parts.append(f"skipped {len(self.active)} groups active on the target")
        if self.gone:
            parts.append(f"left {len(self.gone)} groups deleted on the source uncreated")
        return ", ".join(parts)


ACTIVE_STATES = (
    "STABLE",
    "PREPARING_REBALANCING",
    "COMPLETING_REBALANCING",
    "ASSIGNING",
    "RECONCILING",
)


class GroupOffsetSync:
    """Commits the latest checkpoints into the target's idle groups; see the module's doc.

    ``still_on_source`` (:meth:`GroupCheckpoints.still_on_source`), when given, is asked before
    a group absent from the target is created there: a group deleted on both clusters (the
    source first) between two checkpoint runs is not brought back."""

    def __init__(
        self,
        spec: MirrorSpec,
        admins: dict[str, ClusterAdmin],
        checkpoints: Callable[[], dict[GroupKey, Checkpoint]],
        still_on_source: Callable[[str], bool] | None = None,
    ) -> None:
        self.spec, self.target, self.checkpoints = spec, admins[spec.target], checkpoints
        self.still_on_source = still_on_source
        self.offsets = GroupOffsetsClient(self.target, spec.target_consumer)
        self.runs: list[GroupSyncReport] = []

    def _state(self, group: str) -> str:
        deadline = time.monotonic() + COORDINATOR_WAIT_S
        while True:
            try:
                futures = self.target.client.describe_consumer_groups(
                    [group], request_timeout=ADMIN_TIMEOUT_S
                )
                description = futures[group].result()
                break
            except KafkaException as exc:
                code = exc.args[0].code()
                if code == KafkaError.GROUP_ID_NOT_FOUND:
                    return "DEAD"
                if code in COORDINATOR_MOVING and time.monotonic() < deadline:
                    time.sleep(0.5)  # the group's coordinator is being found or loaded
                    continue
                raise cluster_error(
                    self.target, f"describing group {group}", exc, f"DESCRIBE on group {group}"
                ) from None
        if description.members:
            return "ACTIVE"
        return description.state.name

    def run(self, groups: set[str] | None = None, *, dry_run: bool = False) -> GroupSyncReport:
        """One sync of every checkpointed group (or of ``groups``). A dry run commits nothing:
        its report's ``written`` is what it would commit."""
        report = GroupSyncReport()
        by_group: dict[str, list[Checkpoint]] = {}
        for (group, _topic, _partition), checkpoint in sorted(self.checkpoints().items()):
            if groups is None or group in groups:
                by_group.setdefault(group, []).append(checkpoint)
        for group, checkpoints in by_group.items():
            state = self._state(group)
            if state in ACTIVE_STATES or state == "ACTIVE":
                report.active.append(group)
                log.warning(
                    "%s: group %s has members on %s: its offsets are not synced (stop its "
                    "consumers there, or they keep their own positions)",
                    self.spec.flow,
                    group,
                    self.spec.target,
                )
                continue
            current = (
                self.offsets.committed(group, [(c.topic, c.partition) for c in checkpoints])
                if state == "EMPTY"
                else {}
            )
            # Absent from the target (or deleted there since it was described: its offsets are
            # gone): created only while the source still has the group.
            absent = state == "DEAD" or not current
            if absent and self.still_on_source and not self.still_on_source(group):
                report.gone.append(group)
                log.info(
                    "%s: group %s has no offsets on %s any more: not created on %s",
                    self.spec.flow,
                    group,
                    self.spec.source,
                    self.spec.target,
                )
                continue
            write = []
            for c in checkpoints:
                have = current.get((c.topic, c.partition), (-1, ""))[0]
                if have >= c.downstream_offset:
                    report.kept.setdefault(group, []).append((c.topic, c.partition))
                    continue
                write.append(c)
            if not write:
                continue
            offsets = [checkpoint_offset(c) for c in write]
            if dry_run:
                report.written[group] = {(c.topic, c.partition): c.downstream_offset for c in write}
                continue
            try:
                self.offsets.commit(group, offsets)
            except KafkaException as exc:
                if exc.args[0].code() in (
                    KafkaError.UNKNOWN_MEMBER_ID,
                    KafkaError.ILLEGAL_GENERATION,
                    KafkaError.REBALANCE_IN_PROGRESS,
                ):
                    report.active.append(group)  # a member joined meanwhile: MM2 skips it too
                    continue
                raise cluster_error(
                    self.target, f"committing offsets of group {group}", exc
                ) from None
            report.written[group] = {(c.topic, c.partition): c.downstream_offset for c in write}
        self.runs.append(report)
        del self.runs[:-10]
        return report

    def scheduled_run(self) -> None:
        try:
            report = self.run()
        except MirrorflowError as exc:  # unreachable too: the copying notices that itself
            raise TaskFailed(str(exc)) from None
        if report.written or report.active:
            log.info("%s: group offset sync: %s", self.spec.flow, report.describe())


@dataclass
class GroupSyncRun:
    """One flow's groups checkpointed now and, with ``sync_offsets``, their offsets committed
    into the target's idle groups (``mirrorflow sync-groups``, the sync DAG's ``groups`` task).

    ``translations`` has each group's translation table (its latest checkpoints as they are
    after the run), ``checkpoints`` the checkpoints written, ``report`` the offset sync's. In a
    dry run nothing is written: they are what the run would write and commit."""

    flow: str
    target: str
    dry_run: bool
    sync_offsets: bool
    translations: dict[str, list[PartitionTranslation]] = field(default_factory=dict)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    report: GroupSyncReport | None = None

    def lines(self) -> list[str]:
        """The run as log lines: a head, then per group its translation table."""
        would = "would write" if self.dry_run else "wrote"
        head = (
            f"{self.flow} groups: {len(self.translations)} checkpointed group(s), {would} "
            f"{len(self.checkpoints)} checkpoint(s)"
        )
        if self.report is not None:
            commits = sum(map(len, self.report.written.values()))
            verb = "would commit" if self.dry_run else "committed"
            head += f", {verb} {commits} offset(s) of {len(self.report.written)} group(s)"
            if self.report.active:
                head += f", skipped {len(self.report.active)} group(s) active on {self.target}"
        else:
            head += " (sync.group.offsets.enabled = false: no offsets committed)"
        if self.dry_run:
            head += " (dry run: nothing written)"
        lines = [head]
        checkpointed = {(c.group, c.topic, c.partition) for c in self.checkpoints}
        for group, rows in self.translations.items():
            lines.append(f"  group {group}: {self._group_state(group)}")
            if not rows:
                lines.append("    no committed offsets on the flow's replicated partitions")
                continue
            lines.append(
                f"    {'source partition':<30} {'committed':>10}  {'target partition':<38} "
                f"{'resume at':>10}  {'exactness':<17}  action"
            )
            for r in rows:
                resume = "-" if r.translated is None else str(r.translated)
                action = self._action(
                    group, r, (group, r.target_topic, r.partition) in checkpointed
                )
                source, target = (
                    f"{r.source_topic}-{r.partition}",
                    f"{r.target_topic}-{r.partition}",
                )
                lines.append(
                    f"    {source:<30} {r.committed:>10}  {target:<38} {resume:>10}  "
                    f"{r.exactness:<17}  {action}"
                )
        if self.report is not None and self.report.active:
            lines.append(
                f"  skipped, with members on {self.target}: {', '.join(self.report.active)}"
            )
        return lines

    def _group_state(self, group: str) -> str:
        if self.report is None:
            return "checkpoints only"
        if group in self.report.active:
            return (
                f"has members on {self.target}: offsets not synced (stop its consumers there, "
                "or they keep their own positions)"
            )
        if group in self.report.written:
            return ("would commit" if self.dry_run else "committed") + f" offsets on {self.target}"
        return f"offsets on {self.target} already there or further"

    def _action(self, group: str, row: PartitionTranslation, checkpointed: bool) -> str:
        if row.translated is None:
            return "nothing copied yet"
        done = []
        if checkpointed:
            done.append("would checkpoint" if self.dry_run else "checkpointed")
        else:
            done.append("checkpoint unchanged")
        if self.report is not None and group not in self.report.active:
            committed = self.report.written.get(group, {})
            if (row.target_topic, row.partition) in committed:
                done.append("would commit" if self.dry_run else "committed")
            elif (row.target_topic, row.partition) in self.report.kept.get(group, []):
                done.append("target group already there")
        return ", ".join(done)

    def as_dict(self) -> dict[str, object]:
        """The run as JSON-able data (the DAG task's XCom)."""
        report = self.report
        return {
            "flow": self.flow,
            "target": self.target,
            "dry_run": self.dry_run,
            "sync_offsets": self.sync_offsets,
            "groups": {g: [r.as_dict() for r in rows] for g, rows in self.translations.items()},
            "checkpoints_written": len(self.checkpoints),
            "offsets_written": {
                g: {f"{t}-{p}": o for (t, p), o in sorted(tps.items())}
                for g, tps in (report.written if report else {}).items()
            },
            "active_groups_skipped": list(report.active) if report else [],
        }


def run_group_sync(
    spec: MirrorSpec,
    groups: set[str] | None = None,
    *,
    sync_offsets: bool = True,
    dry_run: bool = False,
) -> GroupSyncRun:
    """Checkpoint the flow's groups (or ``groups``) now and, with ``sync_offsets``, commit the
    results into the target's idle groups: what a failover runs after the mirror caught up.
    A dry run only reads: it translates, and tells what it would write and commit."""
    admins = flow_admins(spec)
    for admin in admins.values():
        admin.metadata()  # an unreachable cluster fails here, named
    offset_map = read_offset_map(spec)
    positions = flow_positions(spec)
    tool = GroupCheckpoints(
        spec, admins, offset_map, lambda: positions, producer=False if dry_run else None
    )
    tool.start()
    before, before_ms = dict(tool.latest), dict(tool.latest_written_ms)
    listed = tool.refresh_groups()
    if groups is not None:
        tool.groups = [g for g in listed if g in groups]
    tool.emit(write=not dry_run)
    report = None
    if sync_offsets:  # the groups the flow checkpoints now, as MirrorMaker 2's task syncs them
        sync = GroupOffsetSync(spec, admins, tool.snapshot, tool.still_on_source)
        report = sync.run(set(tool.groups or ()), dry_run=dry_run)
    written_ms: Mapping[GroupKey, float]
    if dry_run:
        latest, written_ms = before, before_ms  # nothing was written
    else:
        now_ms = time.time() * 1000
        latest = tool.snapshot()
        written_ms = {
            **before_ms,
            **{(c.group, c.topic, c.partition): now_ms for c in tool.due},
        }
    run = GroupSyncRun(
        spec.flow, spec.target, dry_run, sync_offsets, checkpoints=tool.due, report=report
    )
    for group, offsets in tool.translated.items():
        run.translations[group] = translation_rows(spec, offsets, latest, written_ms)
    return run


def sync_now(
    spec: MirrorSpec, groups: set[str] | None = None, *, sync_offsets: bool = True
) -> tuple[int, GroupSyncReport | None]:
    """Checkpoint the flow's groups (or ``groups``) now and, with ``sync_offsets``, commit the
    results into the target's idle groups (see :func:`run_group_sync`). Returns the number of
    checkpoints written and the sync's report."""
    run = run_group_sync(spec, groups, sync_offsets=sync_offsets)
    return len(run.checkpoints), run.report
