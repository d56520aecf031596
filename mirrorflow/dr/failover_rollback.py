"""A failover's rollback and its RPO measured once the source is back: the failover workflow's
steps ``rollback`` and ``measure-rpo`` (:data:`mirrorflow.dr.failover_run.WORKFLOW`), which
failover run each acts on (:func:`choose_rollback`, :func:`choose_measured`), and the release of
what one failover run holds (:func:`release_failover`), which a failback uses too."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from mirrorflow.dr import steps
from mirrorflow.dr.failover_run import (
    OFFSETS_KEPT,
    WORKFLOW,
    FailoverRequest,
    FailoverRun,
    reports_dir,
    skip_unless_applies,
)
from mirrorflow.dr.fences import delete_acls, fences_file, read_fences, write_fences
from mirrorflow.dr.records import (
    failed_back,
    hold_reason,
    is_failover,
    made_changes,
    positions_at_cut,
    run_records,
    run_status,
)
from mirrorflow.dr.rpo import measure_missing
from mirrorflow.dr.steps import Log, StepRecord, safe_run_id
from mirrorflow.dr.steps import now as _now
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin
from mirrorflow.runtime import jobs

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
    skip_unless_applies(request, run, "rollback")
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
    skip_unless_applies(request, run, "measure-rpo")
    chosen = choose_measured(
        run_records("failover", request.flow), request.flow, request.failover_run_id
    )
    spec = request.spec()
    run.data["measures"] = chosen["run_id"]
    measured = measure_and_record(spec, chosen, run, request.dry_run, log)
    record.details = {"failover_run_id": chosen["run_id"], "measured_rpo": measured}
    record.summary = f"failover {chosen['run_id']}: {measured['summary']}"
    log(record.summary)
