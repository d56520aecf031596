"""Failback of one flow ``S->T`` after its failover: the records written on ``T`` during the
failover go back to ``S``, the consumer groups are translated back, and ``S->T`` resumes from the
positions it was held at, so nothing the old primary already has is copied again.

The failback copies the reverse direction itself, so it needs no reverse flow in the flow files,
and writes that copy's end as the positions of ``T->S`` (:mod:`mirrorflow.dr.failback_copy`); the
groups are translated back by :mod:`mirrorflow.dr.failback_groups`.

Provenance mode (same topic names in active/active, ``provenance.header.enabled``) has the
reverse flow: it copies ``T``'s records back itself (``reverse-copy`` and ``set-aside`` are
skipped), the groups resume at the first record of either side they have not read (both flows'
offset maps), and ``S->T`` resumes from its held positions.

Steps (:data:`STEPS`):

``preflight``
    The failover being undone (:func:`latest_failover`: the latest failover of ``S->T`` that
    changed something, not a dry run, not rolled back; its ``positions_at_cut``): one that failed
    is refused in one line naming the rollback (or: run the failover again); both clusters
    answer; ``S->T`` still held; the failover's RPO measured on ``S`` unless it was
    (:func:`mirrorflow.dr.rpo.measure_missing`); the replication policy; what to copy back
    (:func:`mirrorflow.dr.failback_copy.copy_ranges`): per partition of each replicated topic,
    the range of ``T``'s topic written during the failover (default policy: ``T``'s own
    ``orders``, copied to ``T.orders`` on ``S`` as MirrorMaker 2's active/active names it;
    identity: ``orders`` past the forward flow's last copy, copied to ``orders``); with the
    identity policy, the records on ``S`` past the cut (never copied to ``T``,
    :func:`mirrorflow.dr.failback_copy.diverged_ranges`); the consumer groups on ``T`` (the
    flow's ``groups``, narrowed by the run's pattern); no reverse flow running (a job running
    ``T->S`` must be paused first).
``fence-producers``
    With principals: ACL DENY WRITE on ``T``'s copied topics, so nothing more is written there.
``set-aside``
    Identity policy: the records of ``S`` past the cut copied to ``<topic>.diverged.<run id>``
    on ``S`` (:mod:`mirrorflow.dr.failback_copy`).
``reverse-copy``
    Each range found by the preflight copied to ``S``; the positions of ``T->S``
    (:mod:`mirrorflow.dr.failback_copy`).
``group-sync``
    Each group's committed offsets on ``T`` translated back and committed on ``S``
    (:mod:`mirrorflow.dr.failback_groups`).
``unfence``
    Removes exactly the DENY WRITE ACLs the failover created on ``S`` (``fences.json``).
``resume``
    Identity policy: ``S->T``'s positions moved to ``S``'s end after the reverse copy (the
    diverged records are set aside, the copied ones came from ``T``: copying either to ``T``
    would duplicate or loop). Then its hold is released and it is unpaused: it resumes from its
    positions, copying only what is written on ``S`` from now on (default policy: also the
    records written on ``S`` after the cut).
``report``
    The report (``templates/failback_report.*.j2``) with the counts: records written on ``T``
    during the failover, records copied back, records set aside, groups and offsets.

Each change goes in the run's ledger as it is made. A dry run computes and reports everything
and changes nothing. Records and reports live in ``$MIRRORFLOW_STATE/reports/failback/<run id>/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mirrorflow.dr import (
    failback_copy,
    failback_groups,  # noqa: F401  (its step registers here)
)
from mirrorflow.dr.clusters import (
    reachable,
    replicated_groups,
    replicated_partitions,
)
from mirrorflow.dr.failback_run import (  # noqa: F401  (the workflow's names, as callers use them)
    STEPS,
    WORKFLOW,
    FailbackRequest,
    FailbackRun,
    latest_failover,
    report_context,
    spec_and_policy,
)
from mirrorflow.dr.failover_rollback import measure_and_record
from mirrorflow.dr.fences import (
    create_acls,
    delete_acls,
    deny_write_bindings,
    fences_file,
    read_fences,
    write_fences,
)
from mirrorflow.dr.offsets import flat_offsets, nested_offsets, partition_key
from mirrorflow.dr.records import positions_at_cut
from mirrorflow.dr.steps import Log, StepRecord, StepSkipped
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.topics import ClusterAdmin
from mirrorflow.runtime import jobs


def _is_identity(policy) -> bool:
    from mirrorflow.mm2.policy import IdentityReplicationPolicy

    return isinstance(policy, IdentityReplicationPolicy)


# -- the steps ---------------------------------------------------------------------------------


@WORKFLOW.step("preflight")
def preflight(request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log) -> None:
    """The failover undone, both clusters, the policy, the ranges to copy back and set aside."""
    spec, _topology, policy = spec_and_policy(request)
    # The failover first: one that failed is refused before any cluster is asked.
    failover = latest_failover(request.flow, request.failover_run_id, jobs.held(request.flow_dir()))
    for alias, config in ((spec.source, spec.source_admin), (spec.target, spec.target_admin)):
        down = reachable(alias, config, request.reachability_timeout_s)
        if down:
            raise ClusterUnreachable(
                f"a failback of {request.flow} needs {alias}, which is unreachable: {down}",
                f"wait until {alias} is back, then trigger the failback again",
            )
    cut = flat_offsets(positions_at_cut(failover) or {})
    if not jobs.held(request.flow_dir()):
        raise MirrorflowError(
            f"{request.flow} is not held paused: it was resumed after failover "
            f"{failover['run_id']}, so its positions are no longer the cut",
            "a failback resumes a held flow; fail over again first",
        )
    reverse = f"{spec.target}->{spec.source}"
    running = jobs.mirror_processes(request.flows_state_dir(), reverse) or jobs.running_jobs(
        request.flows_state_dir(), reverse
    )
    provenance = spec.provenance  # the reverse flow copies T's records back itself
    if running and not provenance:
        raise MirrorflowError(
            f"the reverse flow {reverse} runs in mirror job(s) {running}: the failback "
            "copies the reverse direction itself",
            f"pause flow__{spec.target}__{spec.source} (or its mirror DAG) and trigger "
            "the failback again; it resumes after the failback's copy",
        )
    identity = _is_identity(policy)
    source = ClusterAdmin(spec.source, spec.source_admin)
    target = ClusterAdmin(spec.target, spec.target_admin)
    # The flow's topics now (positions of topics its filter no longer takes are history),
    # without the heartbeats: the target's own heartbeats are no data to bring back.
    topics = sorted(
        t
        for t in {t for t, _p in replicated_partitions(spec, source)} | {t for t, _ in cut}
        if spec.should_replicate(t) and not policy.is_heartbeats_topic(t)
    )
    copies = failback_copy.copy_ranges(spec, policy, target, [] if provenance else topics, identity)
    diverged: list[dict[str, Any]] = []
    if identity and not provenance:  # provenance: S's later records go to T when S->T resumes
        diverged = failback_copy.diverged_ranges(source, cut, topics, request.run_id)
    groups = replicated_groups(spec, target, request.group_pattern)
    written_on_target = sum(c["end"] - c["start"] for c in copies)
    # The failover's RPO, measured now that its source is back (once: kept in its record).
    measured = failover.get("measured_rpo")
    measure_error = None
    if measured is None:
        try:
            measured = measure_and_record(spec, failover, run, request.dry_run, log)
        except MirrorflowError as exc:  # a figure for the report: the failback goes on
            measure_error = str(exc)
            log(f"the RPO of failover {failover['run_id']} could not be measured: {exc}")
    record.details = {
        "source": spec.source,
        "target": spec.target,
        "failover_run_id": failover["run_id"],
        "policy": type(policy).__name__,
        "identity": identity,
        "provenance": provenance,
        "positions_at_cut": nested_offsets(cut),
        "topics": topics,  # the flow's topics now, heartbeats left out
        "copies": copies,
        "written_on_target": written_on_target,
        "diverged": diverged,
        "diverged_records": sum(d["end"] - d["start"] for d in diverged),
        "groups": groups,
        "failover_measured_rpo": measured,
        "failover_measured_rpo_error": measure_error,
    }
    record.summary = (
        f"failback of {request.flow} (failover {failover['run_id']}, "
        f"{type(policy).__name__}): {written_on_target} record(s) written on {spec.target} "
        f"during the failover to copy back, {len(groups)} group(s)"
        + (
            f", {record.details['diverged_records']} record(s) on {spec.source} past the "
            "cut to set aside"
            if identity
            else ""
        )
        + (" (dry run: nothing will be changed)" if request.dry_run else "")
    )
    log(record.summary)


@WORKFLOW.step("fence-producers")
def fence_producers(
    request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log
) -> None:
    """Deny WRITE on ``T``'s copied topics to the named principals (kept after the failback)."""
    principals = request.principals
    if not principals:
        raise StepSkipped("no principal to fence")
    spec, _t, _p = spec_and_policy(request)
    topics = sorted({c["topic"] for c in run.details("preflight").get("copies", [])})
    bindings = deny_write_bindings([(p, t) for t in topics for p in principals])
    acls = [{"principal": b.principal, "topic": b.name} for b in bindings]
    verb = "would deny" if request.dry_run else "denied"

    def created(binding) -> None:
        run.change(
            "fence-acl",
            f"{verb} WRITE on topic {binding.name} of {spec.target} to {binding.principal} "
            "(kept after the failback)",
            undo=None
            if request.dry_run
            else {"cluster": spec.target, "principal": binding.principal, "topic": binding.name},
        )

    if request.dry_run:
        for binding in bindings:
            created(binding)
    elif bindings:
        create_acls(ClusterAdmin(spec.target, spec.target_admin), bindings, created)
    record.details = {"acls": acls, "applied": not request.dry_run}
    record.summary = (
        f"{verb} WRITE on {len(topics)} topic(s) of {spec.target} to "
        f"{', '.join(principals)} ({len(acls)} ACL(s); kept after the failback)"
    )
    log(record.summary)


@WORKFLOW.step("unfence")
def unfence(request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log) -> None:
    """Remove exactly the DENY WRITE ACLs the failover recorded in ``fences.json``."""
    path = fences_file(request.flow)
    fences = read_fences(request.flow)
    if not fences:
        raise StepSkipped(f"the failover fenced no producer ({path} lists none)")
    spec, _t, _p = spec_and_policy(request)
    acls = sorted({(f["principal"], f["topic"]) for f in fences})
    verb = "would remove" if request.dry_run else "removed"

    def removed(acl: tuple[str, str]) -> None:
        run.change(
            "fence-removed",
            f"{verb} DENY WRITE on topic {acl[1]} of {spec.source} for {acl[0]}",
            undo=None
            if request.dry_run
            else {"cluster": spec.source, "principal": acl[0], "topic": acl[1]},
        )
        log(f"{verb} DENY WRITE on topic {acl[1]} of {spec.source} for {acl[0]}")

    if request.dry_run:
        for acl in acls:
            removed(acl)
    else:
        delete_acls(ClusterAdmin(spec.source, spec.source_admin), acls, removed)
        write_fences(request.flow, [])
        run.change("fences-file", f"emptied {path}: the fences it listed are removed")
    record.details = {
        "acls": [{"principal": p, "topic": t} for p, t in acls],
        "applied": not request.dry_run,
    }
    record.summary = f"{verb} the failover's {len(acls)} DENY WRITE ACL(s) on {spec.source}"
    log(record.summary)


@WORKFLOW.step("resume")
def resume(request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log) -> None:
    """Release ``S->T``'s hold and unpause it (identity: its positions past the copies)."""
    from mirrorflow.replication.positions import PositionWriter
    from mirrorflow.replication.remote_cluster import flow_positions

    spec, _t, _p = spec_and_policy(request)
    pre = run.details("preflight")
    copy = run.details("reverse-copy")
    before = flow_positions(spec)
    moved = flat_offsets(copy.get("resume_positions", {})) if pre.get("identity") else {}
    moved = {tp: o for tp, o in moved.items() if o > before.get(tp, 0)}
    flow_dir = request.flow_dir()
    would = "would " if request.dry_run else ""
    if moved:
        if not request.dry_run:
            writer = PositionWriter(
                spec.target_client, spec.offsets_topic, spec.source, spec.target
            )
            try:
                writer.write(moved)
            finally:
                writer.close()
        run.change(
            "positions",
            f"{would}{'move' if would else 'moved'} {request.flow}'s positions past the "
            "records set aside and copied back: "
            + ", ".join(
                f"{partition_key(tp)} {before.get(tp, 0)}->{o}" for tp, o in sorted(moved.items())
            ),
            undo={"positions": nested_offsets({tp: before.get(tp, 0) for tp in moved})},
        )
    hold = jobs.held(flow_dir)
    if not request.dry_run:
        jobs.release(flow_dir)
    if hold is not None:
        run.change(
            "hold-released",
            f"{would}{'release' if would else 'released'} {request.flow}'s hold "
            f"({flow_dir / jobs.HOLD_FILE}, reason {hold!r})",
            undo={"flow_dir": str(flow_dir), "reason": hold},
        )
    if (flow_dir / jobs.PAUSED_FILE).exists():
        if not request.dry_run:
            jobs.set_paused(flow_dir, False)
        run.change(
            "unpaused",
            f"{would}{'remove' if would else 'removed'} {request.flow}'s paused file: its "
            "mirror job resumes it from its positions",
            undo={"flow_dir": str(flow_dir)},
        )
    verb = "would" if request.dry_run else ""
    for (topic, p), offset in sorted(moved.items()):
        log(
            f"{verb + ' move' if verb else 'moved'} {request.flow}'s position in "
            f"{topic}-{p} from {before.get((topic, p), 0)} to {offset} (past the records "
            "set aside and those copied back)"
        )
    record.details = {
        "positions_before": nested_offsets(before),
        "positions_moved": nested_offsets(moved),
        "released": not request.dry_run,
    }
    record.summary = (
        f"{'would release' if request.dry_run else 'released'} {request.flow}'s hold and "
        f"{'unpause' if request.dry_run else 'unpaused'} it: it resumes from its positions"
        + (f" ({len(moved)} moved past the failback's copies)" if moved else "")
    )
    log(record.summary)


report = WORKFLOW.report
STEP_FUNCTIONS: dict[str, Callable[..., dict]] = WORKFLOW.functions


def run_all(request: FailbackRequest, log: Log = print) -> FailbackRun:
    """Every step in order (``mirrorflow failback``): skipped steps pass, the first failure
    ends the run, the report is written however it ended."""
    # The workflow returns its run class's record (a FailbackRun), typed as any Run.
    return WORKFLOW.run_all(request, log)  # type: ignore[return-value]
