"""Flows' health from their files: the flow files' thresholds, the jobs' ``progress.json``.

:func:`topology_health` is what the Airflow UI page and its JSON endpoint show: every cluster
and every enabled flow of some flow files, each flow with its health (:mod:`.model`). What
Airflow knows (whether a DAG is paused) comes in through ``dags``, so nothing here imports
Airflow. A job's files are read from the state directory, so this runs on the job's machine (as
the DAGs' tasks do); whether the job's process still runs is only checked on that host.

When no job reports a flow's lag (none runs it, it is frozen, or its reports are older than
:data:`STALE_S`), the lag is measured here from the clusters (:func:`measured_lag`: the source's
ends and the record at each position; the positions from the target), on a thread of its own
and at most every :data:`~mirrorflow.replication.lag.MEASURE_EVERY_S` per flow: a render never
waits for a cluster, it shows the last measurement, dated.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mirrorflow.config.topology import Flow, load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.health.model import UNKNOWN_DAGS, FlowHealth, HealthSettings, SiteDag, derive
from mirrorflow.replication import lag
from mirrorflow.runtime import jobs, processes

log = logging.getLogger(__name__)

STALE_S = 15.0  # a job's lag figures older than this are measured again here
_MEASURED: dict[tuple[str, ...], dict] = {}  # (flow files..., flow) -> its lag, as_progress()
_STARTED: dict[tuple[str, ...], float] = {}  # when its last measurement started (monotonic)
_RUNNING: set[tuple[str, ...]] = set()
_LOCK = threading.Lock()


def measured_lag(files: Iterable[str], flow: str) -> dict | None:
    """The flow's lag as last measured here (:meth:`~mirrorflow.replication.lag.Lag.as_progress`
    figures; None before the first measurement ends), and a new measurement started on a
    thread when the last is older than :data:`~mirrorflow.replication.lag.MEASURE_EVERY_S`."""
    key = (*sorted(files), flow)
    with _LOCK:
        due = time.monotonic() - _STARTED.get(key, -1e9) >= lag.MEASURE_EVERY_S
        if due and key not in _RUNNING:
            _RUNNING.add(key)
            _STARTED[key] = time.monotonic()
            threading.Thread(target=_measure, args=(key,), daemon=True, name=f"lag {flow}").start()
        return _MEASURED.get(key)


def _measure(key: tuple[str, ...]) -> None:
    from mirrorflow.replication.remote_cluster import flow_positions
    from mirrorflow.replication.spec import spec_for_flow

    *files, flow = key
    try:
        spec = spec_for_flow(files, flow)
        positions = {
            tp: o for tp, o in flow_positions(spec).items() if spec.should_replicate(tp[0])
        }
        figures = lag.measure(spec, positions).as_progress()
    except Exception as exc:  # a cluster away, files changed: the page says what it has
        log.info("flow %s: its lag could not be measured: %s", flow, exc)
        figures = None
    with _LOCK:
        _RUNNING.discard(key)
        if figures is not None:
            _MEASURED[key] = figures


def _job_reports_lag(progress: dict, alive: bool | None, now: float) -> bool:
    """Whether a running job reports the flow's lag now (fresh figures)."""
    at = progress.get("lag_measured_at")
    fresh = isinstance(at, int | float) and now - at <= STALE_S
    return bool(fresh and alive is not False and progress.get("state") not in (None, "STOPPED"))


def settings_for(flow: Flow) -> HealthSettings:
    """The flow's thresholds: ``health.lag.max.seconds``, ``health.lag.max.records``,
    ``health.stall.timeout.seconds`` (mirrorflow's own flow settings)."""
    return HealthSettings(
        lag_max_seconds=float(flow.numeric_setting("health.lag.max.seconds")),
        lag_max_records=int(flow.numeric_setting("health.lag.max.records")),
        stall_timeout_seconds=float(flow.numeric_setting("health.stall.timeout.seconds")),
    )


def job_alive(progress: dict) -> bool | None:
    """Whether the driver that wrote ``progress`` still runs (None: unknown, or another host)."""
    pid, host = progress.get("pid"), progress.get("host")
    if not isinstance(pid, int) or host != socket.gethostname():
        return None
    # The pid may have been reused by another process since.
    return jobs.process_alive(pid) and any("mirror" in a for a in processes.command_line(pid))


def flow_health(
    flow: Flow,
    state_dir: Path,
    *,
    dags: SiteDag = UNKNOWN_DAGS,
    now: float | None = None,
    files: Iterable[str] | None = None,
) -> FlowHealth:
    """One flow's health from its files under ``state_dir`` (``$MIRRORFLOW_STATE/flows``);
    with its flow ``files``, its lag measured here when no job reports it (module)."""
    flow_dir = state_dir / f"{flow.source}-{flow.target}"
    progress = jobs.read_progress(flow_dir)
    now = time.time() if now is None else now
    alive = job_alive(progress) if progress else None
    measured = None
    if files is not None and not _job_reports_lag(progress, alive, now):
        with contextlib.suppress(MirrorflowError):
            measured = measured_lag(files, flow.name)
    return derive(
        flow.name,
        progress,
        now=now,
        settings=settings_for(flow),
        job_alive=alive,
        flow_paused=(flow_dir / jobs.PAUSED_FILE).exists(),
        dags=dags,
        measured=measured,
    )


@dataclass
class TopologyHealth:
    """Clusters and flows of some flow files, each flow with its health."""

    files: list[str]
    clusters: list[str] = field(default_factory=list)
    flows: list[dict] = field(default_factory=list)  # FlowHealth.as_dict() + source, target
    error: str | None = None  # the flow files could not be read

    def as_dict(self) -> dict[str, object]:
        return {
            "files": self.files,
            "clusters": self.clusters,
            "flows": self.flows,
            "error": self.error,
        }


def topology_health(
    flow_files: Iterable[Path | str],
    state_dir: Path,
    *,
    dags: Callable[[str], SiteDag] = lambda flow: UNKNOWN_DAGS,
    only: Iterable[str] | None = None,
    now: float | None = None,
) -> TopologyHealth:
    """Every enabled flow of ``flow_files`` (or just those named in ``only``) with its health;
    ``dags(flow)`` tells what Airflow knows of the flow's DAGs. Flow files that cannot be read
    give a result with ``error`` set (one line), not an exception."""
    files = [str(p) for p in flow_files]
    result = TopologyHealth(files)
    try:
        topology = load_topology(files)
        wanted = set(only) if only is not None else None
        flows = [f for f in topology.flows if wanted is None or f.name in wanted]
        result.clusters = list(topology.aliases)
        for flow in flows:
            health = flow_health(flow, state_dir, dags=dags(flow.name), now=now, files=files)
            result.flows.append({"source": flow.source, "target": flow.target, **health.as_dict()})
    except MirrorflowError as exc:
        result.error = str(exc)
    return result
