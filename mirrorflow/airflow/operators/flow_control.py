"""The operator of a flow's own DAG (``flow__<source>__<target>``): the flow's control.

``FlowControlOperator`` is the task of a flow's own DAG: a manual run with Params restarts the
flow at a start position (``starting_offsets``: default/earliest/latest/timestamp, with
``starting_timestamp``; ``restart``), inside the running application, and reports the flow's
state and progress.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from mirrorflow.runtime import jobs

STARTING_OFFSETS = ("default", "earliest", "latest", "timestamp")


class FlowControlOperator(BaseOperator):
    """The task of a flow's own DAG: applies a manual run's Params to the flow and reports its
    state and progress (returned, so it lands in XCom).

    The flow runs inside its site's mirror job; pausing this task's DAG pauses the flow there.
    A run with *Restart* (or a start position, for a flow without progress) asks the flow to
    start over at that position: the running application restarts it after its batch, and
    this task waits up to ``wait_timeout`` for that; without a running job the request waits
    for the flow's next start.

    :param flow: the flow (``"SOURCE->TARGET"``)
    :param state_dir: the flows' state directory, as the mirror job's (default
        ``$MIRRORFLOW_STATE/flows``)
    :param wait_timeout: how long to wait for a running job to take a restart request
    """

    ui_color = "#f0f0e0"

    def __init__(
        self,
        *,
        flow: str,
        state_dir: str | None = None,
        wait_timeout: timedelta | float = timedelta(seconds=120),
        **kwargs: Any,
    ) -> None:
        jobs.split_flow(flow)
        super().__init__(**kwargs)
        self.flow, self.state_dir = flow, state_dir
        wait = wait_timeout
        self.wait_timeout = wait.total_seconds() if isinstance(wait, timedelta) else wait

    @property
    def flow_dir(self) -> Path:
        return jobs.JobFiles.for_flow(self.flow, self.state_dir).flow_dir(self.flow)

    def execute(self, context: Any) -> dict[str, Any]:
        params = context.get("params") or {}
        position = start_position(params)
        flow_dir = self.flow_dir
        choice = params.get("starting_offsets") or "default"
        if params.get("restart") or (position is not None and not jobs.has_progress(flow_dir)):
            jobs.request_restart(flow_dir, position)
            self.log.warning(
                "restart: %s starts over from %s, its positions overwritten",
                self.flow,
                choice if position is None else position,
            )
            self._wait_for_restart(flow_dir)
        elif position is not None:
            self.log.warning(
                "flow %s has progress: starting_offsets=%s applies only with restart "
                "(nothing changed)",
                self.flow,
                choice,
            )
        progress = jobs.read_progress(flow_dir)
        self.log.info(
            "flow %s: %s; %s records in %s batches; last update %s%s",
            self.flow,
            progress.get("state", "never run here"),
            progress.get("records", 0),
            progress.get("batches", 0),
            progress.get("updated", "-"),
            f"; error: {progress['error']}" if progress.get("error") else "",
        )
        return progress

    def _wait_for_restart(self, flow_dir: Path) -> None:
        if (flow_dir / jobs.PAUSED_FILE).exists():
            self.log.info("the flow is paused: it starts over when its DAG is unpaused")
            return
        deadline = time.monotonic() + self.wait_timeout
        while time.monotonic() < deadline:
            if jobs.restart_request(flow_dir) is None:
                self.log.info("the mirror job took the request: %s started over", self.flow)
                return
            time.sleep(1)
        self.log.info(
            "no running mirror job took the request within %.0fs: %s starts over when its "
            "site's mirror DAG next starts it",
            self.wait_timeout,
            self.flow,
        )


def start_position(params: dict[str, Any]) -> str | None:
    """``starting_offsets`` of a run's Params as the job takes it: None (the flow's own),
    earliest, latest, or epoch milliseconds."""
    choice = params.get("starting_offsets") or "default"
    if choice not in STARTING_OFFSETS:
        raise AirflowException(f"starting_offsets must be one of {', '.join(STARTING_OFFSETS)}")
    if choice == "timestamp":
        stamp = params.get("starting_timestamp")
        if not stamp:
            raise AirflowException("starting_offsets 'timestamp' needs starting_timestamp")
        when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        if when.tzinfo is None:
            raise AirflowException("starting_timestamp needs a time zone, e.g. ...Z")
        return str(int(when.timestamp() * 1000))
    return None if choice == "default" else choice
