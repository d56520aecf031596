"""What the operators share: a task's flows, checked when its DAG is parsed, and its flow
files, resolved when it runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from airflow.sdk.exceptions import AirflowException

from mirrorflow.paths import project_root
from mirrorflow.runtime import jobs


def flow_file_paths(flow_files: Sequence[str], label: str) -> list[Path]:
    """The flow files as paths (relative ones against the project root); a missing one fails
    the task, naming it."""
    root = project_root()
    resolved = [p if p.is_absolute() else root / p for p in map(Path, flow_files)]
    missing = [str(p) for p in resolved if not p.is_file()]
    if missing:
        raise AirflowException(
            f"{label}: flow file(s) not found: {', '.join(missing)} "
            f"(relative paths are read from {root})"
        )
    return resolved


def check_flows(operator: str, flows: Sequence[str], flow_files: Sequence[str]) -> None:
    """Check a task's ``flows`` (``"SOURCE->TARGET"`` each) and ``flow_files`` as its DAG is
    parsed: a malformed flow raises MirrorflowError, none of either a ValueError naming
    ``operator``."""
    for flow in flows:
        jobs.split_flow(flow)
    if not flows or not flow_files:
        raise ValueError(f"{operator} needs flows and flow_files")
