"""A flow's health, derived from what its job reports: pure logic, no files, no clock.

Inputs are the flow's ``progress.json`` (as :mod:`mirrorflow.runtime.driver` writes it: the
job's state, when it last wrote, its lag, when it was last caught up, its periodic tasks' last
runs, the driver's process), whether that process still runs, whether the flow or its site's
mirror DAG is paused, the flow's thresholds, and the time now. The result is one of:

- ``FAILED``: the flow stopped on an error (the error is the reason);
- ``PAUSED``: the flow is paused (its flow DAG, or its ``paused`` file), or no job runs it and
  its site's mirror DAG is paused; the reason starts with "pausing:" while its running job has
  not yet confirmed the pause (it may still copy its batch in progress);
- ``STOPPED``: no job runs the flow (never started, stopped, or its process is gone) and none is
  expected to (the site's mirror DAG is not known to be on);
- ``STALLED``: a job should run the flow but nothing was heard from it within
  ``health.stall.timeout.seconds``: no progress report (the job hangs, was killed, or cannot
  reach a cluster), no heartbeat acknowledged by the target, or no job although its mirror DAG
  is on;
- ``LAGGING``: the job runs, but its lag is over ``health.lag.max.seconds`` or
  ``health.lag.max.records`` (the RPO);
- ``RUNNING``: the job runs (copying, idle or starting) within its bounds.

Lag is what the clusters say (:mod:`mirrorflow.replication.lag`): in records, the source's end
offsets minus the flow's positions, as the job's last plan or last measurement (every 10 s)
found them, or as whoever renders the health measured them when no job reports (``measured``);
in seconds, the age of the oldest record not copied (its source timestamp), 0 when nothing is
behind. A flow with records to copy is never "caught up", whatever its job's state; the figures
are shown in every state (PAUSED and STALLED included: what a failover would leave behind), and
each reason says when they were measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from mirrorflow.replication.lag import progress_lag

RUNNING, LAGGING, STALLED, FAILED, PAUSED, STOPPED = (
    "RUNNING",
    "LAGGING",
    "STALLED",
    "FAILED",
    "PAUSED",
    "STOPPED",
)
STATES = (RUNNING, LAGGING, STALLED, FAILED, PAUSED, STOPPED)
ACTIVE_JOB_STATES = ("STARTING", "RUNNING", "IDLE")  # the job's own states while it runs
HEARTBEATS_TASK, CHECKPOINTS_TASK = "heartbeats", "emit-checkpoints"


@dataclass(frozen=True)
class HealthSettings:
    """A flow's health thresholds (its settings ``health.*``; 0 disables a lag bound)."""

    lag_max_seconds: float = 300.0
    lag_max_records: int = 0
    stall_timeout_seconds: float = 30.0


@dataclass(frozen=True)
class SiteDag:
    """What Airflow says of the DAGs around a flow (None: not known, e.g. outside Airflow)."""

    mirror_dag: str | None = None
    mirror_dag_paused: bool | None = None
    flow_dag: str | None = None
    flow_dag_paused: bool | None = None


DEFAULTS, UNKNOWN_DAGS = HealthSettings(), SiteDag()


@dataclass(frozen=True)
class FlowHealth:
    """A flow's health: its state, the reason in one line, and the figures behind it."""

    flow: str
    state: str
    reason: str
    job_state: str | None  # the job's own state in progress.json
    lag_records: int | None
    lag_seconds: float | None
    lag_measured_at: float | None  # Unix times
    last_heartbeat: float | None
    last_checkpoint: float | None
    last_batch: float | None
    last_report: float | None
    records: int | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def derive(
    flow: str,
    progress: Mapping[str, object],
    *,
    now: float,
    settings: HealthSettings = DEFAULTS,
    job_alive: bool | None = None,
    flow_paused: bool = False,
    dags: SiteDag = UNKNOWN_DAGS,
    measured: Mapping[str, object] | None = None,
) -> FlowHealth:
    """The flow's health at ``now`` (Unix time).

    ``progress`` is the flow's progress.json (empty if it has none); ``job_alive`` whether the
    process that wrote it still runs (None: cannot tell, e.g. on another host); ``flow_paused``
    whether its ``paused`` file exists; ``measured``: the flow's lag as the renderer measured it
    itself (:meth:`mirrorflow.replication.lag.Lag.as_progress`), used when newer than the job's.
    """
    job_state = _str(progress.get("state"))
    tasks = progress.get("tasks")
    if not isinstance(tasks, Mapping):
        tasks = {}
    last_heartbeat = _task_success(tasks, HEARTBEATS_TASK)
    last_report = _timestamp(progress.get("updated"))
    running = job_state in ACTIVE_JOB_STATES and job_alive is not False
    lag_source: Mapping[str, object] = progress
    measured_at = _number(progress.get("lag_measured_at"))
    if measured and (_number(measured.get("lag_measured_at")) or 0) > (measured_at or 0):
        lag_source = {"caught_up_at": progress.get("caught_up_at"), **measured}
        measured_at = _number(measured.get("lag_measured_at"))
    lag_records, lag_seconds = progress_lag(lag_source, now)
    if measured_at is None and lag_records is not None and running:
        measured_at = last_report  # an older job: its figures as of its last report
    figures: dict[str, Any] = dict(
        flow=flow,
        job_state=job_state,
        lag_records=lag_records,
        lag_seconds=lag_seconds,
        lag_measured_at=measured_at,
        last_heartbeat=last_heartbeat,
        last_checkpoint=_task_success(tasks, CHECKPOINTS_TASK),
        last_batch=_number(progress.get("last_batch_at")),
        last_report=last_report,
        records=_int(progress.get("records")),
    )

    lag_said = _lag_said(lag_records, lag_seconds, measured_at, now)

    def health(state: str, reason: str, lag: bool = True) -> FlowHealth:
        if lag and lag_said:
            reason = f"{reason}; {lag_said}"
        return FlowHealth(state=state, reason=reason, **figures)

    if job_state == "FAILED":
        error = _str(progress.get("error")) or "the flow failed (no error recorded)"
        return health(FAILED, error)
    if dags.flow_dag_paused or flow_paused or job_state == "PAUSED":
        why = (
            f"its DAG {dags.flow_dag} is paused"
            if dags.flow_dag_paused
            else "the flow is paused (its paused file exists)"
        )
        if running and job_alive:  # asked, not yet confirmed by its job (known to run)
            why = f"pausing: {why}; its job has not stopped copying yet"
        return health(PAUSED, why)
    timeout = settings.stall_timeout_seconds
    should_run = dags.mirror_dag_paused is False  # its site's DAG is on
    if not running:
        if dags.mirror_dag_paused:  # a job started outside Airflow would still count
            return health(PAUSED, f"the site's mirror DAG {dags.mirror_dag} is paused")
        if not progress:
            what = "no mirror job has run this flow yet"
        elif job_state in ACTIVE_JOB_STATES:  # it never wrote STOPPED: killed
            what = f"its mirror job (pid {progress.get('pid')}) is gone"
        else:
            what = f"its mirror job stopped{_ago(last_report, now)}"
        if should_run:
            quiet = now - last_report if last_report is not None else None
            if quiet is None or quiet > timeout:
                return health(
                    STALLED,
                    f"{what}, though {dags.mirror_dag} is on (no report for over {timeout:.0f}s)",
                )
            return health(STOPPED, f"{what}; {dags.mirror_dag} is on and should start it again")
        return health(STOPPED, what)
    if last_report is None or now - last_report > timeout:
        return health(
            STALLED,
            f"no progress report from its mirror job for {_age(last_report, now)} "
            f"(bound {timeout:.0f}s): it hangs, was killed, or cannot reach a cluster",
        )
    if last_heartbeat is not None and now - last_heartbeat > timeout:
        return health(
            STALLED,
            f"no heartbeat acknowledged by the target for {_age(last_heartbeat, now)} "
            f"(bound {timeout:.0f}s)",
        )
    over = []
    max_seconds, max_records = settings.lag_max_seconds, settings.lag_max_records
    if max_seconds and lag_seconds is not None and lag_seconds > max_seconds:
        over.append(f"{lag_seconds:,.0f}s behind (bound {max_seconds:,.0f}s)")
    if max_records and lag_records is not None and lag_records > max_records:
        over.append(f"{lag_records:,} records behind (bound {max_records:,})")
    when = _measured(measured_at, now)
    if over:
        return health(LAGGING, " and ".join(over) + (f" ({when})" if when else ""), lag=False)
    if job_state == "STARTING":
        return health(RUNNING, "starting")
    if lag_records:  # records to copy: never "caught up", whatever the job's last word
        return health(RUNNING, "copying")
    if lag_records == 0:
        return health(RUNNING, "caught up" + (f" ({when})" if when else ""), lag=False)
    return health(RUNNING, "copying")


def _lag_said(
    records: int | None, seconds: float | None, measured_at: float | None, now: float
) -> str:
    """The lag in words, with when it was measured (empty when unknown)."""
    if records is None:
        return ""
    if records == 0:
        said = "nothing to copy"
    else:
        said = f"{records:,} record(s) behind"
        if seconds is not None:
            said += f", the oldest {_age_of(seconds)} old"
    when = _measured(measured_at, now)
    return said + (f" ({when})" if when else "")


def _measured(at: float | None, now: float) -> str:
    return "" if at is None else f"measured {_age(at, now)} ago"


def _age_of(seconds: float) -> str:
    return _age(0.0, max(0.0, seconds))


def _task_success(tasks: Mapping, name: str) -> float | None:
    task = tasks.get(name)
    return _number(task.get("last_success_at")) if isinstance(task, Mapping) else None


def _ago(at: float | None, now: float) -> str:
    return "" if at is None else f" {_age(at, now)} ago"


def _age(at: float | None, now: float) -> str:
    if at is None:
        return "ever"
    seconds = max(0, int(now - at))
    if seconds < 300:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}min"
    return f"{seconds // 3600}h"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _timestamp(value: object) -> float | None:
    """Unix time from a number or an ISO 8601 string with its offset (progress.json's
    ``updated``)."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return _number(value)


def _int(value: object) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
