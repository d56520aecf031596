"""Health alerts of a running mirror job, raised by its own Airflow task.

The mirror DAG's task (:class:`mirrorflow.airflow.operators.MirrorFlowOperator`) already watches
its job; every ``pause_check_interval`` it also derives each flow's health
(:func:`mirrorflow.health.status.flow_health`, as the UI page does). When a flow moves into
STALLED, LAGGING or FAILED, the task logs one line at ERROR (``mirrorflow alert: …``) and calls
the operator's ``on_alert(context, alert)`` if one is given (the user's email, Slack or pager
call); when it is back to RUNNING, the same with ``alert["state"] == "RUNNING"`` and
``alert["recovered"]``. A STALLED flow (its job hangs: no progress report, or no heartbeat
acknowledged, within ``health.stall.timeout.seconds``) also fails the task if
``fail_on_stall`` (the default): the job is stopped and the task fails with the alert's reason,
so Airflow's own failure path applies (``on_failure_callback``, ``email_on_failure``, and the
retries, which start the job again).

Airflow's Deadline Alerts do not fit here: a deadline is computed once per DAG run, from its
queued or logical time, and a mirror run is meant to run for ever; a stall can come at any time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mirrorflow.config.topology import load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.health.model import FAILED, LAGGING, RUNNING, STALLED
from mirrorflow.health.status import flow_health

ALERT_STATES = (STALLED, LAGGING, FAILED)
OnAlert = Callable[[Any, dict[str, Any]], None]


class HealthAlerts:
    """Each flow's health, checked on demand; alerts on transitions (see the module)."""

    def __init__(
        self,
        flows: Sequence[str],
        flow_files: Sequence[Path],
        state_dir: Path,
        *,
        log: Any,
        on_alert: OnAlert | None = None,
        context: Any = None,
        dag_id: str | None = None,
    ) -> None:
        self.state_dir, self.log, self.on_alert = state_dir, log, on_alert
        self.context, self.dag_id = context, dag_id
        self.states: dict[str, str] = {}
        try:
            topology = load_topology([str(p) for p in flow_files])
            self.flows = [topology.flow(name) for name in flows]
        except MirrorflowError as exc:  # the job itself will say what is wrong
            log.warning("no health alerts for %s: %s", ", ".join(flows), exc)
            self.flows = []

    def check(self, now: float | None = None) -> dict[str, Any] | None:
        """Derive each flow's health and alert on changes; the alert of a flow that is
        STALLED now (None if none is)."""
        now = time.time() if now is None else now
        stalled = None
        for flow in self.flows:
            health = flow_health(flow, self.state_dir, now=now)
            previous = self.states.get(flow.name)
            self.states[flow.name] = health.state
            alert = {
                "flow": flow.name,
                "state": health.state,
                "previous": previous,
                "reason": health.reason,
                "lag_records": health.lag_records,
                "lag_seconds": health.lag_seconds,
                "dag_id": self.dag_id,
                "at": now,
                "recovered": False,
            }
            if health.state == STALLED:
                stalled = stalled or alert
            if health.state == previous:
                continue
            if health.state in ALERT_STATES:
                self.log.error(
                    "mirrorflow alert: flow %s is %s: %s", flow.name, health.state, health.reason
                )
                self._call(alert)
            elif previous in ALERT_STATES and health.state == RUNNING:
                self.log.info("mirrorflow: flow %s is RUNNING again (was %s)", flow.name, previous)
                self._call({**alert, "recovered": True})
        return stalled

    def _call(self, alert: dict[str, Any]) -> None:
        if self.on_alert is None:
            return
        try:
            self.on_alert(self.context, alert)
        except Exception as exc:  # the user's callback must not stop the watch
            self.log.error("the on_alert callback failed for flow %s: %s", alert["flow"], exc)
