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
import shlex
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mirrorflow.dr import steps
from mirrorflow.dr.clusters import log_bounds, reachable, replicated_groups, replicated_partitions
from mirrorflow.dr.fences import (
    create_acls,
    delete_acls,
    deny_write_bindings,
    fences_file,
    read_fences,
    record_fences,
    write_fences,
)
from mirrorflow.dr.offsets import partition_key
from mirrorflow.dr.records import (
    FAILOVER_MODES,
    failed_back,
    hold_reason,
    is_failover,
    made_changes,
    positions_at_cut,
    run_records,
    run_status,
)
from mirrorflow.dr.rpo import failover_cut_ms, measure_missing, records_behind, rpo_at_cut
from mirrorflow.dr.steps import Log, Partition, StepRecord, StepSkipped, stamp_ms
from mirrorflow.dr.steps import iso as _iso
from mirrorflow.dr.steps import now as _now
from mirrorflow.dr.steps import safe_run_id as safe_run_id  # as it was named here
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin
from mirrorflow.runtime import jobs

MODES = (*FAILOVER_MODES, "rollback", "measure-rpo")
STEPS = (
    "preflight",
    "fence-producers",
    "catch-up",
    "stop-mirror",
    "final-sync",
    "rollback",
    "measure-rpo",
    "report",
)
STOPPED_STATES = ("PAUSED", "STOPPED", "FAILED")
EMERGENCY_SOURCE_PROBE_S = 2.0  # explicit emergency: how long the source is given to answer
STOP_POLL_S = 0.2  # how often stop-mirror reads progress.json
OFFSETS_KEPT = (
    "committed group offsets stay: they point at the copies of what the groups had read on "
    "the source"
)


@dataclass(frozen=True)
class FailoverRequest(steps.GroupsRequest):
    """What a failover run was asked to do (a DAG run's Params, or a command's options).
    ``failover_run_id``: in modes ``rollback`` and ``measure-rpo``, the failover run they act
    on (empty: see :func:`choose_rollback`, :func:`choose_measured`)."""

    mode: str = "planned"  # as the CLI (--mode), the DAG's Param and PARAMS default it
    catch_up_timeout_s: float = 300.0
    stop_timeout_s: float = 30.0
    reachability_timeout_s: float = 15.0
    failover_run_id: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise MirrorflowError(
                f"failover mode {self.mode!r} is not one of {', '.join(MODES)}",
                "choose planned (the source is up), emergency (it is not), auto, rollback (undo "
                "a failover run) or measure-rpo (once the source is back)",
            )
        if self.stop_timeout_s <= 0:
            raise MirrorflowError(
                f"failover stop timeout {self.stop_timeout_s:g}s is not positive",
                "give the seconds stop-mirror waits for the mirror job, e.g. 30",
            )

    PARAMS = {
        **steps.GroupsRequest.PARAMS,
        "mode": ("mode", str, "planned"),
        "catch_up_timeout_s": ("catch_up_timeout_seconds", float, 300),
        "stop_timeout_s": ("stop_timeout_seconds", float, 30),
        "failover_run_id": ("failover_run", str, ""),
    }

    def record(self) -> dict:
        return {
            **super().record(),
            "stop_timeout_s": self.stop_timeout_s,
            "failover_run_id": self.failover_run_id,
        }


def reports_dir() -> Path:
    """Where failover runs keep their record and report: ``$MIRRORFLOW_STATE/reports/failover``."""
    return steps.reports_dir("failover")


def rollback_command(flow: str, flow_files: Sequence[str], run_id: str) -> str:
    """The command (and the DAG's mode) that rolls back failover ``run_id`` of ``flow``."""
    files = " ".join(shlex.quote(str(f)) for f in flow_files)
    return (
        f"mirrorflow failover {files} --flow {shlex.quote(flow)} --mode rollback "
        f"--failover-run {shlex.quote(run_id)} (or the failover DAG with mode rollback and "
        f"failover run {run_id})"
    )


class FailoverRun(steps.Run):
    """A failover's record (``reports/failover/<run id>/run.json``): the request, the mode
    decided, each step's record, the ledger, the cut; later a rollback's mark
    (``rolled_back``) and the RPO measured once the source was back (``measured_rpo``)."""

    KIND = "failover"

    @property
    def mode(self) -> str:
        return self.data.get("mode") or self.data["request"].get("mode") or "auto"

    @classmethod
    def of_record(cls, data: dict) -> FailoverRun:
        """The run of another failover, from its record (to amend it and render its report)."""
        recorded = data.get("request") or {}
        mode = recorded.get("mode")
        request = FailoverRequest(
            flow=data["flow"],
            flow_files=tuple(recorded.get("flow_files") or ()),
            run_id=data["run_id"],
            mode=mode if mode in MODES else "auto",
            dry_run=bool(recorded.get("dry_run")),
        )
        return cls(request)

    def report_context(self) -> dict:
        from mirrorflow.dr.report import report_context

        return report_context(self)

    def report_lines(self, context: dict) -> list[str]:
        return _group_lines(self.details("final-sync").get("targets", {}), self.request.target)


def skip_reason(request: FailoverRequest, run: FailoverRun, step: str) -> str | None:
    """Why ``step`` does not apply to this run (None: it does), from the request's mode and,
    once preflight chose it, the run's: the one rule the steps follow when they skip and the
    DAG follows when it skips their tasks without starting them
    (:meth:`mirrorflow.dr.steps.Workflow.skip_ahead`)."""
    if step in FAILOVER_STEPS and request.mode not in FAILOVER_MODES:
        return f"mode {request.mode}: no failover in this run"
    if step == "fence-producers":
        if run.mode != "planned":
            return "an emergency failover cannot fence producers: the source is away"
        if not request.principals:
            return "no principal to fence"
    if step == "catch-up" and run.mode != "planned":
        return "an emergency failover cannot wait for the source: it is away"
    if step == "rollback" and request.mode != "rollback":
        return f"mode {run.mode}: nothing to roll back"
    if step == "measure-rpo" and request.mode != "measure-rpo":
        return f"mode {run.mode}: the RPO is measured in mode measure-rpo"
    return None


FAILOVER_STEPS = ("preflight", "fence-producers", "catch-up", "stop-mirror", "final-sync")
WORKFLOW = steps.Workflow(FailoverRun, FailoverRequest, STEPS, skip_reason=skip_reason)


def _skip_unless_applies(request: FailoverRequest, run: FailoverRun, step: str) -> None:
    if reason := skip_reason(request, run, step):
        raise StepSkipped(reason)


# -- the failover runs on record ---------------------------------------------------------------


def choose_rollback(
    runs: Sequence[dict],
    flow: str,
    run_id: str,
    held_by: str | None,
    failbacks: Sequence[dict] = (),
) -> dict:
    """The failover run a rollback undoes (its record): ``run_id``'s, else the failover run
    whose hold the flow has (``held_by``, the hold file's reason), else the latest that left
    something to release (fences) and was neither rolled back nor failed back. Refuses, in one
    line, a dry run, a rollback or measurement run, a run already rolled back, and one that
    was failed back (or partly: the failback is then to finish)."""
    failovers = [d for d in runs if d.get("flow") == flow]
    chosen: dict | None
    if run_id:
        matching = [d for d in failovers if run_id in (d["run_id"], safe_run_id(str(d["run_id"])))]
        if not matching:
            raise MirrorflowError(
                f"no failover run {run_id} of {flow} to roll back in {reports_dir()}",
                "name a failover run of the flow (its run id, as in its report's folder)",
            )
        chosen = matching[-1]
    else:
        holder = next(
            (d for d in reversed(failovers) if held_by == hold_reason(str(d["run_id"]))), None
        )
        undoable = [
            d
            for d in failovers
            if is_failover(d)
            and not d.get("rolled_back")
            and any(c["kind"] == "fence-acl" for c in made_changes(d))
            and failed_back(d, failbacks) is None
        ]
        chosen = holder or (undoable[-1] if undoable else None)
        if chosen is None:
            if held_by is None:
                why = "it is not held"
            elif held_by.startswith("failover "):
                why = f"its hold names {held_by!r}, whose record is not in {reports_dir()}"
            else:
                why = f"its hold is not a failover's ({held_by!r})"
            raise MirrorflowError(
                f"no failover of {flow} to roll back: {why}, and no failover run of it left "
                "fences in place",
                "name the run with --failover-run (the failover DAG's Param failover_run)",
            )
    name = chosen["run_id"]
    if not is_failover(chosen):
        raise MirrorflowError(
            f"run {name} of {flow} is a {chosen['request'].get('mode')} run, not a failover",
            "name a failover run",
        )
    if (chosen.get("request") or {}).get("dry_run"):
        raise MirrorflowError(
            f"failover {name} of {flow} was a dry run: it changed nothing to roll back",
            "name the failover run that held the flow",
        )
    if chosen.get("rolled_back"):
        raise MirrorflowError(
            f"failover {name} of {flow} was rolled back already, by run "
            f"{chosen['rolled_back'].get('by')}",
            "nothing of it is left to release",
        )
    back = failed_back(chosen, failbacks)
    if back is not None:
        raise MirrorflowError(
            f"failover {name} of {flow} "
            + (
                f"succeeded and was failed back by run {back[0]}"
                if back[1] == "success"
                else f"is being failed back: failback {back[0]} {back[1]}"
            ),
            "nothing of it is left to roll back"
            if back[1] == "success"
            else "finish the failback (trigger it again); a rollback would resume the flow "
            "without it",
        )
    return chosen


def choose_measured(runs: Sequence[dict], flow: str, run_id: str) -> dict:
    """The failover run whose RPO a measurement measures: ``run_id``'s, else the latest that
    recorded where it left the flow (``positions_at_cut``; not a dry run), one not rolled back
    (e.g. a drill's) if there is one."""
    candidates = [
        d
        for d in runs
        if d.get("flow") == flow
        and is_failover(d)
        and not (d.get("request") or {}).get("dry_run")
        and positions_at_cut(d) is not None
        and (not run_id or run_id in (d["run_id"], safe_run_id(str(d["run_id"]))))
    ]
    if not candidates:
        raise MirrorflowError(
            f"no failover of {flow}"
            + (f" with run id {run_id}" if run_id else "")
            + f" recorded where it left the flow, in {reports_dir()}",
            "measure the RPO of a failover that got past its final-sync (not a dry run)",
        )
    standing = [d for d in candidates if not d.get("rolled_back")]
    return (standing or candidates)[-1]


# -- the steps ---------------------------------------------------------------------------------


@WORKFLOW.step("preflight")
def preflight(request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log) -> None:
    """Reachability of both clusters (at once), the mode, the replicated topics and the
    groups. Explicit emergency: the source gets 2 s, and its absence never fails the run."""
    _skip_unless_applies(request, run, "preflight")
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
    _skip_unless_applies(request, run, "fence-producers")
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
    """Planned: wait until the flow's positions reach the source's end offsets."""
    _skip_unless_applies(request, run, "catch-up")
    spec = request.spec()
    source = ClusterAdmin(spec.source, spec.source_admin)
    started = time.monotonic()
    deadline = started + request.catch_up_timeout_s
    last_said = 0.0
    while True:
        partitions = list(replicated_partitions(spec, source))
        bounds = log_bounds(source, partitions)
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
    _skip_unless_applies(request, run, "stop-mirror")
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
    _skip_unless_applies(request, run, "final-sync")
    spec = request.spec()
    groups = set(run.details("preflight").get("groups", []))
    dry = request.dry_run
    details: dict = {"dry_run": dry}
    if run.mode == "planned":
        details["topic_sync"] = _topic_syncs(spec, run, dry, log)
        sync = _planned_group_sync(spec, run, groups, dry, log)
    else:
        sync = _emergency_group_sync(spec, run, groups, dry, log)
    details.update(sync)
    cut = failover_cut_ms(run.data) or math.floor(time.time() * 1000)
    details["rpo"] = rpo = rpo_at_cut(spec, run.mode, request.flow_dir(), cut)
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


def _topic_syncs(spec: MirrorSpec, run: FailoverRun, dry_run: bool, log: Log) -> list[dict]:
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


def _previous_offsets(
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


def _record_commits(
    run: FailoverRun,
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
            + ("" if previous is None else f" (before: {_offsets_text(previous)})"),
            undo={"cluster": spec.target, "group": group, "previous": previous},
        )


def _offsets_text(offsets: dict[str, int]) -> str:
    return ", ".join(f"{tp}@{o}" for tp, o in offsets.items()) or "none committed"


def _planned_group_sync(
    spec: MirrorSpec, run: FailoverRun, groups: set[str], dry_run: bool, log: Log
) -> dict:
    from mirrorflow.replication.group_offset_sync import run_group_sync

    if not groups:
        return {"committed": {}, "active": [], "targets": {}, "checkpoints_written": 0}
    before = {}
    if not dry_run:
        source = ClusterAdmin(spec.source, spec.source_admin)
        remote = [(spec.remote_topic(t), p) for t, p in replicated_partitions(spec, source)]
        before = _previous_offsets(spec, dict.fromkeys(sorted(groups), remote))
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
    committed = _committed(report.written if report else {})
    _record_commits(run, spec, committed, before, dry_run)
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


def _emergency_group_sync(
    spec: MirrorSpec, run: FailoverRun, groups: set[str], dry_run: bool, log: Log
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
        before = {} if dry_run else _previous_offsets(spec, {group: partitions})
        report = sync.run({group}, dry_run=dry_run)
        done = _committed(report.written)
        _record_commits(run, spec, done, before, dry_run)
        committed.update(done)
        active += report.active
    return {
        "committed": committed,
        "active": active,
        "targets": targets,
        "without_checkpoints": missing,
        "checkpoints_written": 0,
    }


def _committed(written: dict[str, dict[Partition, int]]) -> dict[str, dict[str, int]]:
    return {
        g: {partition_key(tp): o for tp, o in sorted(tps.items())} for g, tps in written.items()
    }


def _group_lines(targets: dict[str, list[dict]], target: str) -> list[str]:
    lines = []
    for group, rows in targets.items():
        where = ", ".join(
            f"{r['topic']}-{r['partition']}@{'-' if r['offset'] is None else r['offset']}"
            for r in rows
        )
        lines.append(f"group {group}: read on {target} from {where or 'nothing yet'}")
    return lines


# -- the RPO -------------------------------------------------------------------------------------


def record_measured(failover: dict, measured: dict, by: str) -> Path:
    """Amend failover run ``failover``'s record with its measured RPO and render its report
    again; the report's path."""
    target = FailoverRun.of_record(failover)
    target.data["measured_rpo"] = {**measured, "by": by}
    target.save()
    return Path(steps.write_report(target)["markdown"])


def measure_and_record(
    spec: MirrorSpec, failover: dict, run: steps.Run, dry_run: bool, log: Log
) -> dict:
    """Measure failover ``failover``'s RPO (:func:`mirrorflow.dr.rpo.measure_missing`) and,
    unless ``dry_run``, amend its record and report (in ``run``'s ledger). The figures."""
    measured = measure_missing(spec, failover)
    log(measured["summary"])
    if not dry_run:
        report = record_measured(failover, measured, run.data["run_id"])
        run.change(
            "record-amended",
            f"failover {failover['run_id']}'s record and report got the measured RPO ({report})",
        )
    return measured


# -- rollback ----------------------------------------------------------------------------------


def release_hold(
    flow: str, flow_dir: Path, hold: dict, run: steps.Run, dry_run: bool
) -> tuple[list[str], list[str]]:
    """Release a failover's hold (its ledger entry ``hold``) when the flow still has it: the
    hold file, and the paused file if that failover created it; each in ``run``'s ledger.
    What was released and what was left, as lines."""
    undo = hold.get("undo") or {}
    reason = undo.get("reason")
    now = jobs.held(flow_dir)
    if now is None or now != reason:
        why = "it is not held" if now is None else f"its hold is another's ({now!r})"
        return [], [f"the hold of {flow}: {why}"]
    would = "would release" if dry_run else "released"
    released = []
    replaced = undo.get("replaced")
    if replaced:  # it had replaced another run's hold: that one is back
        if not dry_run:
            jobs.hold(flow_dir, replaced)
        run.change(
            "hold-released",
            f"{'would put' if dry_run else 'put'} back the hold it had replaced on {flow} "
            f"({flow_dir / jobs.HOLD_FILE}: reason {replaced!r}, was {reason!r})",
            undo={"flow_dir": str(flow_dir), "reason": reason},
        )
        return [f"the hold of {flow} (the hold it replaced, {replaced!r}, is back)"], []
    if not dry_run:
        jobs.release(flow_dir)
    run.change(
        "hold-released",
        f"{would} {flow}'s hold ({flow_dir / jobs.HOLD_FILE}, reason {reason!r})",
        undo={"flow_dir": str(flow_dir), "reason": reason},
    )
    released.append(f"the hold of {flow}")
    if not undo.get("paused_created"):
        return released, [f"{flow}'s paused file: it was there before that failover"]
    if not dry_run:
        jobs.set_paused(flow_dir, False)
    run.change(
        "unpaused",
        f"{'would remove' if dry_run else 'removed'} {flow}'s paused file "
        f"({flow_dir / jobs.PAUSED_FILE}): its mirror job resumes it from its positions",
        undo={"flow_dir": str(flow_dir)},
    )
    released.append(f"the paused file of {flow}")
    return released, []


def release_failover(
    chosen: dict,
    run: steps.Run,
    flow_dir: Path,
    spec: Callable[[], MirrorSpec],
    dry_run: bool,
    log: Log,
) -> tuple[list[str], list[str]]:
    """Release exactly what failover run ``chosen`` (its record) holds still: its hold and
    paused files if it created them and the flow still has its hold, the fence ACLs it created
    (unless another run's fence is the same ACL) and its entries in ``fences.json``; each in
    ``run``'s ledger as done. Then (not in a dry run) mark its record rolled back by ``run`` and
    render its report again. ``spec``: the flow's spec, asked for only when ACLs go. What was
    released and what was left alone, as lines."""
    flow, name = chosen["flow"], chosen["run_id"]
    changes = made_changes(chosen)
    released: list[str] = []
    kept: list[str] = []
    for hold in [c for c in changes if c["kind"] == "hold"][-1:]:
        done, left = release_hold(flow, flow_dir, hold, run, dry_run)
        released += done
        kept += left
    fences = read_fences(flow)
    mine = {
        (c["undo"]["principal"], c["undo"]["topic"]) for c in changes if c["kind"] == "fence-acl"
    }
    mine |= {(f["principal"], f["topic"]) for f in fences if f.get("run_id") == name}
    others = {(f["principal"], f["topic"]) for f in fences if f.get("run_id") != name}
    kept += [
        f"DENY WRITE on {t} for {p}: another failover's fence too" for p, t in sorted(mine & others)
    ]
    remove = sorted(mine - others)
    if remove:
        flow_spec = None if dry_run else spec()
        source = jobs.split_flow(flow)[0]

        def deleted(acl: tuple[str, str]) -> None:
            run.change(
                "fence-removed",
                f"{'would remove' if dry_run else 'removed'} DENY WRITE on topic {acl[1]} of "
                f"{source} for {acl[0]}",
                undo={"cluster": source, "principal": acl[0], "topic": acl[1]},
            )
            released.append(f"DENY WRITE on {acl[1]} for {acl[0]}")

        if flow_spec is None:
            for acl in remove:
                deleted(acl)
        else:
            admin = ClusterAdmin(flow_spec.source, flow_spec.source_admin)
            delete_acls(admin, remove, deleted)
    if any(f.get("run_id") == name for f in fences):
        if not dry_run:
            others_fences = [f for f in fences if f.get("run_id") != name]
            write_fences(flow, others_fences)
        run.change(
            "fences-file",
            f"{'would remove' if dry_run else 'removed'} failover {name}'s entries from "
            f"{fences_file(flow)}",
        )
    for line in released:
        log(f"{'would release' if dry_run else 'released'}: {line}")
    for line in kept:
        log(f"left alone: {line}")
    if not dry_run:
        by = run.data["run_id"]
        target = FailoverRun.of_record(chosen)
        target.data["rolled_back"] = {
            "by": by,
            "kind": run.KIND,
            "at": _now(),
            "released": released,
            "kept": kept,
        }
        target.save()
        report = steps.write_report(target)["markdown"]
        run.change(
            "record-amended",
            f"failover {name}'s record and report marked rolled back by {by} ({report})",
        )
    return released, kept


@WORKFLOW.step("rollback")
def rollback(request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log) -> None:
    """Mode rollback: release exactly what one failover run held (see the module)."""
    _skip_unless_applies(request, run, "rollback")
    flow_dir = request.flow_dir()
    chosen = choose_rollback(
        run_records("failover", request.flow),
        request.flow,
        request.failover_run_id,
        jobs.held(flow_dir),
        run_records("failback", request.flow),
    )
    name, status, dry = chosen["run_id"], run_status(chosen), request.dry_run
    run.data["rolls_back"] = name
    log(f"rolling back failover {name} of {request.flow} ({status})")
    released, kept = release_failover(chosen, run, flow_dir, request.spec, dry, log)
    log(OFFSETS_KEPT)
    record.details = {
        "failover_run_id": name,
        "failover_status": status,
        "released": released,
        "kept": kept,
        "offsets": OFFSETS_KEPT,
    }
    record.summary = (
        f"{'would roll' if dry else 'rolled'} back failover {name} ({status}): "
        + (
            f"{'would release' if dry else 'released'} {'; '.join(released)}"
            if released
            else "nothing to release"
        )
        + (f"; left alone: {'; '.join(kept)}" if kept else "")
        + f"; {OFFSETS_KEPT}"
    )
    log(record.summary)


@WORKFLOW.step("measure-rpo")
def measure_rpo(request: FailoverRequest, run: FailoverRun, record: StepRecord, log: Log) -> None:
    """Mode measure-rpo: a failover's RPO counted on its source, once that is back."""
    _skip_unless_applies(request, run, "measure-rpo")
    chosen = choose_measured(
        run_records("failover", request.flow), request.flow, request.failover_run_id
    )
    spec = request.spec()
    run.data["measures"] = chosen["run_id"]
    measured = measure_and_record(spec, chosen, run, request.dry_run, log)
    record.details = {"failover_run_id": chosen["run_id"], "measured_rpo": measured}
    record.summary = f"failover {chosen['run_id']}: {measured['summary']}"
    log(record.summary)


report = WORKFLOW.report
STEP_FUNCTIONS: dict[str, Callable[..., dict]] = WORKFLOW.functions


def run_all(request: FailoverRequest, log: Log = print) -> FailoverRun:
    """Every step in order, as the failover DAG runs them: a step that does not apply is
    skipped, a failed step ends the run, and the report is written however it ended (the
    ``mirrorflow failover`` command). Returns the run's record."""
    # The workflow returns its run class's record (a FailoverRun), typed as any Run.
    return WORKFLOW.run_all(request, log)  # type: ignore[return-value]
