"""A flow's state and figures as its job reports them: ``S-T/progress.json`` (for people, Airflow
and the health model, :mod:`mirrorflow.health`), its Prometheus metrics, and its lag measured
from the source (:mod:`mirrorflow.replication.lag`).

The mirror job (:class:`mirrorflow.runtime.driver.MirrorJob`) counts what it copies here and
records each change of state (a flow that stays ``RUNNING`` batch after batch rewrites it at most
every :data:`PROGRESS_EVERY_S`); its ``report-progress`` task rewrites ``progress.json`` every
:data:`~mirrorflow.runtime.flow_tasks.REPORT_PROGRESS_S`, busy or idle (liveness), and its
``measure-lag`` task measures the lag, the target away or not.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.errors import MirrorflowError
from mirrorflow.replication import lag
from mirrorflow.replication.scheduler import TaskFailed
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin
from mirrorflow.runtime.progress import Backlog, by_topic, record_state, rounded

if TYPE_CHECKING:
    from confluent_kafka import Consumer

    from mirrorflow.runtime.metrics import FlowMetrics

Partition = tuple[str, int]

# A flow that stays in its state (RUNNING, batch after batch) rewrites progress.json at most this
# often: a small exactly-once batch takes ~25 ms, and rewriting the file after each (read,
# encoded, written and renamed, which on ext4 flushes the file's data) took a third of the
# flow's thread. A change of state or an error is written at once.
PROGRESS_EVERY_S = 1.0


class FlowReport:
    """What one job of a flow has done and where it stands: its state (``STARTING``,
    ``RUNNING``, ``IDLE``, …), its batches (``local_batches`` of them in the driver's JVM), the
    records and bytes copied since it started, its last batch, and its backlog (the source's
    ends observed, when it was last caught up, its last lag).

    ``positions``, ``mapping`` and ``tasks`` give the flow's positions, its remote topics and
    its periodic tasks' figures when asked; once ``silenced`` answers true (the flow paused or
    held), the application records the flow's state and this report writes nothing more.
    ``seen``: the lag a running stream's own fetches saw, when they found it caught up just now
    (:meth:`~mirrorflow.runtime.streaming.FlowStream.seen_lag`), else None."""

    def __init__(
        self,
        spec: MirrorSpec,
        source_admin: ClusterAdmin,
        metrics: FlowMetrics | None,
        *,
        positions: Callable[[], dict[Partition, int]],
        mapping: Callable[[], dict[str, str]],
        tasks: Callable[[], dict],
        silenced: Callable[[], bool],
        seen: Callable[[], lag.Lag | None] = lambda: None,
    ) -> None:
        self.spec, self.metrics = spec, metrics
        self._source_admin = source_admin
        self._positions, self._mapping = positions, mapping
        self._tasks, self._silenced, self._seen = tasks, silenced, seen
        self.state = "STARTING"
        self.batches = 0
        self.local_batches = 0  # of them, copied in the driver's JVM without a Spark job
        self.copied = [0, 0]  # records, bytes since start
        self.last_batch_s = 0.0
        self.last_batch_at: float | None = None  # Unix time
        self.backlog = Backlog()
        self._lock = threading.Lock()  # the flow's thread and the report task write progress
        self._lag_reader: Consumer | None = None  # the lag's consumer, made at its first need
        self._written_at = float("-inf")  # when progress.json was last written (monotonic)
        self._unwritten = False  # figures recorded since, not written yet

    @property
    def flow_dir(self) -> Path:
        return Path(self.spec.flow_dir)

    def record_state(self, state: str, error: str | None = None) -> None:
        """The flow's new state, in ``progress.json`` and the metrics (the same state again,
        without an error: in ``progress.json`` once :data:`PROGRESS_EVERY_S` has passed since it
        was last written)."""
        with self._lock:
            again = state == self.state and error is None
            self.state = state
            if self.metrics is not None:
                self.metrics.state(state)
            if not again or time.monotonic() - self._written_at >= PROGRESS_EVERY_S:
                self._write(error)
            else:
                self._unwritten = True

    def flush(self) -> None:
        """Write what :meth:`record_state` left for later (the flow's loop ends: a stop, a
        failure, the end of ``--once``)."""
        with self._lock:
            if self._unwritten:
                self._write(None)

    def report_progress(self) -> None:
        """The ``report-progress`` task: progress.json rewritten with the current state."""
        with self._lock:
            self._write(None)

    def measure_lag(self) -> None:
        """The ``measure-lag`` task: the flow's lag from the source, for its positions now:
        records behind and the age of the oldest, in ``progress.json`` and the metrics.

        A stream whose fetches found every partition caught up just now (``seen``) has the
        source's answer already: the ends its fetches' answers gave. Then nothing is asked (an
        idle flow of a mesh asked for the ends of some 15 heartbeat partitions and read one
        record of each, every 10 s), and the lag's consumer, idle meanwhile, ends until a
        measurement needs it again; a flow behind, in batches, holding or paused is measured
        from the source."""
        positions = self.replicated_positions()
        if not positions:
            return
        seen = self._seen()
        if seen is not None and positions.keys() <= seen.ends.keys():
            measured = lag.Lag(seen.measured_at, {tp: seen.ends[tp] for tp in positions}, positions)
            self.close()
        else:
            measured = self._measure(positions)
        now = self.replicated_positions()
        if now != positions:  # copied meanwhile: its positions, the ends measured
            measured = lag.Lag(measured.measured_at, measured.ends, now, measured.oldest_ms)
        self.backlog.lag = measured
        if self.metrics is not None:
            self.metrics.measured(measured, self._mapping())

    def _measure(self, positions: dict[Partition, int]) -> lag.Lag:
        """The lag asked of the source (:func:`~mirrorflow.replication.lag.measure`)."""
        if self._lag_reader is None:
            self._lag_reader = lag.timestamp_reader(self.spec)
        try:
            return lag.measure(
                self.spec, positions, admin=self._source_admin, consumer=self._lag_reader
            )
        except MirrorflowError as exc:  # the batches say more; the last figures stay, dated
            raise TaskFailed(str(exc)) from None

    def replicated_positions(self) -> dict[Partition, int]:
        """The positions of the topics the flow replicates now: the offsets topic keeps every
        flow's from the source (and those of topics no longer replicated)."""
        return {tp: p for tp, p in self._positions().items() if self.spec.should_replicate(tp[0])}

    def close(self) -> None:
        """The lag's consumer is closed (the job ends, or the stream's fetches answered for the
        source); the next measurement from the source starts another."""
        if self._lag_reader is not None:
            with contextlib.suppress(Exception):
                self._lag_reader.close()
            self._lag_reader = None

    def _write(self, error: str | None) -> None:
        if self._silenced():  # the application records the flow's state from now on
            return
        self._written_at, self._unwritten = time.monotonic(), False
        positions = self._positions()
        record_state(
            self.flow_dir,
            self.spec.flow,
            self.state,
            error,
            batches=self.batches,
            local_batches=self.local_batches,
            records=self.copied[0],
            bytes=self.copied[1],
            last_batch_seconds=round(self.last_batch_s, 3),
            last_batch_at=rounded(self.last_batch_at),
            **self.backlog.lag_figures(positions),
            caught_up_at=rounded(self.backlog.caught_up_at),
            pid=os.getpid(),
            host=socket.gethostname(),
            tasks=self._tasks(),
            **self.backlog.observed(positions),
            source_positions=by_topic(positions),
        )
