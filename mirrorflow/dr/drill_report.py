"""A DR drill run's record and report (:mod:`mirrorflow.dr.drill`): the record
(:class:`DrillRun`, ``run.json`` in ``$MIRRORFLOW_STATE/reports/drill/<run id>/``, with the run's
timeline), and what its report shows (:func:`report_context`, rendered from
``templates/drill_report.{md,html}.j2``): the timeline, the figures, the ledger, what the drill
could not rehearse (:data:`NOT_REHEARSED`) and, destructive, the failover's own steps with their
seconds and its ledger."""

from __future__ import annotations

from pathlib import Path

from mirrorflow.dr import failover, steps
from mirrorflow.dr.drill_request import DrillRequest


def reports_dir() -> Path:
    """Where drill runs keep their record and report: ``$MIRRORFLOW_STATE/reports/drill``."""
    return steps.reports_dir("drill")


class DrillRun(steps.Run):
    """A drill run's record, ``run.json`` in its report directory (as a failover's), with the
    run's timeline (:meth:`~mirrorflow.dr.steps.Run.event`)."""

    KIND = "drill"
    request: DrillRequest  # a drill's own (Run holds any workflow's request)

    def new_record(self) -> dict:
        return {**super().new_record(), "timeline": []}

    def report_context(self) -> dict:
        return report_context(self)

    def report_lines(self, context: dict) -> list[str]:
        figures = context["figures"]
        if not figures:
            return []
        return [
            f"drill figures: RPO {figures['rpo_records']} record(s), RTO "
            f"{figures['rto_s']}s, per group "
            + ", ".join(
                f"{g}: {r['lost']} lost, {r['repeated']} repeated"
                for g, r in figures["groups"].items()
            )
        ]


def step_timings(run: steps.Run) -> list[dict]:
    """A run's steps as its report lists them: step, status, seconds, what happened."""
    return [
        {k: s[k] for k in ("step", "status", "seconds", "summary")}
        for s in run.report_header(step_details=False)["steps"]
    ]


NOT_REHEARSED = {
    "non-destructive": [
        "the source's loss: it stays up, and the shadow group is checkpointed now with exact "
        "translation (a planned failover's way), not from the checkpoints stored on the target",
        "stop-mirror: the flow is not held, the mirror job keeps copying",
        "fencing producers",
        "moving real consumer groups: the shadow group alone moves (the real groups' offsets "
        "are only compared)",
        "the time people take to notice, decide and trigger the failover",
        "the failback",
    ],
    "destructive": [
        "fencing producers: an emergency failover cannot (the source is away)",
        "moving real consumer groups: the drill group alone moves",
        "the time people take to notice and decide: the failover starts right after the kill",
        "the loss of more than the source's broker (the DR cluster, the network, the machine "
        "running the mirror job and Airflow all stay up), on sandbox clusters only",
        "the failback: the restore restarts the broker and releases the hold; nothing written "
        "on the DR cluster is copied back",
    ],
}


def report_context(run: DrillRun) -> dict:
    """What the templates show, from the run record (without the per-record lists): the
    timeline, the figures, the ledger (``changes``), what the drill could not rehearse, and,
    destructive, the failover's own steps with their seconds and its ledger."""
    data = run.data
    figures = run.details("verify")
    over = run.details("failover")
    restore = run.details("restore")
    mode = data["request"]["mode"]
    failover_changes: list[dict] = []
    measured = restore.get("measured_rpo")
    failover_steps = over.get("failover_steps") or []
    if over.get("failover_run_id"):
        inner_run = failover.FailoverRun(run.request.failover_request())
        inner = inner_run.data
        failover_changes = list(inner.get("changes") or [])
        measured = measured or inner.get("measured_rpo")
        failover_steps = step_timings(inner_run)  # its report step too, wherever it ran
    steps_seconds = [s["seconds"] for s in failover_steps if s["seconds"]]
    return {
        **run.report_header(step_details=False, ended=False),
        "mode": mode,
        "timeline": sorted(
            ({"at": e["at"], "event": e["event"]} for e in data["timeline"]),
            key=lambda e: e["at"],
        ),
        "preflight": {
            k: v for k, v in run.details("preflight").items() if not k.startswith("real_")
        },
        "figures": figures,
        "committed": over.get("committed") or {},
        "failover_report": over.get("failover_report"),
        "failover_steps": failover_steps,
        "failover_seconds": round(sum(steps_seconds), 3) if steps_seconds else None,
        "failover_changes": failover_changes,
        "measured_rpo": measured,
        "not_rehearsed": NOT_REHEARSED[mode],
        "restore": restore,
    }
