"""A failover run's report, from its run record: Markdown and HTML rendered from the Jinja2
templates ``templates/failover_report.{md,html}.j2``, and the record itself as JSON, written
beside ``run.json`` in ``$MIRRORFLOW_STATE/reports/failover/<run id>/`` (by
:func:`mirrorflow.dr.steps.write_report`, which every DR workflow's report step uses).

The report holds the timeline of the steps, the mode, the RPO, per group where to read now
(remote topics under the flow's policy, offsets), and what the run changed (ACLs, committed
offsets, the flow's hold, config and ACL sync). It holds no secret: the run record has names,
offsets and the flow files' paths only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mirrorflow.dr.steps import write_report

if TYPE_CHECKING:
    from mirrorflow.dr.failover import FailoverRun

__all__ = ["report_context", "write_report"]


def report_context(run: FailoverRun) -> dict:
    """What the templates show, from the run record."""
    data = run.data
    final = run.details("final-sync")
    preflight = run.details("preflight")
    fence = run.details("fence-producers")
    stop = run.details("stop-mirror")
    dry = bool(data["request"]["dry_run"])
    changes = []
    if fence.get("acls"):
        verb = "applied" if fence.get("applied") else "would apply (dry run)"
        changes += [
            f"{verb}: DENY WRITE on topic {a['topic']} of {preflight.get('source')} "
            f"for {a['principal']}"
            for a in fence["acls"]
        ]
    if stop.get("held"):
        changes.append(f"flow {data['flow']} held paused: the mirror copies nothing more")
    for group, offsets in (final.get("committed") or {}).items():
        verb = "would commit" if dry else "committed"
        where = ", ".join(f"{tp}@{o}" for tp, o in offsets.items())
        changes.append(f"{verb} offsets of group {group} on {preflight.get('target')}: {where}")
    for sync in final.get("topic_sync") or []:
        if sync.get("changes"):
            changes += [
                f"{'would sync' if dry else 'synced'}: {line.strip()}" for line in sync["lines"][1:]
            ]
    return {
        **run.report_header(),
        "mode": data.get("mode") or data["request"]["mode"],
        "preflight": preflight,
        "rpo": final.get("rpo"),
        "targets": final.get("targets") or {},
        "active": final.get("active") or [],
        "without_checkpoints": final.get("without_checkpoints") or [],
        "changes": changes,
    }
