"""A flow's ``progress.json``, written by its job: state (STARTING, RUNNING, IDLE, PAUSED,
STOPPED, FAILED), the error that stopped it, and its figures (batches, records, positions, lag,
its periodic tasks). Each write replaces the file whole, one writer at a time in a process;
the health model, the metrics and the Replication page read it (``jobs.progress``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from mirrorflow.replication.lag import Lag
from mirrorflow.runtime.jobs import PROGRESS_FILE

Partition = tuple[str, int]
_V = TypeVar("_V")
END_HISTORY_MAX = 64  # observed ends kept per partition (the age of the oldest uncopied record)

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


@dataclass
class Backlog:
    """What a flow's job knows of its backlog, for ``progress.json`` (:meth:`lag_figures`,
    :meth:`observed`): the source's ends its last plan listed and when, the ends its plans
    observed over time, its last lag measurement, and when it was last caught up."""

    planned_ends: dict[Partition, int] = field(default_factory=dict)  # at the last plan
    plan_at: float = 0.0  # Unix time when the last plan listed the source's ends
    # Unix time at which every record then on the source was copied (a plan found nothing
    # new, a batch copied all it planned, or the idle doorbell heard nothing): the flow's
    # lag in seconds is at most now minus this.
    caught_up_at: float | None = None
    lag: Lag | None = None  # the last measurement (task measure-lag)
    # Per partition, the ends recent plans observed, (epoch ms, end), oldest first: when the
    # oldest record not copied yet was written (after the last end at or below the position,
    # by the first end past it).
    history: dict[Partition, list[tuple[int, int]]] = field(default_factory=dict)

    def observe(
        self, ends: dict[Partition, int], positions: dict[Partition, int], at_ms: int
    ) -> None:
        """Note the ends a plan (or the idle doorbell, at the positions) observed at ``at_ms``
        in :attr:`history`, kept short: the last entry at or below the partition's position
        and those past it."""
        for tp, end in ends.items():
            history = self.history.get(tp)
            if history is None:
                history = self.history[tp] = []
            position = positions.get(tp, 0)
            if history and history[-1][1] == end:
                if end <= position:  # still nothing past the position: known later
                    history[-1] = (at_ms, end)
            else:
                history.append((at_ms, end))
            # A stream observes every partition each second: the usual history is one entry.
            for floor in range(len(history) - 1, 0, -1):  # the last entry at or below it
                if history[floor][1] <= position:
                    del history[:floor]
                    break
            if len(history) > END_HISTORY_MAX:
                del history[len(history) // 2]

    def lag_figures(self, positions: dict[Partition, int]) -> dict[str, object]:
        """The flow's lag at ``positions`` as ``progress.json`` keeps it: records behind and
        when that was known, and when the oldest record not copied was written (while records
        are behind).

        The newest ends known per partition (the last plan's or the last measurement's, which
        only grow) minus the positions now: a measurement taken just before a batch copied
        its records does not outlive the batch. Once the job heard nothing past its positions
        (idle, after both), nothing is behind."""
        ends, at = dict(self.planned_ends), self.plan_at
        measured = self.lag
        if measured is not None:
            for tp, end in measured.ends.items():
                ends[tp] = max(end, ends.get(tp, end))
            at = max(at or 0.0, measured.measured_at)
        behind = {
            tp: end - positions[tp]
            for tp, end in ends.items()
            if tp in positions and end > positions[tp]
        }
        if self.caught_up_at is not None and self.caught_up_at >= (at or 0.0):
            behind, at = {}, self.caught_up_at
        oldest_ms = [
            measured.oldest_ms[tp] for tp in behind if measured and tp in measured.oldest_ms
        ]
        return {
            "lag_records": sum(behind.values()),
            "lag_measured_at": rounded(at) if at else None,
            "oldest_uncopied_at": rounded(min(oldest_ms) / 1000) if oldest_ms else None,
        }

    def observed(self, positions: dict[Partition, int]) -> dict[str, object]:
        """The source's end offsets at the last plan and when they were listed: what a failover
        without the source estimates its RPO from (those ends minus the positions); and, for
        each partition with records not copied, the ends recent plans observed
        (``source_end_history``: ``[epoch ms, end]``, oldest first), which date the oldest
        record not copied: written after the last end at or below the position, by the first
        end past it."""
        if not self.planned_ends:
            return {}
        listed = datetime.fromtimestamp(self.plan_at, UTC).isoformat(timespec="milliseconds")
        history = {
            tp: [list(entry) for entry in entries]
            for tp, entries in list(self.history.items())
            if entries and entries[-1][1] > positions.get(tp, entries[-1][1])
        }
        return {
            "source_end_offsets": by_topic(self.planned_ends),
            "source_end_offsets_at": listed,
            "source_end_history": by_topic(history),
        }
