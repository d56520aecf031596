"""The loop that runs a flow (:class:`FlowLoop`): started, then round after round a batch (a
backlog), a stream (caught up, at least once) or a wait for the next record (caught up, exactly
once or ``--no-continuous``: the doorbell), until a stop; the whole retried while a cluster does
not answer, up to ``retry_timeout_s``. Caught up, an exactly-once flow's batches (a transaction
each) commit at most every ``transaction_interval_ms`` (:meth:`FlowLoop._pace`).

A cluster that does not answer (at start or mid-run) is retried with exponential backoff, each
retry logged; the flow then resumes from its positions. So is an exactly-once batch whose
producer another producer of the flow's transactional ids fenced
(:class:`~mirrorflow.runtime.batch_errors.ProducerFenced`), while the job still holds the flow's
lease, up to :data:`MAX_FENCED_IN_A_ROW` times in a row. Once it has not answered for
``retry_timeout_s`` (``--retry-timeout``; -1: retry forever) the flow fails, in one line naming
the cluster and what to check; so does an idle flow whose periodic tasks (its heartbeats) have
not reached a cluster for that long (:meth:`FlowLoop.tasks_unanswered`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.runtime.batch_errors import BatchCancelled, ProducerFenced
from mirrorflow.runtime.batches import FOLLOW_MAX_S
from mirrorflow.runtime.doorbell import Doorbell

if TYPE_CHECKING:
    from mirrorflow.runtime.driver import MirrorJob

log = logging.getLogger("mirrorflow.mirror")

DOORBELL_WAIT_S = 0.5
# Batches fenced one after the other (ProducerFenced), nothing copied between them, before the
# flow stops: an earlier holder's retried copy tasks fence a partition's producer once each
# (Spark's spark.task.maxFailures, 4 by default), then fail their lease check.
MAX_FENCED_IN_A_ROW = 5
IDLE_REPLAN_S = 30.0  # an idle flow lists its partitions' ends this often, doorbell or not


class FlowLoop:
    """Runs ``job``'s flow, in batches and streams, retried across a cluster's outage."""

    def __init__(self, job: MirrorJob) -> None:
        self.job = job
        self.doorbell: Doorbell | None = None
        self._answered_at = time.monotonic()  # when both clusters last answered
        self._attempt_started = self._answered_at  # the current try of the batch loop
        self._copied_at = 0.0  # when a batch was last copied (both clusters answered)
        self._fenced = 0  # batches fenced since a batch was last copied

    def run(self, once: bool) -> None:
        """Run the flow, retried while a cluster does not answer (see the module), until
        everything available is copied (``once``) or a stop."""
        import tenacity

        job = self.job
        self._answered_at = time.monotonic()
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((ClusterUnreachable, ProducerFenced)),
            stop=self._give_up,
            wait=tenacity.wait_exponential_jitter(
                initial=job.spec.retry_backoff_s, max=job.spec.retry_backoff_max_s
            ),
            sleep=self._sleep_unless_stopped,
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            retrying(self._run_batches, once)
        except ClusterUnreachable as exc:  # retried up to the bound: now it is the launcher's
            raise MirrorflowError(
                f"{exc.message}; gave up after {self._unanswered_s():.0f}s of retries "
                f"(--retry-timeout {job.spec.retry_timeout_s:g})",
                exc.hint,
            ) from None
        finally:
            if job.lease is not None:
                job.lease.release()  # the next start of the flow takes it at once

    def _run_batches(self, once: bool) -> None:
        from confluent_kafka import KafkaException

        job = self.job
        self._attempt_started = time.monotonic()
        if job.stopping():
            return
        job.prepare()
        self._answered()
        job.starter.ship_library()
        spec = job.spec
        scheduler = job.scheduler = job.tasks.schedule(once)
        scheduler.start()
        if once:
            job.batches.once_ends = job.source_offsets.ends(job.partitions())
        outage = False  # leaving because a cluster did not answer
        try:
            caught_up = False  # the last batch copied every partition to its planned end
            streamed = False  # the last copy was a stream's, which ended
            while not job.stopping():
                if scheduler.error is not None:
                    raise scheduler.error
                self._check_tasks_answered()
                if job.lease is not None and not job.lease.fresh():
                    job.lease.renew()  # a job that was frozen learns here it lost the lease
                # Caught up, the doorbell (assigned at the new positions) rings at once for any
                # record that arrived meanwhile: no need to list the partitions' ends again.
                if not caught_up:
                    self._pace()
                ranges = [] if caught_up else job.batches.plan()
                self._answered()
                if (
                    streamed
                    and ranges
                    and not job.batches.capped
                    and job.stream.starts_again(ranges)
                ):
                    try:
                        job.stream.run(behind=sum(until - start for _tp, start, until in ranges))
                    except BatchCancelled:
                        break
                elif ranges:
                    streamed = False
                    try:
                        job.batches.copy(ranges)
                    except BatchCancelled:
                        break
                    caught_up = not once and not job.batches.capped
                elif once:
                    break
                elif spec.continuous and not spec.exactly_once:
                    caught_up = False  # the stream ended: plan before copying more
                    streamed = True
                    try:
                        job.stream.run()
                    except BatchCancelled:
                        break
                else:
                    caught_up = False
                    self._wait_for_records()
        except ClusterUnreachable:
            outage = True  # whatever waits for that cluster would only wait the timeouts out
            raise
        finally:
            scheduler.stop(wait_s=1.0 if outage else 30.0)
            if self.doorbell is not None:
                self.doorbell.close()
                self.doorbell = None
            job.batches.close()
            job.report.flush()  # the last batch's figures, if its pace held them back
            job.report.close()
            for alias, producer in job.producers.started().items():
                try:
                    producer.flush(1.0 if outage else 10.0)
                except KafkaException as exc:  # the batch's own error, if any, says more
                    log.warning("%s: the producer of %s failed: %s", spec.flow, alias, exc)

    def _pace(self) -> None:
        """Exactly once, at the source's end (the last batch took every record planned): the
        next batch, one transaction, commits no sooner than ``transaction_interval_ms`` after
        the last one (:meth:`~mirrorflow.runtime.batches.Batches.commit_due`). A batch in the
        driver starts at once and takes what arrives until then (at most
        :data:`~mirrorflow.runtime.batches.FOLLOW_MAX_S`: it starts that long before); another
        starts then, with what arrived meanwhile. A backlog's batches follow each other at
        once."""
        batches = self.job.batches
        due = batches.commit_due()
        if due is not None:
            ahead = FOLLOW_MAX_S if batches.follow else 0.0
            self._sleep_unless_stopped(due - ahead - time.monotonic())

    def _wait_for_records(self) -> None:
        """Idle: wait until a record arrives, the topics change, a stop is asked or a task
        failed; plan again at least every :data:`IDLE_REPLAN_S` (a safety net) but never list
        the partitions' ends while nothing moves."""
        job = self.job
        assert job.scheduler is not None
        if self.doorbell is None:  # its consumer only when a flow waits: not a streaming one's
            self.doorbell = Doorbell(job.spec.source_consumer_client, job.spec.flow)
        backlog = job.backlog
        mapping, since = job.mapping, time.monotonic()
        while not self.doorbell.wait(job.positions, DOORBELL_WAIT_S):
            # IDLE once nothing arrived for a wait, not between two batches of a steady load
            # (each change of state rewrites progress.json at once)
            if job.report.state != "IDLE":
                job.record_state("IDLE")
            if self.doorbell.error is not None:  # it cannot tell: list the ends each wait
                return
            backlog.caught_up_at = time.time()  # no record past the positions: nothing to copy
            backlog.observe(job.positions, job.positions, int(backlog.caught_up_at * 1000))
            if job.metrics is not None:
                job.metrics.caught_up(job.positions, mapping, backlog.caught_up_at)
            if (
                job.stopping()
                or job.mapping is not mapping
                or job.scheduler.error is not None
                or self.tasks_unanswered() is not None
                or time.monotonic() - since > IDLE_REPLAN_S
            ):
                return

    # -- retries ---------------------------------------------------------------------------
    def copied_now(self) -> None:
        """Records were just copied: both clusters answer."""
        self._copied_at = time.monotonic()
        self._fenced = 0

    def _answered(self) -> None:
        """Both clusters answered just now: an outage, if any, is over."""
        self._answered_at = time.monotonic()

    def _unanswered_s(self) -> float:
        return time.monotonic() - self._answered_at

    def tasks_unanswered(self) -> tuple[float, ClusterUnreachable] | None:
        """An idle flow copies nothing, but its heartbeats (and other periodic tasks) still
        reach the target: the failures of one whose cluster has not answered for
        ``retry_timeout_s`` (since when, the last error), else None."""
        scheduler = self.job.scheduler
        assert scheduler is not None
        unreachable, timeout = scheduler.unreachable(), self.job.spec.retry_timeout_s
        if unreachable is None or timeout < 0 or time.monotonic() - unreachable[0] <= timeout:
            return None
        if self._copied_at > unreachable[0]:  # batches are copied: both clusters answer
            return None
        return unreachable

    def _check_tasks_answered(self) -> None:
        """Fail the flow as a batch's error would when :meth:`tasks_unanswered` says so."""
        unanswered = self.tasks_unanswered()
        if unanswered is not None:
            since, error = unanswered
            self._answered_at = min(self._answered_at, since)
            raise error

    def _give_up(self, state) -> bool:
        """Whether to stop retrying: another wait and attempt (as long as the failed part of
        the last one) would end past ``retry_timeout_s`` without an answer, so the flow fails
        within its bound rather than after it."""
        if isinstance(state.outcome.exception(), ProducerFenced):
            # Another producer of the flow's ids fenced the batch's; the lease, renewed as
            # the flow starts again, says whether this job may go on (LeaseLost otherwise).
            self._fenced += 1
            return self._fenced > MAX_FENCED_IN_A_ROW
        timeout = self.job.spec.retry_timeout_s
        if timeout < 0:
            return False
        failing = time.monotonic() - max(self._attempt_started, self._answered_at)
        return self._unanswered_s() + state.upcoming_sleep + failing > timeout

    def _sleep_unless_stopped(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not self.job.stopping():
            time.sleep(min(0.2, left))

    def _log_retry(self, state) -> None:
        timeout = self.job.spec.retry_timeout_s
        attempt = f"attempt {state.attempt_number}"
        if isinstance(state.outcome.exception(), ProducerFenced):
            why = f"fenced {self._fenced} time(s) in a row; stops after {MAX_FENCED_IN_A_ROW}"
        elif timeout >= 0:
            unanswered = f"no answer for {self._unanswered_s():.0f}s"
            why = f"{attempt}, {unanswered}, the flow fails by {timeout:g}s"
        else:
            why = f"{attempt}, retrying forever"
        log.warning(
            "%s: %s; retrying in %.0f s (%s)",
            self.job.spec.flow,
            state.outcome.exception(),
            state.next_action.sleep,
            why,
        )
