"""The driver of a mirror job: one flow ``S->T``, MirrorMaker 2's semantics, batch by batch.

The driver plans every batch itself, with Spark's public API only:

1. the flow's topics are listed (and their remote topics created or grown) at start and every
   ``refresh.topics.interval.seconds``, as MirrorMaker 2 does;
2. each source partition resumes from its position in ``mm2-offsets.<source>.internal`` on the
   target, MirrorMaker 2's own record; a partition without one starts as ``auto.offset.reset``
   (or ``--starting-offsets``) says;
3. a batch is every partition's range from its position to its current end (at most
   ``--max-records-per-batch`` records in all). When no partition has new records no Spark job
   runs: a long-polling consumer on the driver waits for the next record, so a batch starts
   as soon as one arrives;
4. the ranges are copied, same partition, key, value, headers and timestamp, in order:

   - **at-least-once** (the default): :data:`mirrorflow.runtime.jvm.COPIER_CLASS` copies them on
     the executors with Kafka's Java clients, one task per range, and writes MirrorMaker 2's
     offset syncs from the acknowledgements; once every copy is acknowledged the driver writes
     the batch's positions. A small batch (see :meth:`MirrorJob._runs_locally`) runs the same
     tasks in the driver's JVM instead, without a Spark job, as Spark SQL answers ``collect``
     and ``take`` of a local relation on the driver (``Dataset.isLocal``): a trickle, e.g. the
     heartbeats a mesh replicates each second, then costs no job scheduling;
   - **exactly-once**: Spark's Kafka batch source reads the ranges and
     :func:`mirrorflow.runtime.eos_writer.copy_records` commits each partition's copies and its
     position in one Kafka transaction; the driver then writes the offset syncs.

Every copy's source and target offsets go to the flow's offset map
(:mod:`mirrorflow.replication.offset_map`) before the position moves past them (exactly-once: in
the same transaction); the checkpoint task (:mod:`mirrorflow.replication.checkpoint_task`)
translates the flow's consumer groups with it, exactly, and the group offset sync
(:mod:`mirrorflow.replication.group_offset_sync`) commits the results on the target.

A crash anywhere copies the unacknowledged batch again (at-least-once), never loses a record,
and every offset sync stays exact because it pairs a record with the acknowledged offset of its
copy. A stop request (SIGTERM, SIGINT, the stop file) takes effect when the batch in progress
ends. A pause or a hold (a failover) stops the flow at once, whatever its source is doing
(:meth:`MirrorJob.cancel`): no batch starts any more, and the batch in flight ends early. At
least once, its ranges stop reading and return what they copied, and the positions move to the
last acknowledged copy (tasks in another JVM, with a cluster master, are cancelled by Spark
instead: what they copied is copied again when the flow resumes). Exactly once, its Spark job is
cancelled and its partitions' open transactions are aborted (fenced), so nothing of it becomes
visible. Heartbeats are written to the target only, as MirrorMaker 2 writes them.

A mirrorflow 0.x job kept at-least-once positions in a Spark streaming checkpoint
(``S-T/checkpoint``); they are moved into the offsets topic once, at the first start.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.mm2.formats import OffsetSync
from mirrorflow.replication import clients, lag
from mirrorflow.replication.checkpoint_stores import OffsetMapReader, expire_offset_map
from mirrorflow.replication.checkpoint_task import GroupCheckpoints
from mirrorflow.replication.config_sync import AclSync, TopicSync
from mirrorflow.replication.group_offset_sync import GroupOffsetSync
from mirrorflow.replication.heartbeats import HeartbeatEmitter
from mirrorflow.replication.lease import RENEW_S, FlowLease, Holder
from mirrorflow.replication.offset_map import OffsetMap, Run, record_of
from mirrorflow.replication.positions import PositionWriter, SourceOffsetReader, legacy_progress
from mirrorflow.replication.scheduler import Scheduler, TaskFailed
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
from mirrorflow.runtime import exactly_once, jobs, trend
from mirrorflow.runtime.batch_errors import batch_error
from mirrorflow.runtime.copier import (
    SOURCE_STALL_S,
    STREAM_OPEN,
    CopierResult,
    CopyStream,
    JvmCopier,
)
from mirrorflow.runtime.doorbell import Doorbell
from mirrorflow.runtime.flow_report import FlowReport
from mirrorflow.runtime.metrics import Copied
from mirrorflow.runtime.progress import Backlog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from mirrorflow.runtime.metrics import FlowMetrics

log = logging.getLogger("mirrorflow.mirror")

Partition = tuple[str, int]
LEGACY_PROGRESS = "checkpoint"  # mirrorflow 0.x: Spark's streaming checkpoint of the flow
DOORBELL_WAIT_S = 0.5
IDLE_REPLAN_S = 30.0  # an idle flow lists its partitions' ends this often, doorbell or not
REPORT_PROGRESS_S = 10.0  # progress.json is rewritten this often, busy or idle (liveness)
LOCAL_BATCH_MAX_BYTES = 8 << 20  # a local batch's records times the flow's mean record size
# A cancelled at-least-once batch whose tasks have not returned by then (tasks in other JVMs,
# which the copier's cancellation does not reach) is cancelled by Spark.
CANCEL_JOB_AFTER_S = 3.0
# A continuous flow (the at-least-once default) takes what its stream acknowledged, writes it
# (offset map, then positions) and updates its figures this often.
STREAM_COMMIT_S = 1.0
# A stream that ended (new topics or partitions to copy) starts again at once, catching the new
# partitions up itself, when they are this far behind at most: no Spark job for them, which in
# an application of many flows waits for the executors' few slots behind the others' batches.
STREAM_AGAIN_MAX_RECORDS = 50_000
# How long a start waits for another job's lease of the flow to be released or to expire (a job
# that is stopping, or whose host died) before it fails naming that job.
LEASE_WAIT_S = 14.0
_SHIPPED = False  # the mirrorflow package went to the executors (once per application)


class BatchCancelled(Exception):
    """The flow was cancelled (paused or held) before or while its batch ran."""


class MirrorJob:
    """Runs one flow, batch after batch, until told to stop."""

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
        self.checkpoints: GroupCheckpoints | None = None
        self.group_sync: GroupOffsetSync | None = None
        self.writer: PositionWriter | None = None
        self.lease: FlowLease | None = None  # the flow's lease on the target, while it runs
        self.doorbell: Doorbell | None = None
        self.scheduler: Scheduler | None = None
        self._once_ends: dict[Partition, int] | None = None
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
        self._stalled: list[tuple[Partition, int]] = []  # ranges the source left unfinished
        self._capped = False  # the last plan left records for the next batch

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
                exactly_once.fence(spec, self.copy_producer_config, self._partitions())
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

    def _renew_lease(self) -> None:
        if self.lease is not None:
            self.lease.renew()

    def _stored_positions(self) -> dict[Partition, int]:
        """Where each partition resumes: its stored position, migrated or restarted once."""
        assert self.reader is not None and self.writer is not None
        stored = {tp: last + 1 for tp, last in self.reader.read_to_end().items()}
        restart = jobs.restart_request(self.flow_dir)
        if restart is not None:
            position = restart or self.spec.starting_offsets
            starts = self.source_offsets.starts(self._partitions(), position)
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

    def _tasks_unanswered(self) -> tuple[float, ClusterUnreachable] | None:
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
        """Fail the flow as a batch's error would when :meth:`_tasks_unanswered` says so."""
        unanswered = self._tasks_unanswered()
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
        if not self._fence(partitions):  # the target away: quiet once the batch has ended
            return
        log.info(
            "%s: batch %s fenced: none of its transactions can commit now", self.spec.flow, batch
        )
        self.quiet.set()

    def _begin_batch(self, partitions: list[Partition]) -> str:
        """The id of a new batch of ``partitions``, in flight until :meth:`_end_batch`;
        raises :class:`BatchCancelled` once the flow is cancelled."""
        with self._batch_lock:
            if self._cancelled.is_set():
                raise BatchCancelled
            self.report.batches += 1
            self._in_flight = f"{self._batch_ids}-{self.report.batches}"
            self._in_flight_partitions = partitions
            return self._in_flight

    def _end_batch(self, batch: str) -> None:
        with self._batch_lock:
            self._in_flight = None
            cancelled = self._cancelled.is_set()
            if cancelled:
                self.quiet.set()
        if cancelled or self._stalled:
            self.copier.forget(batch)

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
        self.scheduler = Scheduler(spec.flow)
        self.scheduler.add("renew-lease", RENEW_S, self._renew_lease, alone=True)
        if spec.emit_heartbeats:
            heartbeats = HeartbeatEmitter(
                spec.source,
                spec.target,
                {spec.target: self.producers[spec.target]},
                spec.heartbeats_topic,
                {spec.target: client_principal(spec.target_client)},
            )
            beat = self._beat(heartbeats)
            self.scheduler.run_now(
                self.scheduler.add("heartbeats", spec.heartbeats_interval_s, beat, alone=True)
            )
        if spec.refresh_topics_enabled and not once:
            self.scheduler.add(
                "refresh-topics", spec.refresh_topics_interval_s, self._refresh_topics
            )
        if not once:  # runs whose records retention removed from the source
            self.scheduler.add(
                "expire-offset-map", spec.refresh_topics_interval_s, self._expire_offset_map
            )
        # Config and ACL sync run at start, then every interval, as in MirrorMaker 2: changes
        # made while no job ran reach the target before the first batch.
        for enabled, name, interval, sync in (
            (
                spec.sync_configs_enabled,
                "sync-topic-configs",
                spec.sync_configs_interval_s,
                TopicSync,
            ),
            (spec.sync_acls_enabled, "sync-topic-acls", spec.sync_acls_interval_s, AclSync),
        ):
            if enabled and not once:
                run = sync(spec, self.admins).scheduled_run
                self.scheduler.run_now(self.scheduler.add(name, interval, run))
        if spec.emit_checkpoints_enabled and not once:
            self._schedule_checkpoints()
        if spec.flow_dir:  # progress.json fresh even during a long batch: the flow is alive
            report = trend.sampled(self, self.report.report_progress, REPORT_PROGRESS_S)
            self.scheduler.add("report-progress", REPORT_PROGRESS_S, report, alone=True)
            # The lag as the source says it is, busy or idle, the target away or not.
            self.scheduler.add(
                "measure-lag", lag.MEASURE_EVERY_S, self.report.measure_lag, alone=True
            )
        self.scheduler.start()
        self.doorbell = Doorbell(spec.source_consumer_client, spec.flow)
        if once:
            self._once_ends = self.source_offsets.ends(self._partitions())
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
                ranges = [] if caught_up else self._plan()
                self._answered()
                if streamed and ranges and self._streams_on(ranges):
                    try:
                        self._stream(behind=sum(until - start for _tp, start, until in ranges))
                    except BatchCancelled:
                        break
                elif ranges:
                    streamed = False
                    try:
                        self._copy(ranges)
                    except BatchCancelled:
                        break
                    caught_up = not once and not self._capped
                elif once:
                    break
                elif self.spec.continuous and not self.spec.exactly_once:
                    caught_up = False  # the stream ended: plan before copying more
                    streamed = True
                    try:
                        self._stream()
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

    def _beat(self, heartbeats: HeartbeatEmitter) -> Callable[[], None]:
        """The heartbeat task: one heartbeat, its acknowledgement noted in the metrics."""
        metrics = self.metrics
        if metrics is None:
            return heartbeats.beat

        def beat() -> None:
            heartbeats.beat()
            metrics.heartbeat()

        return beat

    def _expire_offset_map(self) -> None:
        try:
            dropped = expire_offset_map(
                self.spec,
                self.admins[self.spec.source],
                self.offset_map,
                self.producers[self.spec.target],
            )
        except MirrorflowError as exc:  # the copying notices an unreachable cluster itself
            raise TaskFailed(str(exc)) from None
        if dropped:
            log.info(
                "%s: %d runs of the offset map expired with the source's records",
                self.spec.flow,
                dropped,
            )

    def _schedule_checkpoints(self) -> None:
        """MirrorMaker 2's checkpoint task, inside the job: checkpoints every
        ``emit.checkpoints.interval.seconds``, the group list every
        ``refresh.groups.interval.seconds``, and, if enabled, the group offset sync."""
        assert self.scheduler is not None
        spec = self.spec
        if self.checkpoints is None:
            self.checkpoints = GroupCheckpoints(
                spec,
                self.admins,
                self.offset_map,
                lambda: dict(self.positions),
                self.producers[spec.target],
                on_written=self.metrics.checkpoints if self.metrics is not None else None,
            )
        self.scheduler.add(
            "emit-checkpoints", spec.emit_checkpoints_interval_s, self.checkpoints.scheduled_emit
        )
        if spec.refresh_groups_enabled:
            self.scheduler.add(
                "refresh-groups", spec.refresh_groups_interval_s, self.checkpoints.scheduled_refresh
            )
        if spec.sync_group_offsets_enabled:
            if self.group_sync is None:
                self.group_sync = GroupOffsetSync(
                    spec, self.admins, self.checkpoints.snapshot, self.checkpoints.still_on_source
                )
            self.scheduler.add(
                "sync-group-offsets",
                spec.sync_group_offsets_interval_s,
                self.group_sync.scheduled_run,
            )

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
                or self._tasks_unanswered() is not None
                or time.monotonic() - since > IDLE_REPLAN_S
            ):
                return

    def _stream(self, behind: int = 0) -> None:
        """Caught up (at least once, unless ``--no-continuous``): copy continuously in the
        driver's JVM (:class:`~mirrorflow.runtime.copier.CopyStream`) until a stop or pause, a
        topic leaving the flow, or a failed task (new topics and partitions join it as they
        appear: :meth:`_extend`); every :data:`STREAM_COMMIT_S`, what the
        stream acknowledged is written as a batch's would be (the offset map, then the
        positions). Its tasks wait for records themselves: no doorbell, no listing of the ends.
        ``behind``: the records it starts behind (a stream started again, :meth:`_streams_on`)."""
        assert self.scheduler is not None
        mapping = self.mapping
        partitions = [tp for tp in self._partitions() if tp in self.positions]
        batch = self._begin_batch(partitions)
        error: str | None = None
        try:
            stream = CopyStream(
                self.copier.java,
                batch,
                partitions,
                [self.positions[tp] for tp in partitions],
                self.copier.settings(mapping, self.remote_topics.max_message_bytes),
                self._stream_allowance_ms(),
            )
            if behind:
                log.info(
                    "%s: copying continuously from %d partitions, %d records behind: the "
                    "stream catches them up",
                    self.spec.flow,
                    len(partitions),
                    behind,
                )
            else:
                log.info(
                    "%s: caught up; copying continuously from %d partitions",
                    self.spec.flow,
                    len(partitions),
                )
            try:
                while not self._stop_requested.wait(STREAM_COMMIT_S):
                    try:
                        harvested = stream.harvest()
                    except Exception as exc:  # py4j's error: a task failed (see end())
                        error = str(exc)
                        break
                    self._commit_stream(harvested, stream.partitions, mapping)
                    stream.allow(self._stream_allowance_ms())
                    if self.mapping is not mapping:
                        extended = self._extend(stream, mapping)
                        if extended is None:
                            break
                        mapping = extended
                    if (
                        self.stopping()
                        or self.scheduler.error is not None
                        or self._tasks_unanswered() is not None
                    ):
                        break
            finally:
                harvested, failed = stream.end()
                error = failed or error
                self._commit_stream(harvested, stream.partitions, mapping)
        finally:
            self._end_batch(batch)
        if error is not None:
            raise batch_error(self.spec, error)
        if self._cancelled.is_set():
            raise BatchCancelled

    def _extend(self, stream: CopyStream, mapping: dict[str, str]) -> dict[str, str] | None:
        """The flow's topics changed (``mapping`` was theirs) while ``stream`` ran: new topics
        and partitions join it, from where each starts, and it goes on; returns the mapping it
        now copies. None when it cannot take the change (a topic left the flow or changed its
        remote, or a new remote topic takes larger records than its producer sends): then it
        ends, and the flow plans again."""
        now = self.mapping
        if any(now.get(source) != remote for source, remote in mapping.items()):
            return None
        streamed = set(stream.partitions)
        new = [tp for tp in self._partitions(now) if tp not in streamed]
        if not new:
            return now
        self._start([tp for tp in new if tp not in self.positions])
        settings = self.copier.settings(now, self.remote_topics.max_message_bytes)
        if not stream.extend(new, [self.positions[tp] for tp in new], settings):
            return None
        with self._batch_lock:
            self._in_flight_partitions = list(stream.partitions)
        log.info(
            "%s: %d new partitions join the stream (%s)",
            self.spec.flow,
            len(new),
            ", ".join(sorted({topic for topic, _p in new})),
        )
        return now

    def _streams_on(self, ranges: list[tuple[Partition, int, int]]) -> bool:
        """Whether a stream that just ended starts again rather than this batch: a continuous
        flow whose backlog (new partitions, what arrived meanwhile) is small."""
        return (
            self.spec.continuous
            and not self.spec.exactly_once
            and self._once_ends is None
            and not self._capped
            and sum(until - start for _tp, start, until in ranges) <= STREAM_AGAIN_MAX_RECORDS
        )

    def _stream_allowance_ms(self) -> int:
        """Until when (epoch ms) a stream may copy: while the flow's lease is fresh, renewed
        first if it is not (:class:`~mirrorflow.replication.lease.LeaseLost` if another job
        took it). A job frozen past it (SIGSTOP, a long pause) finds on waking that its stream
        may not copy any more, and copies nothing until it has renewed the lease here."""
        if self.lease is None:
            return STREAM_OPEN
        if not self.lease.fresh():
            self.lease.renew()
        return int(self.lease.fresh_until() * 1000)

    def _commit_stream(
        self, harvested: CopierResult, partitions: list[Partition], mapping: dict[str, str]
    ) -> None:
        """Write what a stream acknowledged since its last harvest: its runs to the offset map,
        then the positions it reached; its figures to the metrics and ``progress.json``."""
        assert self.writer is not None
        now = time.time()
        self._store_runs(harvested.runs)
        moved = {
            tp: reached
            for tp, reached in zip(partitions, harvested.reached, strict=True)
            if reached > self.positions.get(tp, reached)
        }
        if moved:
            self.writer.write(moved)
            self.positions.update(moved)
        self.report.copied[0] += harvested.records
        self.report.copied[1] += harvested.bytes
        ends = {
            tp: max(end, self.positions[tp])
            for tp, end in zip(partitions, harvested.ends_seen, strict=True)
            if end >= 0
        }
        if ends:
            self.backlog.planned_ends.update(ends)
            self.backlog.plan_at = now
            self.backlog.observe(ends, self.positions, int(now * 1000))
        caught_up = harvested.caught_up_ms
        # Every partition's task found nothing new with its copies acknowledged: when the last
        # of them did, everything then on the source was copied.
        idle = (
            bool(caught_up)
            and min(caught_up) >= 0
            and all(self.positions[tp] >= end for tp, end in ends.items())
        )
        if idle:
            self.backlog.caught_up_at = max(self.backlog.caught_up_at or 0.0, min(caught_up) / 1000)
        if harvested.records:
            self._copied_at = time.monotonic()
            self.report.last_batch_at = now
            self.report.last_batch_s = STREAM_COMMIT_S
            if self.metrics is not None:
                self.metrics.batch(harvested.copied, self.positions, ends, mapping, now)
            if self.report.state != "RUNNING":
                self.record_state("RUNNING")
            return
        if self.metrics is not None:
            if idle and self.backlog.caught_up_at is not None:
                self.metrics.caught_up(self.positions, mapping, self.backlog.caught_up_at)
            else:
                self.metrics.lag(self.positions, ends, mapping, now)
        if idle and self.report.state != "IDLE":  # else copies are still unacknowledged: not idle
            self.record_state("IDLE")

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

    # -- planning ------------------------------------------------------------------------------
    def _refresh_topics(self) -> None:
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

    def _partitions(self, mapping: dict[str, str] | None = None) -> list[Partition]:
        """The source partitions of the flow's topics (of ``mapping``, by default the flow's)."""
        counts = self.remote_topics.source_partitions
        topics = self.mapping if mapping is None else mapping
        return [(t, p) for t in sorted(topics) for p in range(counts.get(t, 0))]

    def _start(self, new: list[Partition]) -> None:
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

    def _plan(self) -> list[tuple[Partition, int, int]]:
        """The next batch: (partition, from, until) with records, at most the batch's size."""
        plan_at = time.time()
        partitions = self._partitions()
        self._start([tp for tp in partitions if tp not in self.positions])
        ends = (
            self._once_ends if self._once_ends is not None else self.source_offsets.ends(partitions)
        )
        self.backlog.planned_ends, self.backlog.plan_at = ends, plan_at
        self.backlog.observe(ends, self.positions, int(plan_at * 1000))
        pending = {}
        for tp in partitions:
            end, position = ends.get(tp, 0), self.positions[tp]
            if position > end:
                restart = self.source_offsets.starts([tp])[tp]
                log.warning(
                    "%s: %s-%d ends at %d, before its position %d (topic re-created or "
                    "truncated); copying from %d",
                    self.spec.flow,
                    tp[0],
                    tp[1],
                    end,
                    position,
                    restart,
                )
                self.positions[tp] = position = restart
            if end > position:
                pending[tp] = end - position
        if self.metrics is not None:
            self.metrics.lag(self.positions, ends, self.mapping, plan_at)
        total, cap = sum(pending.values()), self.spec.max_records_per_batch
        self._capped = total > cap
        if not total:
            self.backlog.caught_up_at = plan_at
        ranges = []
        for tp, count in sorted(pending.items()):
            take = count if total <= cap else max(1, count * cap // total)
            ranges.append((tp, self.positions[tp], self.positions[tp] + take))
        return ranges

    # -- one batch -----------------------------------------------------------------------------
    def _copy(self, ranges: list[tuple[Partition, int, int]]) -> None:
        """Copy one batch (its ranges), write its positions and record it; a cancellation
        (:meth:`cancel`) ends it early (:class:`BatchCancelled`, or, at least once, the
        positions of what was copied)."""
        batch = self._begin_batch([tp for tp, _start, _until in ranges])
        context = self.spark.sparkContext
        context.addJobTag(batch)
        try:
            self._copy_batch(batch, ranges)
        finally:
            context.removeJobTag(batch)
            self._end_batch(batch)

    def _copy_batch(self, batch: str, ranges: list[tuple[Partition, int, int]]) -> None:
        mapping = self.mapping
        if self.report.state != "RUNNING":  # copying from now on, not idle (what the page says)
            self.record_state("RUNNING")
        started = time.monotonic()
        planned = sum(until - start for _tp, start, until in ranges)
        if self.spec.exactly_once:
            try:
                records, size, syncs, copied = self._copy_in_transactions(ranges, mapping)
            except Exception as exc:  # Spark's error: its text holds the copy's message
                # A killed or failed task may leave its transaction open, which would hold
                # back the target partition's read_committed consumers: abort them now.
                self._abort_transactions(batch, [tp for tp, _s, _u in ranges])
                if self._cancelled.is_set():
                    raise BatchCancelled from None
                if isinstance(exc, MirrorflowError):
                    raise
                raise batch_error(self.spec, exc) from None
            done = f"{records} records, {size} bytes, {syncs} offset syncs"
        else:
            local = self._runs_locally(ranges)
            self._stalled = []
            try:
                result = self.copier.copy(
                    batch,
                    ranges,
                    self.copier.settings(mapping, self.remote_topics.max_message_bytes),
                    local,
                    f"mirror {self.spec.flow} batch {self.report.batches}",
                )
            except MirrorflowError:
                if self._cancelled.is_set():  # cancelled by Spark: copied again on resume
                    log.warning(
                        "%s: batch %d cancelled by Spark: what it copied is copied again when "
                        "the flow resumes",
                        self.spec.flow,
                        self.report.batches,
                    )
                    raise BatchCancelled from None
                raise
            self._stalled = result.stalled
            records, size, runs, copied = result.records, result.bytes, result.runs, result.copied
            reached = result.reached
            ranges = [(tp, start, reached[i]) for i, (tp, start, _until) in enumerate(ranges)]
            done = f"{records} records, {size} bytes" + (" (in the driver)" if local else "")
            self.report.local_batches += local
            self._store_runs(runs)
            assert self.writer is not None
            self.writer.write({tp: until for tp, start, until in ranges if until > start})
            if self._stalled and not self._cancelled.is_set():
                (topic, partition), offset = self._stalled[0]
                for tp, _start, until in ranges:
                    self.positions[tp] = until
                raise ClusterUnreachable(
                    f"cluster {self.spec.source} did not answer: no records of "
                    f"{topic}-{partition} from offset {offset} within {SOURCE_STALL_S:.0f}s "
                    "(what was copied is kept)",
                    f"check that {self.spec.source} is up; retrying",
                )
        for tp, _start, until in ranges:
            self.positions[tp] = until
        self.report.copied[0] += records
        self.report.copied[1] += size
        if self.metrics is not None:
            self.metrics.batch(
                copied,
                self.positions,
                self.backlog.planned_ends,
                mapping,
                self.backlog.plan_at,
            )
        elapsed = time.monotonic() - started
        cut = sum(until - start for _tp, start, until in ranges) < planned
        log.info(
            "%s batch %d: %s from %d partitions in %.3f s%s",
            self.spec.flow,
            self.report.batches,
            done,
            len(ranges),
            elapsed,
            " (cancelled: the flow was paused; positions at its last acknowledged copies)"
            if cut
            else "",
        )
        self.report.last_batch_s, self.report.last_batch_at = elapsed, time.time()
        self._copied_at = time.monotonic()
        if not self._capped and not cut:  # everything on the source at the plan is copied
            self.backlog.caught_up_at = self.backlog.plan_at
        self.record_state("RUNNING")

    def _abort_transactions(self, batch: str, partitions: list[Partition]) -> None:
        """An exactly-once batch that failed or was cancelled: fence its partitions'
        transactional producers, which aborts their open transactions (a worker killed
        mid-transaction leaves one open, which would hold back every read_committed consumer of
        the target partition until the transaction timeout). A transaction committed before
        stays committed, with its positions: the flow resumes after it."""
        if not self._fence(partitions):
            return
        log.info(
            "%s: batch %d %s: the open transactions of its %d partitions are aborted; nothing "
            "of it is visible but what it committed",
            self.spec.flow,
            self.report.batches,
            "cancelled (the flow was paused)" if self._cancelled.is_set() else "failed",
            len(partitions),
        )

    def _fence(self, partitions: list[Partition]) -> bool:
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

    def _runs_locally(self, ranges: list[tuple[Partition, int, int]]) -> bool:
        """Whether an at-least-once batch is small enough to copy in the driver's JVM: at most
        ``local_batch_max_records`` records (0: never), and at most
        :data:`LOCAL_BATCH_MAX_BYTES` by the flow's mean record size so far."""
        limit = self.spec.local_batch_max_records
        records = sum(until - start for _tp, start, until in ranges)
        if limit <= 0 or records > limit:
            return False
        mean = self.report.copied[1] / self.report.copied[0] if self.report.copied[0] else 0
        return records * mean <= LOCAL_BATCH_MAX_BYTES

    def _store_runs(self, runs: dict[Partition, list[Run]]) -> None:
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

    def _copy_in_transactions(
        self, ranges: list[tuple[Partition, int, int]], mapping: dict[str, str]
    ) -> tuple[int, int, int, dict[Partition, Copied]]:
        """Exactly-once: the Python workers copy each source partition in a transaction that
        also commits its position and its runs in the offset map; then the offset syncs go
        out. Returns (records, bytes, syncs, what was copied per partition)."""
        result = exactly_once.copy_batch(
            self.spark,
            self.spec,
            ranges,
            mapping=mapping,
            producer_config=self.copy_producer_config,
            max_message_bytes=dict(self.remote_topics.max_message_bytes),
            positions=self.positions,
            offset_map=self.offset_map,
            lease_holder=asdict(self.lease.holder) if self.lease is not None else None,
        )
        if self.spec.emit_offset_syncs and result.syncs:
            self._write_offset_syncs(result.syncs)
        return result.records, result.bytes, len(result.syncs), result.copied

    def _write_offset_syncs(self, syncs: list[OffsetSync]) -> None:
        spec = self.spec
        cluster, topic = spec.offset_syncs_cluster, spec.offset_syncs_topic
        config = spec.source_client if cluster == spec.source else spec.target_client
        write_records(
            self.producers[cluster],
            topic,
            [(sync.key(), sync.value()) for sync in syncs],
            cluster=cluster,
            principal=client_principal(config),
            what=f"writing offset syncs to {topic}",
            hint="the batch will be replayed when the job restarts; check the cluster",
            timeout_s=60,
        )
