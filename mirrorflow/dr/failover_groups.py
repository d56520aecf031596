"""The group offsets a failover commits on the target, each commit in the run's ledger as it is
made: planned, the groups checkpointed now with exact translation and their offsets committed
(:func:`planned_group_sync`); emergency, the latest checkpoints stored on the target committed
(:func:`emergency_group_sync`); the flow's config and ACL syncs before them
(:func:`topic_syncs`); and the lines that say where each group reads now (:func:`group_lines`).
"""

from __future__ import annotations

import time

from mirrorflow.dr import steps
from mirrorflow.dr.clusters import replicated_partitions
from mirrorflow.dr.offsets import partition_key
from mirrorflow.dr.steps import Log, Partition
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin


def topic_syncs(spec: MirrorSpec, run: steps.Run, dry_run: bool, log: Log) -> list[dict]:
    """The flow's config and ACL syncs, each change in the ledger as soon as its sync ran."""
    from mirrorflow.replication.config_sync import AclSync, Change, TopicSync

    reports = []
    for enabled, sync, kind in (
        (spec.sync_configs_enabled, TopicSync, "config-sync"),
        (spec.sync_acls_enabled, AclSync, "acl-sync"),
    ):
        if not enabled:
            continue
        report = sync(spec).run(dry_run=dry_run)
        for line in report.lines():
            log(line)
        for change in report.changes:
            done = "would sync" if dry_run else "synced"
            undo = None
            if kind == "config-sync" and isinstance(change, Change) and change.kind == "config":
                undo = {"topic": change.topic, "config": change.name, "before": change.before}
            run.change(kind, f"{done} on {spec.target}: {change.describe()}", undo=undo)
        if report.failures:
            raise MirrorflowError(f"{spec.flow}: {report.failures[0]}")
        reports.append({**report.as_dict(), "lines": report.lines()})
    return reports


def previous_offsets(
    spec: MirrorSpec, groups: dict[str, list[Partition]]
) -> dict[str, dict[str, int]]:
    """The groups' committed offsets on the target before the failover commits (best effort:
    a group whose offsets cannot be read is left out)."""
    from mirrorflow.replication.group_offsets_client import GroupOffsetsClient

    client = GroupOffsetsClient(ClusterAdmin(spec.target, spec.target_admin), spec.target_consumer)
    before: dict[str, dict[str, int]] = {}
    for group, partitions in groups.items():
        try:
            found = client.committed(group, partitions)
        except MirrorflowError:
            continue
        before[group] = {partition_key(tp): o for tp, (o, _m) in sorted(found.items())}
    return before


def record_commits(
    run: steps.Run,
    spec: MirrorSpec,
    committed: dict[str, dict[str, int]],
    before: dict[str, dict[str, int]],
    dry_run: bool,
) -> None:
    for group, offsets in committed.items():
        where = ", ".join(f"{tp}@{o}" for tp, o in offsets.items())
        if dry_run:
            run.change(
                "group-offsets", f"would commit offsets of group {group} on {spec.target}: {where}"
            )
            continue
        previous = before.get(group)
        run.change(
            "group-offsets",
            f"committed offsets of group {group} on {spec.target}: {where}"
            + ("" if previous is None else f" (before: {offsets_text(previous)})"),
            undo={"cluster": spec.target, "group": group, "previous": previous},
        )


def offsets_text(offsets: dict[str, int]) -> str:
    return ", ".join(f"{tp}@{o}" for tp, o in offsets.items()) or "none committed"


def planned_group_sync(
    spec: MirrorSpec, run: steps.Run, groups: set[str], dry_run: bool, log: Log
) -> dict:
    from mirrorflow.replication.group_offset_sync import run_group_sync

    if not groups:
        return {"committed": {}, "active": [], "targets": {}, "checkpoints_written": 0}
    before = {}
    if not dry_run:
        source = ClusterAdmin(spec.source, spec.source_admin)
        remote = [(spec.remote_topic(t), p) for t, p in replicated_partitions(spec, source)]
        before = previous_offsets(spec, dict.fromkeys(sorted(groups), remote))
    try:
        result = run_group_sync(spec, groups, sync_offsets=True, dry_run=dry_run)
    except MirrorflowError as exc:
        if not dry_run:
            run.change(
                "group-offsets",
                f"checkpoints and offsets of groups {', '.join(sorted(groups))} on "
                f"{spec.target} may be partly written: the sync failed ({exc.message})",
                undo={"cluster": spec.target, "previous": before},
            )
        raise
    for line in result.lines():
        log(line)
    report = result.report
    if result.checkpoints:
        run.change(
            "checkpoints",
            f"{'would write' if dry_run else 'wrote'} {len(result.checkpoints)} checkpoint(s) "
            f"of the groups to {spec.source}.checkpoints.internal on {spec.target}",
        )
    committed = committed_offsets(report.written if report else {})
    record_commits(run, spec, committed, before, dry_run)
    targets = {
        group: [
            {
                "source_topic": r.source_topic,
                "partition": r.partition,
                "committed_on_source": r.committed,
                "topic": r.target_topic,
                "offset": r.translated,
                "exactness": r.exactness,
            }
            for r in rows
        ]
        for group, rows in sorted(result.translations.items())
    }
    return {
        "committed": committed,
        "active": list(report.active) if report else [],
        "targets": targets,
        "checkpoints_written": len(result.checkpoints),
    }


def emergency_group_sync(
    spec: MirrorSpec, run: steps.Run, groups: set[str], dry_run: bool, log: Log
) -> dict:
    from mirrorflow.replication.checkpoint_stores import read_checkpoints
    from mirrorflow.replication.group_offset_sync import GroupOffsetSync

    reader = read_checkpoints(spec)
    latest = {k: c for k, c in reader.latest.items() if k[0] in groups}
    now_ms = time.time() * 1000
    targets: dict[str, list[dict]] = {}
    for (group, topic, partition), c in sorted(latest.items()):
        targets.setdefault(group, []).append(
            {
                "source_topic": None,
                "partition": partition,
                "committed_on_source": c.upstream_offset,
                "topic": topic,
                "offset": c.downstream_offset,
                "exactness": "checkpoint",
                "checkpoint_age_s": round(
                    (now_ms - reader.written_ms[(group, topic, partition)]) / 1000, 1
                ),
            }
        )
    missing = sorted(groups - set(targets))
    for group in missing:
        log(
            f"group {group}: no checkpoint on {spec.target}: it starts where its "
            "auto.offset.reset says"
        )
    admin = ClusterAdmin(spec.target, spec.target_admin)
    sync = GroupOffsetSync(spec, {spec.target: admin}, lambda: latest)
    committed: dict[str, dict[str, int]] = {}
    active: list[str] = []
    for group in sorted(targets):  # one group at a time: each commit in the ledger as made
        partitions = [(r["topic"], r["partition"]) for r in targets[group]]
        before = {} if dry_run else previous_offsets(spec, {group: partitions})
        report = sync.run({group}, dry_run=dry_run)
        done = committed_offsets(report.written)
        record_commits(run, spec, done, before, dry_run)
        committed.update(done)
        active += report.active
    return {
        "committed": committed,
        "active": active,
        "targets": targets,
        "without_checkpoints": missing,
        "checkpoints_written": 0,
    }


def committed_offsets(written: dict[str, dict[Partition, int]]) -> dict[str, dict[str, int]]:
    return {
        g: {partition_key(tp): o for tp, o in sorted(tps.items())} for g, tps in written.items()
    }


def group_lines(targets: dict[str, list[dict]], target: str) -> list[str]:
    lines = []
    for group, rows in targets.items():
        where = ", ".join(
            f"{r['topic']}-{r['partition']}@{'-' if r['offset'] is None else r['offset']}"
            for r in rows
        )
        lines.append(f"group {group}: read on {target} from {where or 'nothing yet'}")
    return lines
