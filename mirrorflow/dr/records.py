"""Reading DR runs' records (``reports/<kind>/<run id>/run.json``) of other runs: which runs of
a flow there are, whether one is a failover, how it ended, what its steps found and what it
changed, where it left the flow, and which failback undid it."""

from __future__ import annotations

import json
from collections.abc import Sequence

from mirrorflow.dr import steps

# The modes of a failover run that fail over (its other modes act on such a run).
FAILOVER_MODES = ("planned", "emergency", "auto")


def hold_reason(run_id: str) -> str:
    """The reason a failover run writes in the flow's hold file (how a rollback knows it)."""
    return f"failover {run_id}"


def run_records(kind: str, flow: str) -> list[dict]:
    """The run records (``run.json``) of ``kind``'s runs of ``flow``, oldest first."""
    folder = steps.reports_dir(kind)
    found = []
    for path in sorted(folder.glob("*/run.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("flow") == flow and data.get("run_id"):
            found.append(data)
    return sorted(found, key=lambda d: str(d.get("started") or ""))


def is_failover(data: dict) -> bool:
    """Whether a failover run record is a failover's (not a rollback's or a measurement's)."""
    return (data.get("request") or {}).get("mode", "auto") in FAILOVER_MODES


def run_status(data: dict) -> str:
    """``success`` or ``failed at <step>``, as the run's report says."""
    failed = [s["step"] for s in data.get("steps", []) if s.get("status") == "failed"]
    return f"failed at {failed[0]}" if failed else "success"


def step_details(data: dict, name: str) -> dict:
    """What step ``name`` of a run record last recorded (empty: it did not run)."""
    found = [s for s in data.get("steps", []) if s.get("step") == name]
    return (found[-1].get("details") or {}) if found else {}


def positions_at_cut(data: dict) -> dict[str, dict[str, int]] | None:
    """Where a failover run left the flow (its final-sync's RPO), None if it did not get there."""
    return (step_details(data, "final-sync").get("rpo") or {}).get("positions_at_cut")


def made_changes(data: dict) -> list[dict]:
    """What a run changed (its ledger, dry-run entries left out). Records written before the
    ledger: the hold and the fences its steps' details name."""
    if "changes" in data:
        return [c for c in data["changes"] if not c.get("dry_run")]
    if (data.get("request") or {}).get("dry_run"):
        return []
    legacy = []
    if step_details(data, "stop-mirror").get("held"):
        reason = hold_reason(data["run_id"])
        legacy.append({"kind": "hold", "undo": {"reason": reason, "paused_created": True}})
    fence = step_details(data, "fence-producers")
    if fence.get("applied"):
        legacy += [
            {"kind": "fence-acl", "undo": {"principal": a["principal"], "topic": a["topic"]}}
            for a in fence.get("acls", [])
        ]
    return legacy


def failed_back(data: dict, failbacks: Sequence[dict]) -> tuple[str, str] | None:
    """The failback (run id, status) that undid failover ``data`` or began to (it changed
    something, not a dry run), None if none did."""
    for back in reversed(failbacks):
        if (back.get("request") or {}).get("dry_run"):
            continue
        if step_details(back, "preflight").get("failover_run_id") != data["run_id"]:
            continue
        if made_changes(back) or run_status(back) == "success":
            return back["run_id"], run_status(back)
    return None
