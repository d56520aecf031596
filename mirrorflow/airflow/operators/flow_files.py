"""What the operators share: a task's flows, checked when its DAG is parsed, and its flow
files, resolved when it runs; the base of the sync DAG's tasks (several flows each)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
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


class FlowsOperator(BaseOperator):
    """A task over several flows of the same flow files (the sync DAG's ``sync`` and
    ``groups``): ``flows`` and ``flow_files`` checked when its DAG is parsed (:func:`check_flows`).

    :param flows: the flows (``"SOURCE->TARGET"`` each)
    :param flow_files: their flow files (mm2.properties or YAML), merged in order
    """

    def __init__(self, *, flows: Sequence[str], flow_files: Sequence[str], **kwargs: Any) -> None:
        check_flows(type(self).__name__, flows, flow_files)
        super().__init__(**kwargs)
        self.flows, self.flow_files = list(flows), list(flow_files)
