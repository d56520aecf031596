"""What the operators share: a task's flow files, resolved when it runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from airflow.sdk.exceptions import AirflowException

from mirrorflow.paths import project_root


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
