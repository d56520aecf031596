"""Consumer failover of one flow ``S->T``: the runbook's steps, each a function the failover
DAG's tasks (and any other caller) run in order, sharing one run record on disk.

Steps (:data:`STEPS`), for a run of :class:`FailoverRequest`:

``preflight``
    Both clusters' reachability; decides the mode (``auto``: planned when the source answers,
    emergency when not); a planned failover with the source away fails here, saying so. Lists
    the replicated source topics and the consumer groups the run fails over (the flow's
    ``groups`` / ``groups.exclude``, narrowed by the run's group pattern).
``fence-producers``
    Planned, with principals: an ACL DENY WRITE per replicated source topic and principal, so
    nothing more is written on the source after the cut. Each ACL is recorded in
    ``$MIRRORFLOW_STATE/failover/<S>-<T>/fences.json`` (and the report), so a failback removes
    exactly those.
``catch-up``
    Planned: waits (bounded) until the flow's positions (in ``mm2-offsets.<S>.internal`` on the
    target) reach the source's end offsets of every replicated partition; fails naming the
    partitions still behind.
``stop-mirror``
    Holds the flow paused (:func:`mirrorflow.runtime.jobs.hold`: its ``paused`` file, kept even
    if its flow DAG is unpaused) and waits until the running job has ended the flow's batch in
    progress, so nothing is copied after the cut. The translation that follows sees a still
    offset map.
``final-sync``
    Planned: topic configs and ACLs synced (where the flow syncs them), the groups checkpointed
    now with exact translation and their offsets committed into the target's groups (those with
    no members there). Emergency: the latest checkpoints stored on the target are committed.
    Then the RPO: records on the source not copied, per partition. Planned: the source's end
    offsets now minus the positions (0 after a catch-up with fenced producers). Emergency: the
    end offsets the job last observed (``progress.json``'s ``source_end_offsets``) minus the
    positions, a lower bound: what was written after that observation is unknown.
``report``
    Per group, where to read now: the remote topics under the flow's replication policy (e.g.
    ``primary.orders``, never ``orders``) and offsets; the report in Markdown and HTML
    (:mod:`mirrorflow.dr.report`).

A dry run computes and records everything and changes nothing: no ACL, no checkpoint, no commit,
no hold. The run record (``run.json``) and the report live in
``$MIRRORFLOW_STATE/reports/failover/<run id>/``; none of them holds a secret.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from mirrorflow import paths
from mirrorflow.dr import steps
from mirrorflow.dr.steps import Log, Partition, StepRecord, StepSkipped
from mirrorflow.dr.steps import now as _now
from mirrorflow.dr.steps import safe_run_id as safe_run_id  # as it was named here
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.checkpoints import flow_positions
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ADMIN_TIMEOUT_S, ClusterAdmin, cluster_error
from mirrorflow.runtime import jobs

MODES = ("planned", "emergency", "auto")
STEPS = ("preflight", "fence-producers", "catch-up", "stop-mirror", "final-sync", "report")
STOPPED_STATES = ("PAUSED", "STOPPED", "FAILED")


@dataclass(frozen=True)
class FailoverRequest(steps.GroupsRequest):
    """What a failover run was asked to do (a DAG run's Params, or a command's options)."""

    mode: str = "auto"
    catch_up_timeout_s: float = 300.0
    stop_timeout_s: float = 120.0
    reachability_timeout_s: float = 15.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise MirrorflowError(
                f"failover mode {self.mode!r} is not one of {', '.join(MODES)}",
                "choose planned (the source is up), emergency (it is not) or auto",
            )

    PARAMS = {
        **steps.GroupsRequest.PARAMS,
        "mode": ("mode", str, "planned"),
        "catch_up_timeout_s": ("catch_up_timeout_seconds", float, 300),
    }


def reports_dir() -> Path:
    """Where failover runs keep their record and report: ``$MIRRORFLOW_STATE/reports/failover``."""
    return steps.reports_dir("failover")


def fences_file(flow: str) -> Path:
    """The ACLs failovers of ``flow`` created to fence producers (what a failback removes)."""
    source, target = jobs.split_flow(flow)
    return paths.state_dir() / "failover" / f"{source}-{target}" / "fences.json"


class FailoverRun(steps.Run):
    """A failover's record (``reports/failover/<run id>/run.json``): the request, the mode
    decided, each step's record."""

    KIND = "failover"

    @property
    def mode(self) -> str:
        return self.data.get("mode") or self.request.mode  # type: ignore[attr-defined]

    def report_context(self) -> dict:
        from mirrorflow.dr.report import report_context

        return report_context(self)

    def report_lines(self, context: dict) -> list[str]:
        return _group_lines(self.details("final-sync").get("targets", {}), self.request.target)


WORKFLOW = steps.Workflow(FailoverRun, FailoverRequest, STEPS)


def reachable(alias: str, config: dict[str, str], timeout_s: float) -> str | None:
    """None when the cluster answers a metadata request within ``timeout_s``, else why not."""
    admin = ClusterAdmin(alias, config)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.client.list_topics(timeout=min(2.0, timeout_s))
            return None
        except Exception as exc:  # KafkaException: transport, timeout, authentication
            admin.client.poll(0.1)
            if admin.auth_error is not None:
                return f"it refused {admin.principal}: {admin.auth_error.str()}"
            if time.monotonic() > deadline:
                return f"no answer within {timeout_s:.0f}s ({exc})"


def _replicated_partitions(spec: MirrorSpec, admin: ClusterAdmin) -> dict[Partition, None]:
    metadata = admin.metadata()
    chosen = {}
    for name, topic in sorted(metadata.topics.items()):
        if topic.error is None and spec.should_replicate(name):
            for partition in sorted(topic.partitions):
                chosen[(name, partition)] = None
    return chosen


def _groups(spec: MirrorSpec, admin: ClusterAdmin, pattern: str) -> list[str]:
    try:
        listed = admin.client.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result()
    except Exception as exc:
        raise cluster_error(
            admin, "listing consumer groups", exc, "DESCRIBE on the groups"
        ) from None
    return sorted(
        g.group_id
        for g in listed.valid
        if spec.should_replicate_group(g.group_id) and re.fullmatch(pattern, g.group_id)
    )


def _key(tp: Partition) -> str:
    return f"{tp[0]}-{tp[1]}"


# -- the steps ---------------------------------------------------------------------------------


@WORKFLOW.step("preflight")
def preflight(request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log) -> None:
    """Reachability of both clusters, the mode, the replicated topics and the groups."""
    spec = request.spec()
    timeout = request.reachability_timeout_s
    target_down = reachable(spec.target, spec.target_admin, timeout)
    if target_down:
        raise ClusterUnreachable(
            f"the DR cluster {spec.target} is unreachable: {target_down}",
            f"a failover needs {spec.target}; check {spec.target}.bootstrap.servers",
        )
    source_down = reachable(spec.source, spec.source_admin, timeout)
    mode = request.mode
    if mode == "auto":
        mode = "emergency" if source_down else "planned"
    elif mode == "planned" and source_down:
        raise ClusterUnreachable(
            f"a planned failover needs the source {spec.source}, which is unreachable: "
            f"{source_down}",
            "trigger the failover with mode emergency",
        )
    groups: list[str] = []
    topics: list[str] = []
    if source_down is None:
        source = ClusterAdmin(spec.source, spec.source_admin)
        topics = sorted({t for t, _p in _replicated_partitions(spec, source)})
        groups = _groups(spec, source, request.group_pattern)
    if mode == "emergency":  # the groups the target holds checkpoints of
        groups = sorted(set(groups) | set(_checkpointed_groups(spec, request.group_pattern)))
    run.data["mode"] = mode
    record.details = {
        "source": spec.source,
        "target": spec.target,
        "source_reachable": source_down is None,
        "source_error": source_down,
        "mode": mode,
        "topics": topics,
        "remote_topics": {t: spec.remote_topic(t) for t in topics},
        "groups": groups,
    }
    record.summary = (
        f"{mode} failover of {request.flow}: {spec.target} answers, {spec.source} "
        f"{'answers' if source_down is None else 'does not (' + source_down + ')'}; "
        f"{len(topics)} replicated topic(s), {len(groups)} group(s) to fail over"
        + (" (dry run: nothing will be changed)" if request.dry_run else "")
    )
    log(record.summary)


def _checkpointed_groups(spec: MirrorSpec, pattern: str) -> list[str]:
    from mirrorflow.replication.checkpoints import read_checkpoints

    latest = read_checkpoints(spec).latest
    return sorted({g for g, _t, _p in latest if re.fullmatch(pattern, g)})


@WORKFLOW.step("fence-producers")
def fence_producers(
    request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log
) -> None:
    """Planned: deny WRITE on the replicated source topics to the named principals."""
    if run.mode != "planned":
        raise StepSkipped("an emergency failover cannot fence producers: the source is away")
    principals = request.principals
    if not principals:
        raise StepSkipped("no principal to fence")
    spec = request.spec()
    topics = run.details("preflight").get("topics", [])
    source = ClusterAdmin(spec.source, spec.source_admin)
    bindings = deny_write_bindings([(p, t) for t in topics for p in principals])
    acls = [
        {"principal": b.principal, "topic": b.name, "operation": "WRITE", "permission": "DENY"}
        for b in bindings
    ]
    verb = "would deny" if request.dry_run else "denied"
    for acl in acls:
        log(f"{verb} WRITE on topic {acl['topic']} of {spec.source} to {acl['principal']}")
    if bindings and not request.dry_run:
        create_acls(source, bindings)
        _record_fences(request, acls)
    record.details = {"acls": acls, "applied": not request.dry_run}
    record.summary = (
        f"{verb} WRITE on {len(topics)} topic(s) of {spec.source} to "
        f"{', '.join(principals)} ({len(acls)} ACL(s))"
    )
    if not request.dry_run:
        record.summary += f"; recorded in {fences_file(request.flow)} for the failback"
    log(record.summary)


def deny_write_bindings(acls: Sequence[tuple[str, str]], as_filter: bool = False) -> list:
    """ACL bindings denying WRITE, one per ``(principal, topic)`` (a literal topic name), from
    any host (``as_filter``: the filters that match exactly those, to delete them)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    make = AclBindingFilter if as_filter else AclBinding
    return [
        make(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation.WRITE,
            AclPermissionType.DENY,
        )
        for principal, topic in acls
    ]


def create_acls(admin: ClusterAdmin, bindings: list) -> None:
    """Create the DENY WRITE ``bindings`` on ``admin``'s cluster; a refusal fails, naming it."""
    try:
        for future in admin.client.create_acls(bindings, request_timeout=ADMIN_TIMEOUT_S).values():
            future.result()
    except Exception as exc:
        raise cluster_error(
            admin, "creating DENY WRITE ACLs", exc, "ALTER on the cluster"
        ) from None


def _record_fences(request: FailoverRequest, acls: list[dict]) -> None:
    path = fences_file(request.flow)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = []
    stamp = _now()
    known += [{**acl, "run_id": request.run_id, "created": stamp} for acl in acls]
    paths.write_private(path, json.dumps(known, indent=1) + "\n")


def _source_bounds(
    spec: MirrorSpec, admin: ClusterAdmin, partitions: Sequence[Partition]
) -> dict[Partition, tuple[int, int]]:
    """(log start, end) offsets of the source partitions."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    bounds: dict[Partition, list[int]] = {tp: [0, 0] for tp in partitions}
    for which, offset_spec in ((0, OffsetSpec.earliest()), (1, OffsetSpec.latest())):
        if not partitions:
            break
        try:
            futures = admin.client.list_offsets(
                {TopicPartition(t, p): offset_spec for t, p in partitions},
                request_timeout=ADMIN_TIMEOUT_S,
            )
            for tp, future in futures.items():
                bounds[(tp.topic, tp.partition)][which] = future.result().offset
        except Exception as exc:
            raise cluster_error(
                admin, "listing end offsets", exc, "DESCRIBE on the topics"
            ) from None
    return {tp: (b[0], b[1]) for tp, b in bounds.items()}


def _behind(
    bounds: dict[Partition, tuple[int, int]], positions: dict[Partition, int]
) -> dict[Partition, int]:
    """Records per partition the flow has not copied: its end minus its position (from the log
    start when it has none)."""
    behind = {}
    for tp, (start, end) in bounds.items():
        gap = end - max(positions.get(tp, start), start)
        if gap > 0:
            behind[tp] = gap
    return behind


@WORKFLOW.step("catch-up")
def catch_up(
    request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log, poll_s: float = 2.0
) -> None:
    """Planned: wait until the flow's positions reach the source's end offsets."""
    if run.mode != "planned":
        raise StepSkipped("an emergency failover cannot wait for the source: it is away")
    spec = request.spec()
    source = ClusterAdmin(spec.source, spec.source_admin)
    started = time.monotonic()
    deadline = started + request.catch_up_timeout_s
    last_said = 0.0
    while True:
        partitions = list(_replicated_partitions(spec, source))
        bounds = _source_bounds(spec, source, partitions)
        behind = _behind(bounds, flow_positions(spec))
        if not behind:
            break
        now = time.monotonic()
        if now > deadline:
            listed = ", ".join(f"{_key(tp)} ({n})" for tp, n in sorted(behind.items())[:10])
            raise MirrorflowError(
                f"{request.flow} did not catch up within {request.catch_up_timeout_s:.0f}s: "
                f"{sum(behind.values())} record(s) not copied yet, in {listed}",
                "check that the mirror job runs (mirror DAG, progress.json) and that "
                "producers are fenced, then trigger the failover again",
            )
        if now - last_said > 15:
            log(f"waiting for {request.flow}: {sum(behind.values())} record(s) to copy")
            last_said = now
        time.sleep(poll_s)
    waited = time.monotonic() - started
    record.details = {
        "waited_s": round(waited, 1),
        "end_offsets": {_key(tp): end for tp, (_s, end) in sorted(bounds.items())},
    }
    record.summary = (
        f"{request.flow} caught up with {spec.source}'s end offsets of "
        f"{len(bounds)} partition(s) after {waited:.1f}s"
    )
    log(record.summary)


@WORKFLOW.step("stop-mirror")
def stop_mirror(request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log) -> None:
    """Hold the flow paused and wait until its running job has ended the flow's batch."""
    flow_dir = request.flow_dir()
    state_dir = request.flows_state_dir()
    # The drivers that run the flow, however started; else the jobs the DAGs recorded.
    running = jobs.mirror_processes(state_dir, request.flow) or jobs.running_jobs(
        state_dir, request.flow
    )
    before = jobs.read_progress(flow_dir).get("state")
    if request.dry_run:
        record.details = {"held": False, "jobs": running, "state": before}
        record.summary = (
            f"would hold {request.flow} paused ({flow_dir / jobs.HOLD_FILE}); "
            f"{len(running)} running mirror job(s) run it, state {before or 'unknown'}"
        )
        log(record.summary)
        return
    held_at = time.time()
    jobs.hold(flow_dir, f"failover {request.run_id}")
    log(f"{request.flow} held paused ({flow_dir / jobs.HOLD_FILE}): it copies nothing more")
    deadline = time.monotonic() + request.stop_timeout_s
    state = before
    while running:
        progress = jobs.read_progress(flow_dir)
        state = progress.get("state")
        updated = _epoch(progress.get("updated"))
        if state in STOPPED_STATES and (updated >= held_at - 1 or before in STOPPED_STATES):
            break  # stopped now, or was already (paused by its DAG, failed)
        running = [p for p in running if jobs.process_alive(p)]
        if time.monotonic() > deadline:
            raise MirrorflowError(
                f"the mirror job of {request.flow} did not pause it within "
                f"{request.stop_timeout_s:.0f}s (state {state})",
                "stop the site's mirror DAG (pause it) and trigger the failover again",
            )
        time.sleep(0.5)
    record.details = {"held": True, "state": state, "jobs": running}
    record.summary = (
        f"{request.flow} stopped ({state}) in its running mirror job"
        if running
        else f"no running mirror job runs {request.flow}; held paused so none starts it"
    )
    log(record.summary)


def _epoch(stamp: str | None) -> float:
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return 0.0


@WORKFLOW.step("final-sync")
def final_sync(request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log) -> None:
    """Configs and ACLs, checkpoints and group offsets now (planned), or the stored checkpoints
    committed (emergency); then each group's targets and the RPO."""
    spec = request.spec()
    groups = set(run.details("preflight").get("groups", []))
    dry = request.dry_run
    details: dict = {"dry_run": dry}
    if run.mode == "planned":
        details["topic_sync"] = _topic_syncs(spec, dry, log)
        sync = _planned_group_sync(spec, groups, dry, log)
    else:
        sync = _emergency_group_sync(spec, groups, dry, log)
    details.update(sync)
    details["rpo"] = rpo = measure_rpo(spec, run.mode, request)
    for line in _group_lines(details["targets"], spec.target):
        log(line)
    log(rpo["summary"])
    record.details = details
    commits = sum(len(o) for o in details["committed"].values())
    record.summary = (
        f"{'would commit' if dry else 'committed'} {commits} offset(s) of "
        f"{len(details['committed'])} group(s) on {spec.target}"
        + (f", skipped {len(details['active'])} with members there" if details["active"] else "")
        + f"; RPO {rpo['summary_short']}"
    )
    log(record.summary)


def _topic_syncs(spec: MirrorSpec, dry_run: bool, log: Log) -> list[dict]:
    from mirrorflow.replication.sync import run_syncs

    reports = []
    for report in run_syncs(spec, dry_run)[0]:
        for line in report.lines():
            log(line)
        if report.failures:
            raise MirrorflowError(f"{spec.flow}: {report.failures[0]}")
        reports.append({**report.as_dict(), "lines": report.lines()})
    return reports


def _planned_group_sync(spec: MirrorSpec, groups: set[str], dry_run: bool, log: Log) -> dict:
    from mirrorflow.replication.checkpoints import run_group_sync

    if not groups:
        return {"committed": {}, "active": [], "targets": {}, "checkpoints_written": 0}
    result = run_group_sync(spec, groups, sync_offsets=True, dry_run=dry_run)
    for line in result.lines():
        log(line)
    report = result.report
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
        "committed": _committed(report.written if report else {}),
        "active": list(report.active) if report else [],
        "targets": targets,
        "checkpoints_written": len(result.checkpoints),
    }


def _emergency_group_sync(spec: MirrorSpec, groups: set[str], dry_run: bool, log: Log) -> dict:
    from mirrorflow.replication.checkpoints import GroupOffsetSync, read_checkpoints

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
    report = GroupOffsetSync(spec, {spec.target: admin}, lambda: latest).run(
        set(targets), dry_run=dry_run
    )
    return {
        "committed": _committed(report.written),
        "active": list(report.active),
        "targets": targets,
        "without_checkpoints": missing,
        "checkpoints_written": 0,
    }


def _committed(written: dict[str, dict[Partition, int]]) -> dict[str, dict[str, int]]:
    return {g: {_key(tp): o for tp, o in sorted(tps.items())} for g, tps in written.items()}


def _group_lines(targets: dict[str, list[dict]], target: str) -> list[str]:
    lines = []
    for group, rows in targets.items():
        where = ", ".join(
            f"{r['topic']}-{r['partition']}@{'-' if r['offset'] is None else r['offset']}"
            for r in rows
        )
        lines.append(f"group {group}: read on {target} from {where or 'nothing yet'}")
    return lines


def measure_rpo(spec: MirrorSpec, mode: str, request: FailoverRequest) -> dict:
    """Records on the source that the target does not have, per partition (see the module)."""
    positions = flow_positions(spec)
    if mode == "planned":
        source = ClusterAdmin(spec.source, spec.source_admin)
        bounds = _source_bounds(spec, source, list(_replicated_partitions(spec, source)))
        observed_at = _now()
        basis = f"{spec.source}'s end offsets at the cut"
    else:
        progress = jobs.read_progress(request.flow_dir())
        ends = progress.get("source_end_offsets") or {}
        bounds = {
            (topic, int(p)): (0, int(end))
            for topic, parts in ends.items()
            for p, end in parts.items()
        }
        observed_at = progress.get("source_end_offsets_at")
        basis = (
            f"the end offsets the mirror job last observed on {spec.source} ({observed_at})"
            if ends
            else f"nothing: the mirror job recorded no end offsets of {spec.source}"
        )
    behind = _behind(bounds, positions)
    records = sum(behind.values())
    short = f"{records} record(s)" + (" or more" if mode != "planned" else "")
    return {
        "records": records,
        "exact": mode == "planned",
        "basis": basis,
        "observed_at": observed_at,
        "per_partition": {_key(tp): n for tp, n in sorted(behind.items())},
        # Where the flow stopped (the failback resumes from here and sets aside what the
        # source holds beyond it): source partition -> position.
        "positions_at_cut": _nested(positions),
        "summary_short": short,
        "summary": (
            f"RPO: {short} on {spec.source} not on {spec.target}, from {basis} minus the "
            "flow's positions"
            + ("" if mode == "planned" else "; records written after that are not known")
        ),
    }


def _nested(offsets: dict[Partition, int]) -> dict[str, dict[str, int]]:
    """Offsets as JSON: topic -> partition -> offset (as ``progress.json`` keeps them)."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return nested


report = WORKFLOW.report
STEP_FUNCTIONS: dict[str, Callable[..., dict]] = WORKFLOW.functions


def run_all(request: FailoverRequest, log: Log = print) -> FailoverRun:
    """Every step in order, as the failover DAG runs them: a step that does not apply is
    skipped, a failed step ends the run, and the report is written however it ended (the
    ``mirrorflow failover`` command). Returns the run's record."""
    return WORKFLOW.run_all(request, log)  # type: ignore[return-value]
