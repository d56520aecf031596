"""The driver of a mirror job: one flow ``S->T``, MirrorMaker 2's semantics, supervised.

:class:`MirrorJob` holds the flow's state (its topics, positions, offset map, lease, clients)
and runs it with Spark's public API only:

1. the flow's topics are listed (and their remote topics created or grown) at start and every
   ``refresh.topics.interval.seconds``, as MirrorMaker 2 does;
2. each source partition resumes from its position in ``mm2-offsets.<source>.internal`` on the
   target, MirrorMaker 2's own record; a partition without one starts as ``auto.offset.reset``
   (or ``--starting-offsets``) says;
3. a backlog is copied in **batches** (:mod:`mirrorflow.runtime.batches`): every partition's range
   from its position to its current end, copied at once (on the executors, or in the driver's
   JVM when small; exactly once, in Kafka transactions), then written;
4. caught up, an at-least-once flow copies in a **stream** (:mod:`mirrorflow.runtime.streaming`):
   one long-running task in the driver's JVM, whose acknowledged copies are written every second
   and which new topics and partitions join; exactly once (or ``--no-continuous``), the flow
   waits for the next record instead (the doorbell: a long-polling consumer on the driver) and
   copies it in a batch;
5. beside the copying, the job's scheduler runs MirrorMaker 2's periodic tasks: heartbeats,
   checkpoints (:mod:`mirrorflow.replication.checkpoint_task`), group offset sync, config and
   ACL sync, the topic refresh, the flow's lease and its progress report.

Every copy's source and target offsets go to the flow's offset map
(:mod:`mirrorflow.replication.offset_map`) before the position moves past them (exactly-once: in
the same transaction); the checkpoint task translates the flow's consumer groups with it,
exactly, and the group offset sync (:mod:`mirrorflow.replication.group_offset_sync`) commits the
results on the target.

A crash anywhere copies the unacknowledged copies again (at-least-once), never loses a record,
and every offset sync stays exact because it pairs a record with the acknowledged offset of its
copy. A stop request (SIGTERM, SIGINT, the stop file) takes effect when the batch in progress
ends (a stream's at once). A pause or a hold (a failover) stops the flow at once, whatever its
source is doing (:meth:`MirrorJob.cancel`): no batch starts any more, and the batch or stream in
flight ends early. At least once, its tasks stop reading and return what they copied, and the
positions move to the last acknowledged copy (tasks in another JVM, with a cluster master, are
cancelled by Spark instead: what they copied is copied again when the flow resumes). Exactly
once, its Spark job is cancelled and its partitions' open transactions are aborted (fenced), so
nothing of it becomes visible. Heartbeats are written to the target only, as MirrorMaker 2
writes them.

A mirrorflow 0.x job kept at-least-once positions in a Spark streaming checkpoint
(``S-T/checkpoint``); they are moved into the offsets topic once, at the first start.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.checkpoint_stores import OffsetMapReader
from mirrorflow.replication.lease import FlowLease, Holder
from mirrorflow.replication.offset_map import OffsetMap, Run, record_of
from mirrorflow.replication.positions import PositionWriter, SourceOffsetReader, legacy_progress
from mirrorflow.replication.scheduler import Scheduler
from mirrorflow.replication.source_offsets import SourceOffsets
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import (
    ClusterAdmin,
    RemoteTopics,
    client_principal,
    ensure_flow_topics,
    write_records,
)
from mirrorflow.runtime import eos_writer as mirror_writer
from mirrorflow.runtime import exactly_once, jobs
from mirrorflow.runtime.batch_errors import BatchCancelled
from mirrorflow.runtime.batches import Batches
from mirrorflow.runtime.copier import JvmCopier
from mirrorflow.runtime.doorbell import Doorbell
from mirrorflow.runtime.flow_report import FlowReport
from mirrorflow.runtime.flow_tasks import FlowTasks
from mirrorflow.runtime.progress import Backlog
from mirrorflow.runtime.streaming import FlowStream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from mirrorflow.runtime.metrics import FlowMetrics

log = logging.getLogger("mirrorflow.mirror")

Partition = tuple[str, int]
LEGACY_PROGRESS = "checkpoint"  # mirrorflow 0.x: Spark's streaming checkpoint of the flow
DOORBELL_WAIT_S = 0.5
IDLE_REPLAN_S = 30.0  # an idle flow lists its partitions' ends this often, doorbell or not
# A cancelled at-least-once batch whose tasks have not returned by then (tasks in other JVMs,
# which the copier's cancellation does not reach) is cancelled by Spark.
CANCEL_JOB_AFTER_S = 3.0
# How long a start waits for another job's lease of the flow to be released or to expire (a job
# that is stopping, or whose host died) before it fails naming that job.
LEASE_WAIT_S = 14.0
_SHIPPED = False  # the mirrorflow package went to the executors (once per application)


class MirrorJob:
    """Runs one flow, in batches and streams, until told to stop."""

    def __init__(
        self, spark: SparkSession, spec: MirrorSpec, metrics: FlowMetrics | None = None
    ) -> None:
        self.spark, self.spec = spark, spec
        self.metrics = metrics  # the flow's Prometheus metrics, when the application has them
        self._stop_requested = threading.Event()
        # cancel(): no batch starts any more, the one in flight ends early; quiet: and none is
        # in flight (nothing more reaches the target), though the thread may still be blocked
        # in a call to an unreachable cluster.
        self._cancelled = threading.Event()
        self.quiet = threading.Event()
        self._batch_lock = threading.Lock()
        self._in_flight: str | None = None  # the id of the batch being copied
        self._in_flight_partitions: list[Partition] = []  # its partitions
        self._batch_ids = f"{spec.flow}#{os.getpid()}.{id(self):x}"
        self._stop_logged = False
        self._parent = os.getppid()
        self._stop_file: Path | None = None
        self._answered_at = time.monotonic()  # when both clusters last answered
        self._attempt_started = self._answered_at  # the current try of the batch loop
        self._copied_at = 0.0  # when a batch was last copied (both clusters answered)
        self.admins = {
            alias: ClusterAdmin(alias, conf)
            for alias, conf in ((spec.source, spec.source_admin), (spec.target, spec.target_admin))
        }
        self.source_offsets = SourceOffsets(spec, self.admins[spec.source])
        self.remote_topics = RemoteTopics(
            self.admins[spec.source],
            self.admins[spec.target],
            spec.should_replicate,
            spec.remote_topic,
            spec.replication_factor,
            spec.replicate_config,
            spec.flow,
        )
        producer_base = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
        self.producers = {
            spec.source: clients.producer(spec.source, {**spec.source_client, **producer_base}),
            spec.target: clients.producer(spec.target, {**spec.target_client, **producer_base}),
        }
        self.copy_producer_config = {
            **spec.target_client,
            **producer_base,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 262_144,
            "message.max.bytes": 1_000_000_000,
        }
        self.mapping: dict[str, str] = {}  # replicated source topic -> remote topic
        self.positions: dict[Partition, int] = {}  # next offset to copy
        self.reader: SourceOffsetReader | None = None
        self.offset_map = OffsetMap()
        self._map_reader: OffsetMapReader | None = None
        self.writer: PositionWriter | None = None
        self.lease: FlowLease | None = None  # the flow's lease on the target, while it runs
        self.doorbell: Doorbell | None = None
        self.scheduler: Scheduler | None = None
        # Its state and figures: progress.json, the metrics, the lag measured from the source.
        self.report = FlowReport(
            spec,
            self.admins[spec.source],
            metrics,
            positions=lambda: dict(self.positions),
            mapping=lambda: self.mapping,
            tasks=lambda: self.scheduler.stats() if self.scheduler else {},
            silenced=self._cancelled.is_set,
        )
        self.copier = JvmCopier(spark, spec)  # at least once
        self.tasks = FlowTasks(self)  # periodic: MirrorMaker 2's, the lease, the report
        self.batches = Batches(self)  # planned and copied at once
        self.stream = FlowStream(self)  # caught up: copied continuously

    @property
    def flow_dir(self) -> Path:
        return Path(self.spec.flow_dir)

    @property
    def backlog(self) -> Backlog:
        """The source's ends the flow observed, when it was last caught up, its last lag."""
        return self.report.backlog

    # -- lifecycle -----------------------------------------------------------------------
    def prepare(self) -> None:
        """Check both clusters, create the internal topics and load the flow's positions."""
        spec = self.spec
        self.copier.transform_plan()  # both modes: a transform Spark cannot evaluate fails now
        for admin in self.admins.values():
            admin.metadata()
        ensure_flow_topics(spec, self.admins)
        taken = self._take_lease()
        if self._map_reader is None:
            self._map_reader = OffsetMapReader(spec, self.offset_map, missing_ok=True)
        self._map_reader.read_to_end()
        if self.reader is None:
            self.reader = SourceOffsetReader(
                spec.target_consumer,
                spec.target_admin,
                spec.offsets_topic,
                spec.source,
                spec.target,
            )
            self.writer = PositionWriter(
                spec.target_client, spec.offsets_topic, spec.source, spec.target
            )
        assert self.writer is not None
        self.writer.lease = self.lease
        self.mapping = self.remote_topics.prepare()
        if taken and spec.exactly_once:
            # Fence every earlier producer of the flow's partitions first (a job that held the
            # lease may have left transactions open, or committing): the positions read next
            # are then final, and a fenced job can commit nothing more.
            try:
                exactly_once.fence(spec, self.copy_producer_config, self.partitions())
            except MirrorflowError as exc:
                raise ClusterUnreachable(exc.message, exc.hint) from None
        self.positions = self._stored_positions()

    def _take_lease(self) -> bool:
        """Hold the flow's lease on the target (:mod:`mirrorflow.replication.lease`): at most
        one job copies the flow, wherever it runs. Taken at start, waiting for a holder that
        is going away; kept across a cluster's outage (renewed, or lost to another job)."""
        spec = self.spec
        if self.lease is not None and self.lease.held:
            self.lease.renew()
            return False
        FlowLease.ensure_topic(self.admins[spec.target], spec.offsets_replication_factor)
        state_dir = str(Path(spec.flow_dir).parent) if spec.flow_dir else "(none)"
        self.lease = FlowLease(
            spec.flow,
            spec.target,
            spec.target_client,
            spec.target_consumer,
            spec.target_admin,
            Holder.this_process(state_dir),
        )
        self.lease.take(wait_s=LEASE_WAIT_S)
        return True

    def renew_lease(self) -> None:
        """The ``renew-lease`` task: renew the flow's lease, with the positions a running
        stream reached since (in one transaction), unless a batch's positions just renewed it."""
        if self.lease is None or self.stream.write_positions():
            return
        if self.lease.renewal_due():
            self.lease.renew()

    def _stored_positions(self) -> dict[Partition, int]:
        """Where each partition resumes: its stored position, migrated or restarted once."""
        assert self.reader is not None and self.writer is not None
        stored = {tp: last + 1 for tp, last in self.reader.read_to_end().items()}
        restart = jobs.restart_request(self.flow_dir)
        if restart is not None:
            position = restart or self.spec.starting_offsets
            starts = self.source_offsets.starts(self.partitions(), position)
            self.writer.write(starts)
            log.warning(
                "%s: restart requested: %d partitions start over from %s (their earlier "
                "positions are overwritten)",
                self.spec.flow,
                len(starts),
                position,
            )
            (self.flow_dir / jobs.RESTART_FILE).unlink(missing_ok=True)
            return starts
        legacy = self.flow_dir / LEGACY_PROGRESS
        if legacy.is_dir():
            migrated = {tp: o for tp, o in legacy_progress(legacy).items() if tp not in stored}
            if migrated:
                self.writer.write(migrated)
                stored.update(migrated)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            legacy.rename(legacy.with_name(f"{LEGACY_PROGRESS}.migrated-{stamp}"))
            log.warning(
                "%s: moved the positions of %d partitions from %s to %s (once)",
                self.spec.flow,
                len(migrated),
                legacy,
                self.spec.offsets_topic,
            )
        return stored

    def run(self, once: bool = False, stop_file: Path | None = None) -> None:
        """Run until everything available is copied (``once``), :meth:`request_stop` is
        called or ``stop_file`` appears.

        A stop request lets the batch in progress finish, then ends the job. A cluster that
        does not answer (at start or mid-run) is retried with exponential backoff, each retry
        logged; the flow then resumes from its positions. Once it has not answered for
        ``retry_timeout_s`` (``--retry-timeout``; -1: retry forever) the flow fails, in one line
        naming the cluster and what to check. Other errors end the run at once.
        """
        import tenacity

        self._stop_file = stop_file
        self._answered_at = time.monotonic()
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(ClusterUnreachable),
            stop=self._give_up,
            wait=tenacity.wait_exponential_jitter(
                initial=self.spec.retry_backoff_s, max=self.spec.retry_backoff_max_s
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
                f"(--retry-timeout {self.spec.retry_timeout_s:g})",
                exc.hint,
            ) from None
        finally:
            if self.lease is not None:
                self.lease.release()  # the next start of the flow takes it at once

    def _answered(self) -> None:
        """Both clusters answered just now: an outage, if any, is over."""
        self._answered_at = time.monotonic()

    def _unanswered_s(self) -> float:
        return time.monotonic() - self._answered_at

    def tasks_unanswered(self) -> tuple[float, ClusterUnreachable] | None:
        """An idle flow copies nothing, but its heartbeats (and other periodic tasks) still
        reach the target: the failures of one whose cluster has not answered for
        ``retry_timeout_s`` (since when, the last error), else None."""
        assert self.scheduler is not None
        unreachable, timeout = self.scheduler.unreachable(), self.spec.retry_timeout_s
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
        timeout = self.spec.retry_timeout_s
        if timeout < 0:
            return False
        failing = time.monotonic() - max(self._attempt_started, self._answered_at)
        return self._unanswered_s() + state.upcoming_sleep + failing > timeout

    def request_stop(self) -> None:
        """Ask the job to end once its batch in progress is copied (any thread)."""
        self._stop_requested.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop the flow now (a pause or a hold; any thread): no batch starts any more, and the
        batch in flight ends early (see the module). :attr:`quiet` is set once none is in flight:
        nothing more of this job reaches the target for the flow. The flow's thread ends when
        the call it is in returns (one to an unreachable cluster may take its timeout)."""
        with self._batch_lock:
            if self._cancelled.is_set():
                return
            self._cancelled.set()
            self._stop_requested.set()
            batch = self._in_flight
            if batch is None:
                self.quiet.set()
        if self.scheduler is not None:  # no more periodic runs (syncs, checkpoints, progress)
            self.scheduler.stop(wait_s=0)
        if batch is None:
            log.info("%s: cancelled between batches", self.spec.flow)
            return
        context = self.spark.sparkContext
        if self.spec.exactly_once:
            log.info("%s: cancelling batch %s: its transactions are aborted", self.spec.flow, batch)
            context.cancelJobsWithTag(batch)
            watcher = threading.Thread(
                target=self._fence_cancelled, args=(batch,), daemon=True, name=f"fence {batch}"
            )
            watcher.start()
            return
        log.info("%s: cancelling batch %s: it keeps what is acknowledged", self.spec.flow, batch)
        self.copier.java.cancel(batch)

        def cancel_job() -> None:
            if self._in_flight == batch:
                log.info("%s: batch %s still runs: Spark cancels it", self.spec.flow, batch)
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
        context = self.spark.sparkContext
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
        if not self.fence(partitions):  # the target away: quiet once the batch has ended
            return
        log.info(
            "%s: batch %s fenced: none of its transactions can commit now", self.spec.flow, batch
        )
        self.quiet.set()

    def begin_batch(self, partitions: list[Partition]) -> str:
        """The id of a new batch of ``partitions``, in flight until :meth:`_end_batch`;
        raises :class:`BatchCancelled` once the flow is cancelled."""
        with self._batch_lock:
            if self._cancelled.is_set():
                raise BatchCancelled
            self.report.batches += 1
            self._in_flight = f"{self._batch_ids}-{self.report.batches}"
            self._in_flight_partitions = partitions
            return self._in_flight

    def in_flight_partitions(self, partitions: list[Partition]) -> None:
        """The batch in flight (a stream) now copies ``partitions``."""
        with self._batch_lock:
            self._in_flight_partitions = list(partitions)

    def end_batch(self, batch: str) -> None:
        with self._batch_lock:
            self._in_flight = None
            cancelled = self._cancelled.is_set()
            if cancelled:
                self.quiet.set()
        if cancelled or self.batches.stalled:
            self.copier.forget(batch)

    def wait_for_stop(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a stop request: whether one came."""
        return self._stop_requested.wait(seconds)

    def copied_now(self) -> None:
        """Records were just copied: both clusters answer."""
        self._copied_at = time.monotonic()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def stopping(self) -> bool:
        """Whether a stop was requested (checked between batches: a stop ends the job once
        the batch in progress is copied)."""
        if self._stop_file is not None and self._stop_file.exists():
            self._stop_requested.set()
        if os.getppid() != self._parent:  # spark-submit's JVM, and with it Spark, is gone
            log.warning("%s: the spark-submit process that ran this job is gone", self.spec.flow)
            self._stop_requested.set()
        if self._stop_requested.is_set() and not self._stop_logged:
            self._stop_logged = True
            log.info("stop requested: %s ends after batch %d", self.spec.flow, self.report.batches)
        return self._stop_requested.is_set()

    def _run_batches(self, once: bool) -> None:
        from confluent_kafka import KafkaException

        self._attempt_started = time.monotonic()
        if self.stopping():
            return
        self.prepare()
        self._answered()
        self._ship_library()
        spec = self.spec
        self.scheduler = self.tasks.schedule(once)
        self.scheduler.start()
        self.doorbell = Doorbell(spec.source_consumer_client, spec.flow)
        if once:
            self.batches.once_ends = self.source_offsets.ends(self.partitions())
        outage = False  # leaving because a cluster did not answer
        try:
            caught_up = False  # the last batch copied every partition to its planned end
            streamed = False  # the last copy was a stream's, which ended
            while not self.stopping():
                if self.scheduler.error is not None:
                    raise self.scheduler.error
                self._check_tasks_answered()
                if self.lease is not None and not self.lease.fresh():
                    self.lease.renew()  # a job that was frozen learns here it lost the lease
                # Caught up, the doorbell (assigned at the new positions) rings at once for any
                # record that arrived meanwhile: no need to list the partitions' ends again.
                ranges = [] if caught_up else self.batches.plan()
                self._answered()
                if (
                    streamed
                    and ranges
                    and not self.batches.capped
                    and self.stream.starts_again(ranges)
                ):
                    try:
                        self.stream.run(behind=sum(until - start for _tp, start, until in ranges))
                    except BatchCancelled:
                        break
                elif ranges:
                    streamed = False
                    try:
                        self.batches.copy(ranges)
                    except BatchCancelled:
                        break
                    caught_up = not once and not self.batches.capped
                elif once:
                    break
                elif self.spec.continuous and not self.spec.exactly_once:
                    caught_up = False  # the stream ended: plan before copying more
                    streamed = True
                    try:
                        self.stream.run()
                    except BatchCancelled:
                        break
                else:
                    caught_up = False
                    if self.report.state != "IDLE":
                        self.record_state("IDLE")
                    self._wait_for_records()
        except ClusterUnreachable:
            outage = True  # whatever waits for that cluster would only wait the timeouts out
            raise
        finally:
            self.scheduler.stop(wait_s=1.0 if outage else 30.0)
            self.doorbell.close()
            self.report.close()
            for alias, producer in self.producers.items():
                try:
                    producer.flush(1.0 if outage else 10.0)
                except KafkaException as exc:  # the batch's own error, if any, says more
                    log.warning("%s: the producer of %s failed: %s", spec.flow, alias, exc)

    def _wait_for_records(self) -> None:
        """Idle: wait until a record arrives, the topics change, a stop is asked or a task
        failed; plan again at least every :data:`IDLE_REPLAN_S` (a safety net) but never list
        the partitions' ends while nothing moves."""
        assert self.doorbell is not None and self.scheduler is not None
        mapping, since = self.mapping, time.monotonic()
        while not self.doorbell.wait(self.positions, DOORBELL_WAIT_S):
            if self.doorbell.error is not None:  # it cannot tell: list the ends each wait
                return
            self.backlog.caught_up_at = time.time()  # no record past the positions: nothing to copy
            self.backlog.observe(
                self.positions, self.positions, int(self.backlog.caught_up_at * 1000)
            )
            if self.metrics is not None:
                self.metrics.caught_up(self.positions, mapping, self.backlog.caught_up_at)
            if (
                self.stopping()
                or self.mapping is not mapping
                or self.scheduler.error is not None
                or self.tasks_unanswered() is not None
                or time.monotonic() - since > IDLE_REPLAN_S
            ):
                return

    def _sleep_unless_stopped(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stopping():
            time.sleep(0.2)

    def _log_retry(self, state) -> None:
        timeout = self.spec.retry_timeout_s
        log.warning(
            "%s: %s; retrying in %.0f s (attempt %d, %s)",
            self.spec.flow,
            state.outcome.exception(),
            state.next_action.sleep,
            state.attempt_number,
            f"no answer for {self._unanswered_s():.0f}s, the flow fails by {timeout:g}s"
            if timeout >= 0
            else "retrying forever",
        )

    def _ship_library(self) -> None:
        """Ship the mirrorflow package to the executors (a cluster's workers may lack it),
        once per application."""
        global _SHIPPED
        if _SHIPPED:
            return
        _SHIPPED = True
        package = Path(mirror_writer.__file__).parent.parent
        archive = self.flow_dir / "mirrorflow-lib.zip"
        archive.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive, "w") as zf:
            for path in sorted(package.rglob("*.py")):
                zf.write(path, path.relative_to(package.parent))
        self.spark.sparkContext.addPyFile(str(archive))

    # -- the flow's topics and positions -------------------------------------------------------
    def refresh_topics(self) -> None:
        """The scheduler's ``refresh-topics`` task: new topics and partitions join the flow. With
        nothing new the flow's mapping stays the same object: a stream goes on."""
        partitions = dict(self.remote_topics.source_partitions)
        mapping = self.remote_topics.prepare()
        if mapping == self.mapping and self.remote_topics.source_partitions == partitions:
            return
        added = sorted(set(mapping) - set(self.mapping))
        if added:
            log.info("%s: new topics to replicate: %s", self.spec.flow, ", ".join(added))
        self.mapping = mapping

    def partitions(self, mapping: dict[str, str] | None = None) -> list[Partition]:
        """The source partitions of the flow's topics (of ``mapping``, by default the flow's)."""
        counts = self.remote_topics.source_partitions
        topics = self.mapping if mapping is None else mapping
        return [(t, p) for t in sorted(topics) for p in range(counts.get(t, 0))]

    def start_partitions(self, new: list[Partition]) -> None:
        """Positions for partitions the flow has none for: where each starts."""
        if not new:
            return
        starts = self.source_offsets.starts(new)
        self.positions.update(starts)
        if self.spec.starting_offsets != "earliest" or self.spec.starting_offsets_group:
            # Where these start depends on when they were first seen (the end then, a group's
            # offsets then): kept at once, so that a restart resumes there rather than at a
            # later end, skipping what arrived while the job was down.
            assert self.writer is not None
            self.writer.write(starts)

    # -- what batches and streams share -------------------------------------------------------
    def fence(self, partitions: list[Partition]) -> bool:
        """Fence the transactional producers of ``partitions`` on the target; False (logged)
        when the target did not let it."""
        try:
            exactly_once.fence(self.spec, self.copy_producer_config, partitions)
        except MirrorflowError as exc:
            log.warning("%s: %s", self.spec.flow, exc)
            return False
        return True

    def record_state(self, state: str, error: str | None = None) -> None:
        """The flow's state in ``S-T/progress.json`` and its metrics (:class:`FlowReport`)."""
        self.report.record_state(state, error)

    def store_runs(self, runs: dict[Partition, list[Run]]) -> None:
        """Add a batch's runs of copies to the offset map and store them on the target before
        the batch's positions are written (so the map covers every copy below a position)."""
        records = [
            record_of(tp, run)
            for tp, partition_runs in sorted(runs.items())
            for run in self.offset_map.add(tp, partition_runs)
        ]
        if not records:
            return
        topic = self.spec.offset_map_topic
        write_records(
            self.producers[self.spec.target],
            topic,
            records,
            cluster=self.spec.target,
            principal=client_principal(self.spec.target_client),
            what=f"writing the offset map to {topic}",
            hint="the batch is copied again when the flow resumes; check the target cluster",
            error=ClusterUnreachable,
            timeout_s=60,
        )
