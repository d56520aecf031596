"""A flow's ``progress.json``, written by its job: state (STARTING, RUNNING, IDLE, PAUSED,
STOPPED, FAILED), the error that stopped it, and its figures (batches, records, positions, lag,
its periodic tasks). Each write replaces the file whole, one writer at a time in a process;
the health model, the metrics and the Replication page read it (``jobs.progress``).
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from mirrorflow.runtime.jobs import PROGRESS_FILE

Partition = tuple[str, int]
_V = TypeVar("_V")

_PROGRESS_LOCK = threading.Lock()  # one writer of a progress.json at a time in this process


def record_state(
    flow_dir: Path, flow: str, state: str, error: str | None = None, **progress: object
) -> None:
    """Update the flow's ``progress.json``: its state (STARTING, RUNNING, IDLE, PAUSED,
    STOPPED, FAILED), the error that stopped it, and any progress figures given."""
    _update_progress(flow_dir, {**progress, "flow": flow, "state": state, "error": error})


def update_progress(flow_dir: Path, **figures: object) -> None:
    """Add ``figures`` to the flow's ``progress.json``, its state and error unchanged (e.g. the
    lag of a paused flow, measured by its application)."""
    _update_progress(flow_dir, figures)


def _update_progress(flow_dir: Path, changes: dict[str, object]) -> None:
    path = flow_dir / PROGRESS_FILE
    with _PROGRESS_LOCK:
        try:
            current = json.loads(path.read_text())
        except (OSError, ValueError):
            current = {}
        current.update(changes)
        current["updated"] = datetime.now(UTC).isoformat(timespec="milliseconds")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(current, indent=1) + "\n")
        partial.replace(path)


def rounded(at: float | None) -> float | None:
    return None if at is None else round(at, 3)


def by_topic(offsets: dict[Partition, _V]) -> dict[str, dict[str, _V]]:
    """Offsets (or each partition's value) as progress.json keeps them: topic -> partition ->
    offset."""
    nested: dict[str, dict[str, _V]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return nested
