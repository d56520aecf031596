"""A consumer failover's request, its run record and its workflow (:data:`WORKFLOW`: the steps
in order and the rule by which a step does not apply), shared by the failover's steps
(:mod:`mirrorflow.dr.failover`), its rollback and RPO measurement
(:mod:`mirrorflow.dr.failover_rollback`) and the failback and drill that read failover runs."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mirrorflow.dr import failover_groups, request, steps
from mirrorflow.dr.records import FAILOVER_MODES
from mirrorflow.dr.steps import StepSkipped
from mirrorflow.errors import MirrorflowError

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
class FailoverRequest(request.GroupsRequest):
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
        **request.GroupsRequest.PARAMS,
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
        return failover_groups.group_lines(
            self.details("final-sync").get("targets", {}), self.request.target
        )


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


def skip_unless_applies(request: FailoverRequest, run: FailoverRun, step: str) -> None:
    if reason := skip_reason(request, run, step):
        raise StepSkipped(reason)
