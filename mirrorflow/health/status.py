"""Flows' health from their files: the flow files' thresholds, the jobs' ``progress.json``.

:func:`topology_health` is what the Airflow UI page and its JSON endpoint show: every cluster
and every enabled flow of some flow files, each flow with its health (:mod:`.model`). What
Airflow knows (whether a DAG is paused) comes in through ``dags``, so nothing here imports
Airflow. A job's files are read from the state directory, so this runs on the job's machine (as
the DAGs' tasks do); whether the job's process still runs is only checked on that host.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mirrorflow.config.topology import Flow, load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.health.model import UNKNOWN_DAGS, FlowHealth, HealthSettings, SiteDag, derive
from mirrorflow.runtime import jobs


def settings_for(flow: Flow) -> HealthSettings:
    """The flow's thresholds: ``health.lag.max.seconds``, ``health.lag.max.records``,
    ``health.stall.timeout.seconds`` (mirrorflow's own flow settings)."""
    return HealthSettings(
        lag_max_seconds=float(flow.setting("health.lag.max.seconds")),
        lag_max_records=int(flow.setting("health.lag.max.records")),
        stall_timeout_seconds=float(flow.setting("health.stall.timeout.seconds")),
    )


def job_alive(progress: dict) -> bool | None:
    """Whether the driver that wrote ``progress`` still runs (None: unknown, or another host)."""
    pid, host = progress.get("pid"), progress.get("host")
    if not isinstance(pid, int) or host != socket.gethostname():
        return None
    if not jobs.process_alive(pid):
        return False
    try:  # the pid may have been reused by another process since
        return b"mirror" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def flow_health(
    flow: Flow,
    state_dir: Path,
    *,
    dags: SiteDag = UNKNOWN_DAGS,
    now: float | None = None,
) -> FlowHealth:
    """One flow's health from its files under ``state_dir`` (``$MIRRORFLOW_STATE/flows``)."""
    flow_dir = state_dir / f"{flow.source}-{flow.target}"
    progress = jobs.read_progress(flow_dir)
    return derive(
        flow.name,
        progress,
        now=time.time() if now is None else now,
        settings=settings_for(flow),
        job_alive=job_alive(progress) if progress else None,
        flow_paused=(flow_dir / jobs.PAUSED_FILE).exists(),
        dags=dags,
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
            health = flow_health(flow, state_dir, dags=dags(flow.name), now=now)
            result.flows.append({"source": flow.source, "target": flow.target, **health.as_dict()})
    except MirrorflowError as exc:
        result.error = str(exc)
    return result
