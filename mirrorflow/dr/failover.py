"""Consumer failover of one flow ``S->T``: the runbook's steps, each a function the failover
DAG's tasks (and any other caller) run in order, sharing one run record on disk.

Steps (:data:`STEPS`), for a run of :class:`FailoverRequest`:

``preflight``
    Both clusters' reachability, probed at once; decides the mode (``auto``: planned when the
    source answers within 15 s, emergency when not; explicit ``emergency`` probes the source
    for 2 s at most and never fails on it); a planned failover with the source away fails here,
    saying so. Lists the replicated source topics and the consumer groups the run fails over
    (the flow's ``groups`` / ``groups.exclude``, narrowed by the run's group pattern).
``fence-producers``
    Planned, with principals: an ACL DENY WRITE per replicated source topic and principal, so
    nothing more is written on the source after the cut. Each ACL is recorded in
    ``$MIRRORFLOW_STATE/failover/<S>-<T>/fences.json`` (and the run's ledger), so a failback or
    a rollback removes exactly those.
``catch-up``
    Planned: waits (bounded) until the flow's positions (in ``mm2-offsets.<S>.internal`` on the
    target) reach the source's end offsets of every replicated partition; fails naming the
    partitions still behind.
``stop-mirror``
    Holds the flow paused (:func:`mirrorflow.runtime.jobs.hold`: its ``paused`` file, kept even
    if its flow DAG is unpaused; the hold is in the ledger at once) and waits (30 s by default,
    polling every 0.2 s) until the running job has written PAUSED in ``progress.json`` since
    the hold, so nothing is copied after the cut. Its end is the cut (``run.json``'s ``cut``).
``final-sync``
    Planned: topic configs and ACLs synced (where the flow syncs them), the groups checkpointed
    now with exact translation and their offsets committed into the target's groups (those with
    no members there). Emergency: the latest checkpoints stored on the target are committed.
    Then the RPO (:func:`mirrorflow.dr.rpo.rpo_at_cut`): records on the source not copied, per
    partition. Planned: the source's end offsets now minus the positions (0 after a catch-up
    with fenced producers). Emergency: at least the end offsets the job last observed minus the
    positions, with bounds on when the oldest of them was written
    (:func:`mirrorflow.dr.rpo.oldest_uncopied_written`).
``rollback`` (mode ``rollback``)
    Releases exactly what one failover run held (:func:`choose_rollback`): its hold and
    ``paused`` file when that run created them, the fence ACLs it created (``fences.json``
    updated), each release in this run's ledger; marks that run's record and report rolled
    back. Committed group offsets stay.
``measure-rpo`` (mode ``measure-rpo``)
    Once the source is back, reads it from the failover's ``positions_at_cut`` to its end and
    counts the records written up to the cut (:func:`mirrorflow.dr.rpo.measure_missing`); the
    failover's record and report get the figures (``measured_rpo``).
``report``
    Per group, where to read now: the remote topics under the flow's replication policy (e.g.
    ``primary.orders``, never ``orders``) and offsets; the ledger; the report in Markdown and
    HTML (:mod:`mirrorflow.dr.report`).

In modes ``rollback`` and ``measure-rpo`` the failover's own steps are skipped; in the failover
modes those two are. A dry run computes and records everything and changes nothing: no ACL, no
checkpoint, no commit, no hold (its ledger lists what it would change). The run record
(``run.json``) and the report live in ``$MIRRORFLOW_STATE/reports/failover/<run id>/``; none of
them holds a secret.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from mirrorflow.dr import failover_groups
from mirrorflow.dr.clusters import log_bounds, reachable, replicated_groups, replicated_partitions
from mirrorflow.dr.failover_rollback import (  # noqa: F401  (the rollback's steps register here)
    choose_measured,
    choose_rollback,
    measure_and_record,
    measure_rpo,
    record_measured,
    release_failover,
    release_hold,
    rollback,
)
from mirrorflow.dr.failover_run import (  # noqa: F401  (the workflow's names, as callers use them)
    EMERGENCY_SOURCE_PROBE_S,
    FAILOVER_STEPS,
    MODES,
    OFFSETS_KEPT,
    STEPS,
    STOP_POLL_S,
    STOPPED_STATES,
    WORKFLOW,
    FailoverRequest,
    FailoverRun,
    reports_dir,
    rollback_command,
    skip_reason,
    skip_unless_applies,
)
from mirrorflow.dr.fences import create_acls, deny_write_bindings, fences_file, record_fences
from mirrorflow.dr.offsets import partition_key
from mirrorflow.dr.records import hold_reason
from mirrorflow.dr.rpo import failover_cut_ms, records_behind, rpo_at_cut
from mirrorflow.dr.steps import Log, Partition, StepRecord, stamp_ms
from mirrorflow.dr.steps import StepSkipped as StepSkipped  # as callers name it
from mirrorflow.dr.steps import iso as _iso
from mirrorflow.dr.steps import safe_run_id as safe_run_id  # as it was named here
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin
from mirrorflow.runtime import jobs


@WORKFLOW.step("preflight")
def preflight(request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log) -> None:
    """Reachability of both clusters (at once), the mode, the replicated topics and the
    groups. Explicit emergency: the source gets 2 s, and its absence never fails the run."""
    skip_unless_applies(request, run, "preflight")
    spec = request.spec()
    timeout = request.reachability_timeout_s
    emergency = request.mode == "emergency"
    source_timeout = min(timeout, EMERGENCY_SOURCE_PROBE_S) if emergency else timeout
    with ThreadPoolExecutor(2, thread_name_prefix="probe") as pool:
        probe_target = pool.submit(reachable, spec.target, spec.target_admin, timeout)
        probe_source = pool.submit(reachable, spec.source, spec.source_admin, source_timeout)
        target_down, source_down = probe_target.result(), probe_source.result()
    if target_down:
        raise ClusterUnreachable(
            f"the DR cluster {spec.target} is unreachable: {target_down}",
            f"a failover needs {spec.target}; check {spec.target}.bootstrap.servers",
        )
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
        try:
            source = ClusterAdmin(spec.source, spec.source_admin)
            topics = sorted({t for t, _p in replicated_partitions(spec, source)})
            groups = replicated_groups(spec, source, request.group_pattern)
        except MirrorflowError as exc:
            if mode != "emergency":
                raise
            source_down = f"it answered, then failed: {exc.message}"
            log(f"{spec.source}: {source_down} (an emergency failover goes on without it)")
    if mode == "emergency":  # the groups the target holds checkpoints of
        groups = sorted(set(groups) | set(_checkpointed_groups(spec, request.group_pattern)))
    run.data["mode"] = mode
    record.details = {
        "source": spec.source,
        "target": spec.target,
        "source_reachable": source_down is None,
        "source_error": source_down,
        "source_probe_s": source_timeout,
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
    from mirrorflow.replication.checkpoint_stores import read_checkpoints

    latest = read_checkpoints(spec).latest
    return sorted({g for g, _t, _p in latest if re.fullmatch(pattern, g)})


@WORKFLOW.step("fence-producers")
def fence_producers(
    request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log
) -> None:
    """Planned: deny WRITE on the replicated source topics to the named principals."""
    skip_unless_applies(request, run, "fence-producers")
    principals = request.principals
    spec = request.spec()
    topics = run.details("preflight").get("topics", [])
    source = ClusterAdmin(spec.source, spec.source_admin)
    bindings = deny_write_bindings([(p, t) for t in topics for p in principals])
    acls = [
        {"principal": b.principal, "topic": b.name, "operation": "WRITE", "permission": "DENY"}
        for b in bindings
    ]
    verb = "would deny" if request.dry_run else "denied"
    if request.dry_run:
        for acl in acls:
            run.change(
                "fence-acl",
                f"would deny WRITE on topic {acl['topic']} of {spec.source} to {acl['principal']}",
            )
    elif bindings:

        def created(acl: dict) -> None:
            record_fences(request.flow, request.run_id, [acl])
            run.change(
                "fence-acl",
                f"denied WRITE on topic {acl['topic']} of {spec.source} to {acl['principal']} "
                f"(recorded in {fences_file(request.flow)})",
                undo={"cluster": spec.source, "principal": acl["principal"], "topic": acl["topic"]},
            )

        create_acls(source, bindings, lambda binding: created(acls[bindings.index(binding)]))
    for acl in acls:
        log(f"{verb} WRITE on topic {acl['topic']} of {spec.source} to {acl['principal']}")
    record.details = {"acls": acls, "applied": not request.dry_run}
    record.summary = (
        f"{verb} WRITE on {len(topics)} topic(s) of {spec.source} to "
        f"{', '.join(principals)} ({len(acls)} ACL(s))"
    )
    if not request.dry_run:
        record.summary += f"; recorded in {fences_file(request.flow)} for the failback"
    log(record.summary)


@WORKFLOW.step("catch-up")
def catch_up(
    request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log, poll_s: float = 2.0
) -> None:
    """Planned: wait until the flow's positions reach the source's end offsets as the step
    found them (a partition's as it first saw it): every record written before the catch-up
    began. With every producer fenced those ends are the last; a writer left unfenced (the
    reverse flow's heartbeats, a principal not named) writes on, and would keep a moving end
    ahead of positions written every lease renewal: what it writes later is in the RPO at the
    cut, as a record written after the cut is."""
    skip_unless_applies(request, run, "catch-up")
    spec = request.spec()
    source = ClusterAdmin(spec.source, spec.source_admin)
    started = time.monotonic()
    deadline = started + request.catch_up_timeout_s
    last_said = 0.0
    bounds: dict[Partition, tuple[int, int]] = {}
    while True:
        new = [tp for tp in replicated_partitions(spec, source) if tp not in bounds]
        if new:
            bounds.update(log_bounds(source, new))
        try:
            positions = flow_positions(spec)
        except ClusterUnreachable as exc:  # its offsets topic just created, a leader moving
            if time.monotonic() > deadline:
                raise
            log(f"{request.flow}'s positions not readable yet ({exc.message}); waiting")
            time.sleep(poll_s)
            continue
        behind = records_behind(bounds, positions)
        if not behind:
            break
        now = time.monotonic()
        if now > deadline:
            listed = ", ".join(
                f"{partition_key(tp)} ({n})" for tp, n in sorted(behind.items())[:10]
            )
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
        "end_offsets": {partition_key(tp): end for tp, (_s, end) in sorted(bounds.items())},
    }
    record.summary = (
        f"{request.flow} caught up with {spec.source}'s end offsets of "
        f"{len(bounds)} partition(s) after {waited:.1f}s"
    )
    log(record.summary)


def written_since(stamp: str | None, epoch_s: float) -> bool:
    """Whether ``progress.json`` written at ``stamp`` (its ``updated``) was written at or after
    ``epoch_s``: to the millisecond for a stamp with a fraction of a second; an older job's
    whole-second stamp (truncated) counts from that second on."""
    moment = stamp_ms(stamp)
    if moment is None:
        return False
    at_ms, precision_ms = moment
    return at_ms >= (math.floor(epoch_s * 1000) // precision_ms) * precision_ms


@WORKFLOW.step("stop-mirror")
def stop_mirror(request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log) -> None:
    """Hold the flow paused (in the ledger at once) and wait until its running job has written
    PAUSED since the hold; the cut is when it did."""
    skip_unless_applies(request, run, "stop-mirror")
    flow_dir = request.flow_dir()
    state_dir = request.flows_state_dir()
    # The drivers that run the flow, however started; else the jobs the DAGs recorded.
    running = jobs.mirror_processes(state_dir, request.flow) or jobs.running_jobs(
        state_dir, request.flow
    )
    before = jobs.read_progress(flow_dir).get("state")
    hold_file = flow_dir / jobs.HOLD_FILE
    if request.dry_run:
        run.change("hold", f"would hold {request.flow} paused ({hold_file})")
        cut = time.time()
        run.data["cut"] = {"at": _iso(cut), "epoch_ms": math.floor(cut * 1000)}
        record.details = {"held": False, "jobs": running, "state": before, "cut": _iso(cut)}
        record.summary = (
            f"would hold {request.flow} paused ({hold_file}); "
            f"{len(running)} running mirror job(s) run it, state {before or 'unknown'}"
        )
        log(record.summary)
        return
    reason = hold_reason(request.run_id)
    paused_file = flow_dir / jobs.PAUSED_FILE
    paused_before = paused_file.exists()
    held_before = jobs.held(flow_dir)  # another run's hold, replaced (a rollback restores it)
    held_at = time.time()
    jobs.hold(flow_dir, reason)
    run.change(
        "hold",
        f"held {request.flow} paused: {hold_file} (reason {reason!r})"
        + (f", replacing the hold {held_before!r}" if held_before else "")
        + (f"; {paused_file} was there already" if paused_before else f" and {paused_file}"),
        undo={
            "flow_dir": str(flow_dir),
            "reason": reason,
            "paused_created": not paused_before,
            "replaced": held_before,
        },
    )
    log(f"{request.flow} held paused ({hold_file}): it copies nothing more")
    deadline = time.monotonic() + request.stop_timeout_s
    state = before
    while running:
        progress = jobs.read_progress(flow_dir)
        state = progress.get("state")
        if state in STOPPED_STATES and (
            written_since(progress.get("updated"), held_at) or before in STOPPED_STATES
        ):
            break  # stopped now, or was already (paused by its DAG, failed)
        running = [p for p in running if jobs.process_alive(p)]
        if time.monotonic() > deadline:
            raise MirrorflowError(
                f"the mirror job of {request.flow} (driver {', '.join(map(str, running))}) did "
                f"not pause it within {request.stop_timeout_s:g}s (state {state}); the flow "
                "stays held, nothing else was changed after the hold",
                "wait for the job's batch and trigger the failover again (a longer stop "
                "timeout), or stop the site's mirror DAG (pause it) and trigger it again; "
                "to undo this run instead: "
                + rollback_command(request.flow, request.flow_files, request.run_id),
            )
        time.sleep(STOP_POLL_S)
    cut = time.time()
    run.data["cut"] = {"at": _iso(cut), "epoch_ms": math.floor(cut * 1000)}
    record.details = {
        "held": True,
        "state": state,
        "jobs": running,
        "cut": _iso(cut),
        "waited_s": round(cut - held_at, 3),
    }
    record.summary = (
        f"{request.flow} stopped ({state}) in its running mirror job, "
        f"{cut - held_at:.1f}s after the hold"
        if running
        else f"no running mirror job runs {request.flow}; held paused so none starts it"
    )
    log(record.summary)


@WORKFLOW.step("final-sync")
def final_sync(request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log) -> None:
    """Configs and ACLs, checkpoints and group offsets now (planned), or the stored checkpoints
    committed (emergency); then each group's targets and the RPO."""
    skip_unless_applies(request, run, "final-sync")
    spec = request.spec()
    groups = set(run.details("preflight").get("groups", []))
    dry = request.dry_run
    details: dict = {"dry_run": dry}
    if run.mode == "planned":
        details["topic_sync"] = failover_groups.topic_syncs(spec, run, dry, log)
        sync = failover_groups.planned_group_sync(spec, run, groups, dry, log)
    else:
        sync = failover_groups.emergency_group_sync(spec, run, groups, dry, log)
    details.update(sync)
    cut = failover_cut_ms(run.data) or math.floor(time.time() * 1000)
    details["rpo"] = rpo = rpo_at_cut(spec, run.mode, request.flow_dir(), cut)
    for line in failover_groups.group_lines(details["targets"], spec.target):
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


report = WORKFLOW.report
STEP_FUNCTIONS: dict[str, Callable[..., dict]] = WORKFLOW.functions


def run_all(request: FailoverRequest, log: Log = print) -> FailoverRun:
    """Every step in order, as the failover DAG runs them: a step that does not apply is
    skipped, a failed step ends the run, and the report is written however it ended (the
    ``mirrorflow failover`` command). Returns the run's record."""
    # The workflow returns its run class's record (a FailoverRun), typed as any Run.
    return WORKFLOW.run_all(request, log)  # type: ignore[return-value]
