"""How a flow stops, and the batch in flight a stop acts on (:class:`FlowStopper`).

A stop request (SIGTERM, SIGINT, the stop file, spark-submit gone) takes effect when the batch in
progress ends (a stream's at once). A pause or a hold (a failover) stops the flow at once,
whatever its source is doing (:meth:`FlowStopper.cancel`): no batch starts any more, and the
batch or stream in flight ends early. At least once, its tasks stop reading and return what they
copied, and the positions move to the last acknowledged copy (tasks in another JVM, with a
cluster master, are cancelled by Spark instead, after :data:`CANCEL_JOB_AFTER_S`: what they
copied is copied again when the flow resumes). Exactly once, its Spark job is cancelled and its
partitions' open transactions are aborted (fenced), so nothing of it becomes visible.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.runtime.batch_errors import BatchCancelled

if TYPE_CHECKING:
    from mirrorflow.runtime.driver import MirrorJob

log = logging.getLogger("mirrorflow.mirror")

Partition = tuple[str, int]
# A cancelled at-least-once batch whose tasks have not returned by then (tasks in other JVMs,
# which the copier's cancellation does not reach) is cancelled by Spark.
CANCEL_JOB_AFTER_S = 3.0


class FlowStopper:
    """The stop requests and the cancellation of ``job``'s flow, and its batch in flight."""

    def __init__(self, job: MirrorJob) -> None:
        self.job = job
        self._stop_requested = threading.Event()
        # cancel(): no batch starts any more, the one in flight ends early; quiet: and none is
        # in flight (nothing more reaches the target), though the thread may still be blocked
        # in a call to an unreachable cluster.
        self._cancelled = threading.Event()
        self.quiet = threading.Event()
        self._batch_lock = threading.Lock()
        self._in_flight: str | None = None  # the id of the batch being copied
        self._in_flight_partitions: list[Partition] = []  # its partitions
        self._batch_ids = f"{job.spec.flow}#{os.getpid()}.{id(job):x}"
        self._stop_logged = False
        self._parent = os.getppid()
        self.stop_file: Path | None = None  # a stop request once it exists

    # -- a stop: once the batch in progress ends -----------------------------------------------
    def request_stop(self) -> None:
        """Ask the job to end once its batch in progress is copied (any thread)."""
        self._stop_requested.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def stopping(self) -> bool:
        """Whether a stop was requested (checked between batches: a stop ends the job once
        the batch in progress is copied)."""
        job = self.job
        if self.stop_file is not None and self.stop_file.exists():
            self._stop_requested.set()
        if os.getppid() != self._parent:  # spark-submit's JVM, and with it Spark, is gone
            log.warning("%s: the spark-submit process that ran this job is gone", job.spec.flow)
            self._stop_requested.set()
        if self._stop_requested.is_set() and not self._stop_logged:
            self._stop_logged = True
            log.info("stop requested: %s ends after batch %d", job.spec.flow, job.report.batches)
        return self._stop_requested.is_set()

    def wait_for_stop(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a stop request: whether one came."""
        return self._stop_requested.wait(seconds)

    # -- a cancellation: at once ---------------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop the flow now (a pause or a hold; any thread): no batch starts any more, and the
        batch in flight ends early (see the module). :attr:`quiet` is set once none is in flight:
        nothing more of this job reaches the target for the flow. The flow's thread ends when
        the call it is in returns (one to an unreachable cluster may take its timeout)."""
        job = self.job
        with self._batch_lock:
            if self._cancelled.is_set():
                return
            self._cancelled.set()
            self._stop_requested.set()
            batch = self._in_flight
            if batch is None:
                self.quiet.set()
        if job.scheduler is not None:  # no more periodic runs (syncs, checkpoints, progress)
            job.scheduler.stop(wait_s=0)
        if batch is None:
            log.info("%s: cancelled between batches", job.spec.flow)
            return
        context = job.spark.context
        if job.spec.exactly_once:
            log.info("%s: cancelling batch %s: its transactions are aborted", job.spec.flow, batch)
            context.cancelJobsWithTag(batch)
            watcher = threading.Thread(
                target=self._fence_cancelled, args=(batch,), daemon=True, name=f"fence {batch}"
            )
            watcher.start()
            return
        log.info("%s: cancelling batch %s: it keeps what is acknowledged", job.spec.flow, batch)
        job.copier.java.cancel(batch)

        def cancel_job() -> None:
            if self._in_flight == batch:
                log.info("%s: batch %s still runs: Spark cancels it", job.spec.flow, batch)
                context.cancelJobsWithTag(batch)

        timer = threading.Timer(CANCEL_JOB_AFTER_S, cancel_job)
        timer.daemon = True
        timer.start()

    def _fence_cancelled(self, batch: str) -> None:
        """An exactly-once batch cancelled (on a thread of its own): once its Spark job has
        been submitted, the job cancelled again (it may have been submitted after the first
        cancellation) and its partitions' transactional producers fenced, so none of its
        transactions can commit any more whatever its tasks are still doing: the flow is quiet
        then, without waiting for its thread (whose call may wait out a source that does not
        answer). A committed transaction stays committed, with its position, which the flow
        resumes after. Before its job exists (Spark still plans it, asking the source for its
        partitions), the flow is quiet when its thread ends the batch."""
        context = self.job.spark.context
        tracker = context._jsc.sc().statusTracker()
        while True:
            with self._batch_lock:
                if self._in_flight != batch:
                    return  # ended: quiet already
                partitions = list(self._in_flight_partitions)
            if len(tracker.getJobIdsForTag(batch)):
                break
            time.sleep(0.2)
        context.cancelJobsWithTag(batch)
        if not self.job.fence(partitions):  # the target away: quiet once the batch has ended
            return
        log.info(
            "%s: batch %s fenced: none of its transactions can commit now",
            self.job.spec.flow,
            batch,
        )
        self.quiet.set()

    # -- the batch in flight -------------------------------------------------------------------
    def begin_batch(self, partitions: list[Partition]) -> str:
        """The id of a new batch of ``partitions``, in flight until :meth:`end_batch`;
        raises :class:`BatchCancelled` once the flow is cancelled."""
        report = self.job.report
        with self._batch_lock:
            if self._cancelled.is_set():
                raise BatchCancelled
            report.batches += 1
            self._in_flight = f"{self._batch_ids}-{report.batches}"
            self._in_flight_partitions = partitions
            return self._in_flight

    def in_flight_partitions(self, partitions: list[Partition]) -> None:
        """The batch in flight (a stream) now copies ``partitions``."""
        with self._batch_lock:
            self._in_flight_partitions = list(partitions)

    def end_batch(self, batch: str) -> None:
        """The batch ``batch`` ended: the flow is quiet if it was cancelled."""
        with self._batch_lock:
            self._in_flight = None
            cancelled = self._cancelled.is_set()
            if cancelled:
                self.quiet.set()
        if cancelled or self.job.batches.stalled:
            self.job.copier.forget(batch)
