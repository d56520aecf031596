"""A failback's request, its run record and report context, its workflow (:data:`WORKFLOW`),
which failover it undoes (:func:`latest_failover`), and the forward flow's spec and policy its
steps read (:func:`spec_and_policy`); the steps are in :mod:`mirrorflow.dr.failback`,
:mod:`mirrorflow.dr.failback_copy` and :mod:`mirrorflow.dr.failback_groups`."""

from __future__ import annotations

from dataclasses import dataclass

from mirrorflow import paths
from mirrorflow.dr import request, steps
from mirrorflow.dr.failover_run import reports_dir, rollback_command
from mirrorflow.dr.records import (
    is_failover,
    made_changes,
    positions_at_cut,
    run_records,
    run_status,
    step_details,
)
from mirrorflow.dr.steps import safe_run_id
from mirrorflow.errors import MirrorflowError

STEPS = (
    "preflight",
    "fence-producers",
    "set-aside",
    "reverse-copy",
    "group-sync",
    "unfence",
    "resume",
    "report",
)
DIVERGED_SUFFIX = "diverged"


@dataclass(frozen=True)
class FailbackRequest(request.GroupsRequest):
    """What a failback run was asked to do (a DAG run's Params, or a command's options).
    ``flow`` is the flow failed over, S->T: the failback goes from T back to S; the groups and
    the producers to fence are those on T."""

    failover_run_id: str = ""  # the failover undone (default: the latest that held the flow)
    reachability_timeout_s: float = 15.0

    mode = "failback"  # as its run record names it

    PARAMS = {**request.GroupsRequest.PARAMS, "failover_run_id": ("failover_run_id", str, "")}


class FailbackRun(steps.Run):
    """A failback's record (``reports/failback/<run id>/run.json``), as a failover's."""

    KIND = "failback"

    def report_context(self) -> dict:
        return report_context(self)


WORKFLOW = steps.Workflow(FailbackRun, FailbackRequest, STEPS)


def spec_and_policy(request: FailbackRequest):
    """The forward flow's spec and its replication policy (the flow files, from the project
    root as the mirror job reads them)."""
    from mirrorflow.config.topology import load_topology

    files = request.flow_paths()
    spec = request.spec()
    topology = load_topology(files, base_dir=paths.project_root())
    return spec, topology, topology.flow(request.flow).policy


def latest_failover(flow: str, run_id: str = "", held_by: str | None = None) -> dict:
    """The run record of the failover a failback undoes: ``run_id``'s, else the latest failover
    of ``flow`` that changed something (not a dry run, not rolled back). Fails in one line, saying
    what to do, when that failover failed (roll it back, or run the failover again), when it was
    rolled back, when none held the flow and measured its cut (``held_by``: the flow's hold, said
    when there is one), or when there is none."""
    runs = [
        d
        for d in run_records("failover", flow)
        if is_failover(d) and not (d.get("request") or {}).get("dry_run")
    ]
    if run_id:
        chosen = [d for d in runs if run_id in (d["run_id"], safe_run_id(str(d["run_id"])))]
    else:
        chosen = [d for d in runs if not d.get("rolled_back") and made_changes(d)]
    latest = chosen[-1] if chosen else None
    if latest is not None:
        name = latest["run_id"]
        if latest.get("rolled_back"):
            raise MirrorflowError(
                f"failover {name} of {flow} was rolled back by run "
                f"{latest['rolled_back'].get('by')}: there is nothing of it to fail back",
                "run the failover again first, or name another with --failover-run",
            )
        if run_status(latest) != "success":
            files = (latest.get("request") or {}).get("flow_files") or ["FILES"]
            raise MirrorflowError(
                f"the {'' if run_id else 'latest '}failover of {flow}, run {name}, "
                f"{run_status(latest)}: a failback undoes a failover that succeeded",
                f"roll it back: {rollback_command(flow, files, name)}; or run the failover "
                "again, then fail back",
            )
        if step_details(latest, "stop-mirror").get("held") and positions_at_cut(latest):
            return latest
    if held_by is not None:
        raise MirrorflowError(
            f"no failover of {flow} succeeded"
            + (f" with run id {run_id}" if run_id else "")
            + f", yet the flow is held ({held_by!r})",
            f"roll back what holds it: mirrorflow failover FILES --flow '{flow}' --mode "
            "rollback (or the failover DAG with mode rollback); or run the failover again",
        )
    raise MirrorflowError(
        f"no failover of {flow} to fail back"
        + (f" with run id {run_id}" if run_id else "")
        + f" in {reports_dir()} (one that held the flow and measured its cut)",
        "run the failover first (failover DAG or `mirrorflow failover`)",
    )


def report_context(run: FailbackRun) -> dict:
    """What the failback templates show, from the run record (the changes: its ledger)."""
    pre = run.details("preflight")
    copy = run.details("reverse-copy")
    aside = run.details("set-aside")
    groups = run.details("group-sync")
    header = run.report_header()
    return {
        **header,
        "kind": "failback",
        "reverse": f"{pre.get('target')}->{pre.get('source')}",
        "preflight": pre,
        "copies": copy.get("copies") or pre.get("copies") or [],
        "written_on_target": copy.get("written_on_target", pre.get("written_on_target", 0)),
        "copied": copy.get("copied", 0),
        "diverged": aside.get("diverged") or pre.get("diverged") or [],
        "diverged_records": pre.get("diverged_records", 0),
        "targets": groups.get("targets") or {},
        "active": groups.get("active") or [],
        "measured_rpo": pre.get("failover_measured_rpo"),
    }
