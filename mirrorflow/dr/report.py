"""A failover run's report, from its run record: Markdown and HTML rendered from the Jinja2
templates ``templates/failover_report.{md,html}.j2``, and the record itself as JSON, written
beside ``run.json`` in ``$MIRRORFLOW_STATE/reports/failover/<run id>/`` (by
:func:`mirrorflow.dr.steps.write_report`, which every DR workflow's report step uses).

The report holds the timeline of the steps, the mode, the RPO (at the cut, and measured on the
source once it is back), per group where to read now (remote topics under the flow's policy,
offsets), the run's ledger (what it changed: ACLs, the flow's hold, committed offsets, config and
ACL sync…), and, for a rollback, what it released. It holds no secret: the run record has names,
offsets and the flow files' paths only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mirrorflow.dr.steps import write_report

if TYPE_CHECKING:
    from mirrorflow.dr.failover_run import FailoverRun

__all__ = ["report_context", "write_report"]

UNKNOWN_BOUNDS = ("written_after", "written_by", "age_at_least_s", "age_at_most_s")


def report_context(run: FailoverRun) -> dict:
    """What the templates show, from the run record: its header (with the ledger, ``changes``),
    the mode, the RPO at the cut and, once measured, on the source (``measured_rpo``); per
    group where to read now; a rollback run's release (``rollback``), a measurement run's
    figures (``measure``); and, for a failover rolled back since, by which run
    (``rolled_back``)."""
    data = run.data
    final = run.details("final-sync")
    rpo = final.get("rpo")
    if rpo and "partitions" not in rpo:  # a record from before the RPO's bounds
        rpo = {
            **rpo,
            "partitions": [
                {"partition": k, "behind": n, **dict.fromkeys(UNKNOWN_BOUNDS)}
                for k, n in rpo["per_partition"].items()
            ],
            "history": False,
        }
    return {
        **run.report_header(),
        "mode": run.mode,
        "preflight": run.details("preflight"),
        "cut": (data.get("cut") or {}).get("at"),
        "rpo": rpo,
        "measured_rpo": data.get("measured_rpo"),
        "targets": final.get("targets") or {},
        "active": final.get("active") or [],
        "without_checkpoints": final.get("without_checkpoints") or [],
        "acts_on": data.get("rolls_back") or data.get("measures"),
        "rollback": run.details("rollback"),
        "measure": run.details("measure-rpo"),
        "rolled_back": data.get("rolled_back"),
    }
