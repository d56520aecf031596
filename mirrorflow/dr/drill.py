"""DR drills of one flow ``S->T``: fail a consumer group over to the DR cluster on purpose,
verify end-to-end message flow there, and measure RPO and RTO, so the runbook is known to work
before it is needed (seed 003). The drill DAG's tasks run :data:`STEPS` in order, sharing a run
record on disk, as the failover's do.

Both modes write only to the drill's own topic, ``mirrorflow-drill-canary`` on the source
(:data:`~mirrorflow.dr.drill_traffic.DRILL_TOPIC`; the flow's ``topics`` must replicate it, else
the drill refuses in one line), and use only their own consumer group (the *group prefix* and
the run id, e.g. ``mirrorflow-drill-manual__2026-…``; the flow's ``groups`` must checkpoint it).
No user topic is written and no real group is moved.

``non-destructive`` (any cluster, production included)
    ``traffic``: N canary records on the source; the drill's *shadow group* reads and commits
    the first half there. The flow copies them (the drill waits, bounded). ``failover``: the
    shadow group checkpointed now (exact translation) and its offsets committed on the target,
    as a planned failover does for real groups, and nothing else. ``verify``: the shadow group
    reads on the target (the remote topic under the flow's policy) from where it was committed:
    it must read the other half, each canary once; every canary must be on the target once.
    The real groups' committed offsets on the target are compared before and after.
``destructive`` (sandbox clusters only)
    ``traffic``: a producer writes continuously (idempotent, ``acks=all``; it knows each record's
    acknowledged offset); the drill group reads and commits on the source during the first half,
    its commit is checkpointed once the flow copied it, then, mid-traffic, the source broker is
    killed (SIGKILL, ``mirrorflow sandbox kill``): the cut. ``failover``: the runbook, the
    failover workflow's own steps in emergency mode (:func:`mirrorflow.dr.failover.run_all`:
    preflight, stop-mirror (the flow held, its running job waited for), final-sync (the last
    checkpoints committed on the target), report), their timings kept for the report.
    ``verify``: the group reads on the target until it has everything the flow copied.
    ``restore``: the broker restarted (``mirrorflow sandbox up``), what that failover holds
    released from its ledger (the flow resumes; the drill waits for it to copy the rest,
    bounded), its RPO measured on the source.

    Destructive drills run only when the flow's source is a **mirrorflow sandbox cluster**: its
    bootstrap servers are a loopback port of a cluster recorded in the sandbox directory
    (``$MIRRORFLOW_SANDBOX``, else ``$MIRRORFLOW_STATE/sandbox``). There is no override: the
    sandbox is the only cluster mirrorflow knows how to crash and restart.

Measured per run (``verify``):

* **RPO**: records acknowledged by the source and not on the target at the cut (the producer's
  acknowledged offsets at or after the flow's positions then). Non-destructive, the cut is the
  shadow group's failover, after the flow copied the canaries (or timed out waiting).
* **RTO**: from the trigger (destructive: the source broker's kill; non-destructive: the start
  of the failover step) to the first record the failed-over group reads on the target.
* Per group: **lost** (records acknowledged before the cut, copied by the flow, after the
  group's committed position on the source, that the group did not read on the target) and
  **repeated** (records it read on both clusters, or twice on the target).

``report``: Markdown and HTML from ``templates/drill_report.{md,html}.j2`` and JSON in
``$MIRRORFLOW_STATE/reports/drill/<run id>/`` (mode 0600), with the timeline, the ledger and
what the drill could not rehearse (:data:`~mirrorflow.dr.drill_report.NOT_REHEARSED`). ``restore``
and ``report`` run however the steps before ended; ``restore`` also deletes the drill group on
both clusters. A dry run checks that the drill can run (``preflight``) and changes nothing.

Here: the workflow and its steps. The request is in :mod:`mirrorflow.dr.drill_request`, the
run's record and report in :mod:`~mirrorflow.dr.drill_report`, the traffic in
:mod:`~mirrorflow.dr.drill_traffic`, the counting in :mod:`~mirrorflow.dr.drill_verify`, the
sandbox a destructive drill kills and restarts in :mod:`~mirrorflow.dr.drill_sandbox`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mirrorflow.dr import failover, steps
from mirrorflow.dr.clusters import reachable
from mirrorflow.dr.drill_report import DrillRun, step_timings
from mirrorflow.dr.drill_request import DrillRequest
from mirrorflow.dr.drill_sandbox import run_sandbox, source_sandbox
from mirrorflow.dr.drill_traffic import (
    DRILL_PARTITIONS,
    DRILL_TOPIC,
    DrillProducer,
    GroupReader,
    commit_group,
    continuous_then_kill,
    delete_group,
    end_offsets,
    ensure_topic,
    send_canaries,
    wait_copied,
)
from mirrorflow.dr.drill_verify import (
    count,
    read_on_target,
    real_group_offsets,
    records_on_target,
    rto,
)
from mirrorflow.dr.offsets import key_partition, partition_key
from mirrorflow.dr.records import positions_at_cut
from mirrorflow.dr.steps import Log, StepRecord, StepSkipped, safe_run_id
from mirrorflow.dr.steps import iso as _iso
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.topics import ClusterAdmin
from mirrorflow.runtime import jobs

STEPS = ("preflight", "traffic", "failover", "verify", "restore", "report")
WORKFLOW = steps.Workflow(DrillRun, DrillRequest, STEPS, always=("restore", "report"))


def _skip_when_dry(request: DrillRequest) -> None:
    if request.dry_run:
        raise StepSkipped("dry run: preflight checked the drill; nothing is written or moved")


# -- preflight -----------------------------------------------------------------------------


@WORKFLOW.step("preflight")
def preflight(request: DrillRequest, run: DrillRun, record: StepRecord, log: Log) -> None:
    """Both clusters answer; the flow replicates the drill topic and checkpoints the drill
    group; destructive: the source is a sandbox cluster. Creates the drill topic (not in a dry
    run) and notes where the target's copy ends and the real groups' offsets there."""
    spec = request.spec()
    steps.refuse_provenance_mode(spec, "a drill")
    for alias, config in ((spec.target, spec.target_admin), (spec.source, spec.source_admin)):
        down = reachable(alias, config, 15.0)
        if down:
            raise ClusterUnreachable(
                f"a drill needs both clusters; {alias} is unreachable: {down}",
                f"check {alias}.bootstrap.servers, or run the failover DAG if it is down",
            )
    if not spec.should_replicate(DRILL_TOPIC):
        raise MirrorflowError(
            f"flow {request.flow} does not replicate the drill topic {DRILL_TOPIC}",
            f"add {DRILL_TOPIC} to {request.flow}.topics and render again",
        )
    if not spec.should_replicate_group(request.group):
        raise MirrorflowError(
            f"flow {request.flow} does not checkpoint the drill group {request.group}",
            f"add {request.group_prefix}.* to {request.flow}.groups and render again",
        )
    if request.mode == "destructive" and spec.emit_checkpoints_enabled is False:
        raise MirrorflowError(
            f"flow {request.flow} emits no checkpoints: nothing to fail a group over with",
            f"set {request.flow}.emit.checkpoints.enabled = true",
        )
    details: dict = {
        "source": spec.source,
        "target": spec.target,
        "topic": DRILL_TOPIC,
        "remote_topic": spec.remote_topic(DRILL_TOPIC),
        "group": request.group,
        "exactly_once": spec.exactly_once,
    }
    if request.mode == "destructive":
        details["sandbox"] = source_sandbox(spec, request.sandbox_dir)
    source = ClusterAdmin(spec.source, spec.source_admin)
    target = ClusterAdmin(spec.target, spec.target_admin)
    details["real_groups_before"] = real_group_offsets(spec, target, spec.target_admin, request)
    details["real_source_groups_before"] = real_group_offsets(
        spec, source, spec.source_admin, request
    )
    if not request.dry_run and ensure_topic(source):
        run.change(
            "topic-created",
            f"created topic {DRILL_TOPIC} on {spec.source} ({DRILL_PARTITIONS} partitions)",
            undo={"cluster": spec.source, "topic": DRILL_TOPIC},
        )
    record.details = details
    record.summary = (
        f"{request.mode} drill of {request.flow}: both clusters answer; topic {DRILL_TOPIC} "
        f"(on {spec.target}: {details['remote_topic']}), group {request.group}"
        + (f", sandbox cluster {details['sandbox']['cluster']}" if "sandbox" in details else "")
        + (" (dry run: nothing will be written or moved)" if request.dry_run else "")
    )
    log(record.summary)


# -- traffic -------------------------------------------------------------------------------


@WORKFLOW.step("traffic", xcom_details=False)
def traffic(request: DrillRequest, run: DrillRun, record: StepRecord, log: Log) -> None:
    """Non-destructive: canaries, half of them read by the shadow group on the source.
    Destructive: continuous writes, the drill group reading the first half, then the kill."""
    _skip_when_dry(request)
    spec = request.spec()
    tag = safe_run_id(request.run_id)
    # The drill group starts at the topic's end: earlier runs' records are not its own.
    source = spec.source, spec.source_admin
    start = end_offsets(*source, DRILL_TOPIC, DRILL_PARTITIONS)
    commit_group(*source, request.group, start)
    run.change(
        "group-offsets",
        f"committed group {request.group} on {spec.source} at {DRILL_TOPIC}'s end: "
        + ", ".join(f"{DRILL_TOPIC}-{p}@{o}" for p, o in sorted(start.items())),
        undo={"cluster": spec.source, "group": request.group},
    )
    producer = DrillProducer(*source, tag)
    reader = GroupReader(*source, request.group, tag, DRILL_TOPIC)
    run.event("traffic started")
    try:
        if request.mode == "non-destructive":
            details = send_canaries(request, spec, run, producer, reader, log)
        else:
            details = continuous_then_kill(request, spec, run, producer, reader, log)
    finally:
        reader.close()
        run.change(
            "records-written",
            f"wrote {producer.sent} record(s) of this run (value {tag}:<n>) to {DRILL_TOPIC} "
            f"on {spec.source}, {len(producer.acked)} acknowledged; group {request.group} read "
            f"and committed {len(reader.read)} of them there",
        )
    details["acked"] = producer.acked
    details["failed_deliveries"] = producer.failed
    details["read_on_source"] = reader.read
    details["source_start"] = {str(p): o for p, o in start.items()}
    record.details = details
    record.summary = (
        f"{producer.sent} record(s) written to {DRILL_TOPIC} on {spec.source}, "
        f"{len(producer.acked)} acknowledged; group {request.group} read "
        f"{len(reader.read)} there"
        + (f"; {spec.source} killed at {_iso(details['cut'])}" if "cut" in details else "")
    )
    log(record.summary)


# -- failover ------------------------------------------------------------------------------


def emergency_failover_request(request: DrillRequest) -> failover.FailoverRequest:
    """The request of a destructive drill's emergency failover, as the drill DAG's tasks of the
    failover's own steps (``emergency-failover.<step>``) run it, right after the kill; they skip
    (:class:`StepSkipped`) in a dry run, a non-destructive drill, and when the traffic step did
    not end (no kill: nothing to fail over)."""
    _skip_when_dry(request)
    if request.mode != "destructive":
        raise StepSkipped("non-destructive: the shadow group alone fails over (task failover)")
    if DrillRun(request).step("traffic").get("status") != "success":
        raise StepSkipped("the traffic step did not end: no broker was killed, nothing fails over")
    return request.failover_request()


@WORKFLOW.step("failover", xcom_details=False)
def failover_step(
    request: DrillRequest,
    run: DrillRun,
    record: StepRecord,
    log: Log,
    failover_tasks: bool = False,
) -> None:
    """Non-destructive: the shadow group checkpointed now and committed on the target, nothing
    else. Destructive: the emergency failover's own steps for the drill group, in order
    (preflight, fence-producers and catch-up skipped, stop-mirror, final-sync, report), with a
    failover record and report of their own: run here (``mirrorflow drill``, as ``mirrorflow
    failover`` runs them) or, with ``failover_tasks`` (the drill DAG), already run by the DAG's
    tasks of those steps, as the failover DAG runs them; either way this step collects what
    they did, and fails when they failed."""
    _skip_when_dry(request)
    if run.step("traffic").get("status") != "success":
        raise MirrorflowError("the traffic step did not end: nothing to fail over")
    spec = request.spec()
    if request.mode == "non-destructive":
        trigger = run.event("failover triggered")
        from mirrorflow.replication.group_offset_sync import run_group_sync

        result = run_group_sync(spec, {request.group}, sync_offsets=True)
        for line in result.lines():
            log(line)
        written = result.report.written if result.report else {}
        committed = {
            g: {partition_key(tp): o for tp, o in tps.items()} for g, tps in written.items()
        }
        if result.checkpoints:
            run.change(
                "checkpoints",
                f"wrote {len(result.checkpoints)} checkpoint(s) of {request.group} to "
                f"{spec.source}.checkpoints.internal on {spec.target}",
            )
        for group, offsets in committed.items():
            run.change(
                "group-offsets",
                f"committed offsets of group {group} on {spec.target}: "
                + ", ".join(f"{tp}@{o}" for tp, o in offsets.items()),
                undo={"cluster": spec.target, "group": group},
            )
        details: dict[str, Any] = {
            "committed": committed,
            "positions_at_cut": {
                partition_key(tp): o
                for tp, o in flow_positions(spec).items()
                if tp[0] == DRILL_TOPIC
            },
        }
    else:
        inner = request.failover_request()
        failed: MirrorflowError | None = None
        if failover_tasks:
            inner_run = failover.FailoverRun(inner)
            started = inner_run.step("preflight").get("started")
            if not started:
                raise MirrorflowError(
                    "the drill's emergency failover did not run (its tasks were not started)",
                    "see the tasks emergency-failover.* of this run",
                )
            at_ms = steps.stamp_ms(started)
            trigger = run.event("failover triggered", at_ms[0] / 1000 if at_ms else None)
            if inner_run.failed_steps():
                failed = MirrorflowError(
                    f"the emergency failover of the drill failed at {inner_run.failed_steps()[0]}",
                    f"its report: {inner_run.directory / 'report.md'}",
                )
        else:
            trigger = run.event("failover triggered")
            try:
                failover.run_all(inner, log=log)
            except MirrorflowError as exc:
                failed = exc
        inner_run = failover.FailoverRun(inner)
        final = inner_run.details("final-sync")
        cut = (final.get("rpo") or {}).get("positions_at_cut") or {}
        details = {
            "committed": final.get("committed") or {},
            "targets": final.get("targets") or {},
            "failover_estimate": (final.get("rpo") or {}).get("summary_short"),
            "failover_run_id": inner.run_id,
            "failover_report": str(inner_run.directory / "report.md"),
            "failover_steps": step_timings(inner_run),
            "held": bool(inner_run.details("stop-mirror").get("held")),
            "positions_at_cut": {
                partition_key((t, int(p))): o
                for t, parts in cut.items()
                for p, o in parts.items()
                if t == DRILL_TOPIC
            },
        }
        if failed is not None:
            details["trigger"] = trigger
            record.details = details
            raise failed
    details["trigger"] = trigger
    record.details = details
    offsets = details["committed"].get(request.group, {})
    record.summary = f"group {request.group} failed over to {spec.target}: " + (
        ", ".join(f"{k}@{v}" for k, v in offsets.items()) or "no offset committed"
    )
    log(record.summary)


# -- verify --------------------------------------------------------------------------------


@WORKFLOW.step("verify")
def verify(request: DrillRequest, run: DrillRun, record: StepRecord, log: Log) -> None:
    """The group reads on the target; RPO, RTO, lost and repeated."""
    _skip_when_dry(request)
    spec = request.spec()
    pre, sent, over = run.details("preflight"), run.details("traffic"), run.details("failover")
    if not sent or not over:
        raise MirrorflowError("the traffic or failover step did not run: nothing to verify")
    remote = pre["remote_topic"]
    tag = safe_run_id(request.run_id)
    # The group reads first, as an application restarted on the target would: what is
    # counted below (nothing moves now: the flow is held or its canaries copied) comes after.
    reader = read_on_target(
        spec.target, spec.target_admin, request.group, tag, remote, request.timeout_s
    )
    acked: dict[str, list[int]] = sent["acked"]
    positions = {key_partition(k)[1]: o for k, o in over["positions_at_cut"].items()}
    if request.mode == "destructive":  # the source is still down: what its last reads
        # before the cut brought (a batch in flight at the kill lands after it)
        positions = {p: o for (t, p), o in flow_positions(spec).items() if t == DRILL_TOPIC}
    read_on_source = set(sent["read_on_source"])
    read = reader.read
    counts = count(acked, positions, read_on_source, read)
    if reader.first_read is not None:
        run.event(f"first record read by {request.group} on {spec.target}", reader.first_read)
        run.change(
            "group-offsets",
            f"group {request.group} read {len(reader.read)} record(s) of this run on "
            f"{spec.target} ({remote}) and committed its reads there",
            undo={"cluster": spec.target, "group": request.group},
        )
    lost, repeated = counts.lost, counts.repeated
    on_target = records_on_target(spec, remote, acked, tag)
    rto_s = rto(reader.first_read, sent.get("cut") or over["trigger"])
    rpo = counts.rpo
    details = {
        "rpo_records": rpo,
        "rto_s": rto_s,
        "rto_basis": "the source broker's kill"
        if request.mode == "destructive"
        else "the start of the failover step",
        "acked": len(acked),
        "copied_at_cut": len(counts.copied),
        "groups": {
            request.group: {
                "read_on_source": len(read_on_source),
                "expected_on_target": len(counts.expected),
                "read_on_target": len(read),
                "lost": len(lost),
                "lost_examples": lost[:10],
                "repeated": repeated,
            }
        },
        "on_target": on_target,
        "replication_latency_s": sent.get("replication_latency_s"),
    }
    if request.mode == "non-destructive":
        target = ClusterAdmin(spec.target, spec.target_admin)
        source = ClusterAdmin(spec.source, spec.source_admin)
        after = real_group_offsets(spec, target, spec.target_admin, request)
        after_source = real_group_offsets(spec, source, spec.source_admin, request)
        details["real_groups_unchanged"] = (
            after == pre["real_groups_before"] and after_source == pre["real_source_groups_before"]
        )
        details["real_groups"] = sorted(after)
    record.details = details
    record.summary = (
        f"RPO {rpo} record(s) (acknowledged by {spec.source}, not on {spec.target} at the "
        f"cut); RTO {'-' if rto_s is None else f'{rto_s:.1f}s'} (from {details['rto_basis']} "
        f"to the first read on {spec.target}); group {request.group}: {len(read)} read on "
        f"{spec.target}, {len(lost)} lost, {repeated} repeated"
    )
    log(record.summary)
    if request.mode == "non-destructive":
        log(
            f"canaries on {spec.target}: {on_target['once']} once, {on_target['missing']} "
            f"missing, {on_target['duplicated']} duplicated; real groups "
            + ("unchanged" if details["real_groups_unchanged"] else "CHANGED")
        )
    problems = []
    if reader.first_read is None:
        problems.append(f"{request.group} read nothing on {spec.target}")
    if lost or repeated:
        problems.append(f"{len(lost)} lost, {repeated} repeated")
    if request.mode == "non-destructive" and not details["real_groups_unchanged"]:
        problems.append("the real groups' offsets changed")
    if problems:
        raise MirrorflowError(
            f"drill of {request.flow} failed its verification: {'; '.join(problems)}",
            "see the report for the timeline and per-group figures",
        )


# -- restore -------------------------------------------------------------------------------


@WORKFLOW.step("restore")
def restore(request: DrillRequest, run: DrillRun, record: StepRecord, log: Log) -> None:
    """Destructive: the broker restarted, the hold released, the flow resumes. Both: the
    drill group deleted on both clusters."""
    _skip_when_dry(request)
    spec = request.spec()
    details: dict = {}
    pre = run.details("preflight")
    if request.mode == "destructive" and pre.get("sandbox"):
        run_sandbox("up", pre["sandbox"])
        run.event(f"{spec.source} broker restarted")
        run.change(
            "broker-restarted",
            f"restarted {spec.source}'s broker (sandbox cluster {pre['sandbox']['cluster']})",
        )
        log(f"{spec.source}'s broker restarted")
        # What the drill's failover holds (its ledger): released, and its record marked so.
        inner = failover.FailoverRun(request.failover_request()).data
        released: list[str] = []
        if inner.get("steps"):
            released, kept = failover.release_failover(
                inner, run, request.flow_dir(), request.spec, False, log
            )
            details["kept"] = kept
        details["released"] = released
        log(f"{request.flow}: {'; '.join(released) or 'nothing'} released, the flow resumes")
        if positions_at_cut(inner) is not None:
            try:  # the source is back: the RPO of the drill's failover, counted there
                details["measured_rpo"] = failover.measure_and_record(spec, inner, run, False, log)
            except MirrorflowError as exc:
                details["measured_rpo_error"] = str(exc)
                log(f"the RPO could not be measured on {spec.source}: {exc}")
        acked = run.details("traffic").get("acked", {})
        state_dir = request.flows_state_dir()
        running = jobs.mirror_processes(state_dir, request.flow) or jobs.running_jobs(
            state_dir, request.flow
        )
        if not running:  # e.g. it gave up during the outage: its DAG's retries restart it
            log(
                f"no mirror job runs {request.flow} now: it resumes when the mirror DAG "
                "starts its job again"
            )
        caught = wait_copied(spec, acked, request.timeout_s) if running else None
        details["mirror_job_running"] = bool(running)
        details["flow_caught_up"] = caught is not None
        if caught is not None:
            run.event(f"the flow copied the rest of the drill's records to {spec.target}", caught)
        log(
            f"{request.flow} "
            + ("copied the rest after the restore" if caught else "has not caught up yet")
        )
    details["deleted_groups"] = delete_group(spec, request.group)
    for alias in details["deleted_groups"]:
        run.change("group-deleted", f"deleted group {request.group} on {alias}")
    record.details = details
    record.summary = (
        ("broker restarted, flow resumed; " if "released" in details else "")
        + f"group {request.group} deleted on "
        + (", ".join(details["deleted_groups"]) or "no cluster")
    )
    log(record.summary)


# -- report --------------------------------------------------------------------------------


report = WORKFLOW.report
STEP_FUNCTIONS: dict[str, Callable[..., dict]] = WORKFLOW.functions
