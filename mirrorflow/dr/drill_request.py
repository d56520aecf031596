"""What a DR drill run is asked to do (:mod:`mirrorflow.dr.drill`): its mode (:data:`MODES`), its
canaries or its destructive traffic's length and rate, its own consumer group (the group prefix
and the run id), each wait's bound, the sandbox it may kill in (:class:`DrillRequest`, from a DAG
run's Params or the command's options, checked), and the emergency failover of its group that a
destructive drill runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mirrorflow.dr import failover, request
from mirrorflow.dr.steps import safe_run_id
from mirrorflow.errors import MirrorflowError

MODES = ("non-destructive", "destructive")


@dataclass(frozen=True)
class DrillRequest(request.DRRequest):
    """What a drill run was asked to do (a DAG run's Params)."""

    mode: str = "non-destructive"
    canaries: int = 100  # non-destructive: canary records
    group_prefix: str = "mirrorflow-drill-"
    dry_run: bool = False
    traffic_seconds: float = 12.0  # destructive: how long the producer writes before the cut
    rate: int = 200  # destructive: records per second
    timeout_s: float = 120.0  # each wait (the flow copying, the group reading)
    sandbox_dir: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise MirrorflowError(
                f"drill mode {self.mode!r} is not one of {', '.join(MODES)}",
                "choose non-destructive (canaries, a shadow group) or destructive (sandbox)",
            )
        if not re.fullmatch(r"[A-Za-z0-9._\-]{1,100}", self.group_prefix):
            raise MirrorflowError(
                f"drill group prefix {self.group_prefix!r} is not a group name prefix",
                "use letters, digits, '.', '_' and '-' (e.g. mirrorflow-drill-)",
            )
        for name, value, low in (
            ("canary count", self.canaries, 2),
            ("traffic seconds", self.traffic_seconds, 2),
            ("rate", self.rate, 1),
        ):
            if value < low:
                raise MirrorflowError(f"drill {name} {value} is below {low}")

    PARAMS = {
        "mode": ("mode", str, "non-destructive"),
        "canaries": ("canaries", int, 100),
        "group_prefix": ("group_prefix", str, "mirrorflow-drill-"),
        "dry_run": ("dry_run", bool, False),
        "traffic_seconds": ("traffic_seconds", float, 12),
        "rate": ("rate", int, 200),
    }

    @property
    def group(self) -> str:
        """The drill's own consumer group (its shadow group, non-destructive)."""
        return self.group_prefix + safe_run_id(self.run_id)

    def record(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "canaries": self.canaries,
            "group": self.group,
            "dry_run": self.dry_run,
            "traffic_seconds": self.traffic_seconds,
            "rate": self.rate,
        }

    def failover_request(self) -> failover.FailoverRequest:
        """The emergency failover of the drill group (destructive), recorded under
        ``reports/failover/drill__<run id>/``: the failover's own steps with its own defaults
        (its stop timeout included), as ``mirrorflow failover --mode emergency`` runs them."""
        return failover.FailoverRequest(
            flow=self.flow,
            flow_files=self.flow_files,
            run_id="drill__" + safe_run_id(self.run_id),
            mode="emergency",
            group_pattern=re.escape(self.group),
            state_dir=self.state_dir,
        )
