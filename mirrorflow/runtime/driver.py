"""The driver of a mirror job: one flow ``S->T``, MirrorMaker 2's semantics, supervised.

:class:`MirrorJob` holds the flow's state (its topics, positions, offset map, lease, clients)
and runs it with Spark's public API only, each part in a module of its own:

1. the flow's start (:mod:`mirrorflow.runtime.flow_start`): its lease taken, and each source
   partition resumes from its position in ``mm2-offsets.<source>.internal`` on the target,
   MirrorMaker 2's own record; a partition without one starts as ``auto.offset.reset`` (or
   ``--starting-offsets``) says;
2. the flow's topics are listed (and their remote topics created or grown) at start and every
   ``refresh.topics.interval.seconds``, as MirrorMaker 2 does;
3. the flow's loop (:mod:`mirrorflow.runtime.flow_loop`, retried across a cluster's outage)
   copies a backlog in **batches** (:mod:`mirrorflow.runtime.batches`): every partition's range
   from its position to its current end, copied at once (on the executors, or in the driver's
   JVM when small; exactly once, in Kafka transactions), then written; caught up, an
   at-least-once flow copies in a **stream** (:mod:`mirrorflow.runtime.streaming`): one
   long-running task in the driver's JVM, whose acknowledged copies are written every second
   and which new topics and partitions join; exactly once (or ``--no-continuous``), the flow
   waits for the next record instead (the doorbell: a long-polling consumer on the driver) and
   copies it in a batch;
4. beside the copying, the job's scheduler runs MirrorMaker 2's periodic tasks
   (:mod:`mirrorflow.runtime.flow_tasks`): heartbeats, checkpoints
   (:mod:`mirrorflow.replication.checkpoint_task`), group offset sync, config and ACL sync, the
   topic refresh, the flow's lease and its progress report;
5. a stop request ends the flow once the batch in progress ends, a pause or a hold at once
   (:mod:`mirrorflow.runtime.flow_stop`).

Every copy's source and target offsets go to the flow's offset map
(:mod:`mirrorflow.replication.offset_map`) before the position moves past them (exactly-once: in
the same transaction); the checkpoint task translates the flow's consumer groups with it,
exactly, and the group offset sync (:mod:`mirrorflow.replication.group_offset_sync`) commits the
results on the target.

A crash anywhere copies the unacknowledged copies again (at-least-once), never loses a record,
and every offset sync stays exact because it pairs a record with the acknowledged offset of its
copy. Heartbeats are written to the target only, as MirrorMaker 2 writes them.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.lease import FlowLease
from mirrorflow.replication.offset_map import OffsetMap, Run, record_of
from mirrorflow.replication.positions import PositionWriter
from mirrorflow.replication.scheduler import Scheduler
from mirrorflow.replication.source_offsets import SourceOffsets
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import (
    ClusterAdmin,
    RemoteTopics,
    client_principal,
    write_records,
)
from mirrorflow.runtime import exactly_once
from mirrorflow.runtime.batches import Batches
from mirrorflow.runtime.copier import JvmCopier
from mirrorflow.runtime.flow_loop import FlowLoop
from mirrorflow.runtime.flow_report import FlowReport
from mirrorflow.runtime.flow_start import FlowStarter
from mirrorflow.runtime.flow_stop import FlowStopper
from mirrorflow.runtime.flow_tasks import FlowTasks
from mirrorflow.runtime.progress import Backlog
from mirrorflow.runtime.streaming import FlowStream

if TYPE_CHECKING:
    from mirrorflow.runtime.metrics import FlowMetrics
    from mirrorflow.runtime.spark_session import JobSpark

log = logging.getLogger("mirrorflow.mirror")

Partition = tuple[str, int]


class MirrorJob:
    """Runs one flow, in batches and streams, until told to stop."""

    def __init__(
        self, spark: JobSpark, spec: MirrorSpec, metrics: FlowMetrics | None = None
    ) -> None:
        self.spark, self.spec = spark, spec
        self.metrics = metrics  # the flow's Prometheus metrics, when the application has them
        self.stopper = FlowStopper(self)  # stop requests, cancellation, the batch in flight
        # Set once the flow is cancelled and no batch is in flight: nothing more reaches the
        # target (see FlowStopper).
        self.quiet = self.stopper.quiet
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
        # Heartbeats, the offset map and checkpoints to the target, offset syncs that the driver
        # writes (exactly once) to theirs: the source's producer only once it does.
        self.producers = clients.ProducersOnDemand(
            {
                spec.source: {**spec.source_client, **producer_base},
                spec.target: {**spec.target_client, **producer_base},
            }
        )
        self.producers.start(spec.target)  # at once: a setting librdkafka refuses fails here
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
        self.offset_map = OffsetMap()
        # Runs added to the offset map and not stored yet (add_runs), by (partition, target
        # offset): the stream's harvests add them, its position writes store them first.
        self._unstored: dict[tuple[Partition, int], Run] = {}
        self._unstored_lock = threading.Lock()
        self.writer: PositionWriter | None = None
        self.lease: FlowLease | None = None  # the flow's lease on the target, while it runs
        self.scheduler: Scheduler | None = None
        # Its state and figures: progress.json, the metrics, the lag measured from the source.
        self.report = FlowReport(
            spec,
            self.admins[spec.source],
            metrics,
            positions=lambda: dict(self.positions),
            mapping=lambda: self.mapping,
            tasks=lambda: self.scheduler.stats() if self.scheduler else {},
            silenced=lambda: self.stopper.cancelled,
            seen=lambda: self.stream.seen_lag(),
        )
        self.copier = JvmCopier(spark, spec)  # at least once
        self.starter = FlowStarter(self)  # its lease and positions, at each start
        self.loop = FlowLoop(self)  # batch, stream or wait, retried across outages
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
        """Check both clusters, create the internal topics and load the flow's positions
        (:meth:`FlowStarter.prepare`)."""
        self.starter.prepare()

    def run(self, once: bool = False, stop_file: Path | None = None) -> None:
        """Run until everything available is copied (``once``), :meth:`request_stop` is
        called or ``stop_file`` appears.

        A stop request lets the batch in progress finish, then ends the job. A cluster that
        does not answer (at start or mid-run) is retried with exponential backoff, each retry
        logged; the flow then resumes from its positions. Once it has not answered for
        ``retry_timeout_s`` (``--retry-timeout``; -1: retry forever) the flow fails, in one line
        naming the cluster and what to check. Other errors end the run at once.
        """
        self.stopper.stop_file = stop_file
        self.loop.run(once)

    def renew_lease(self) -> None:
        """The ``renew-lease`` task: renew the flow's lease, with the positions a running
        stream reached since when ``offset.flush.interval.ms`` has passed (in one transaction),
        unless a batch's positions just renewed it."""
        if self.lease is None or self.stream.write_positions(when_due=True):
            return
        if self.lease.renewal_due():
            self.lease.renew()

    def tasks_unanswered(self) -> tuple[float, ClusterUnreachable] | None:
        """The failures of a periodic task whose cluster has not answered for
        ``retry_timeout_s`` (:meth:`FlowLoop.tasks_unanswered`), else None."""
        return self.loop.tasks_unanswered()

    def copied_now(self) -> None:
        """Records were just copied: both clusters answer."""
        self.loop.copied_now()

    # -- stopping (FlowStopper) ----------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask the job to end once its batch in progress is copied (any thread)."""
        self.stopper.request_stop()

    @property
    def stop_requested(self) -> bool:
        return self.stopper.stop_requested

    def stopping(self) -> bool:
        """Whether a stop was requested (checked between batches)."""
        return self.stopper.stopping()

    def wait_for_stop(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a stop request: whether one came."""
        return self.stopper.wait_for_stop(seconds)

    @property
    def cancelled(self) -> bool:
        return self.stopper.cancelled

    def cancel(self) -> None:
        """Stop the flow now, a pause or a hold (:meth:`FlowStopper.cancel`; any thread):
        :attr:`quiet` is set once nothing more of this job reaches the target."""
        self.stopper.cancel()

    def begin_batch(self, partitions: list[Partition]) -> str:
        """The id of a new batch of ``partitions``, in flight until :meth:`end_batch`;
        raises :class:`~mirrorflow.runtime.batch_errors.BatchCancelled` once cancelled."""
        return self.stopper.begin_batch(partitions)

    def in_flight_partitions(self, partitions: list[Partition]) -> None:
        """The batch in flight (a stream) now copies ``partitions``."""
        self.stopper.in_flight_partitions(partitions)

    def end_batch(self, batch: str) -> None:
        self.stopper.end_batch(batch)

    # -- the flow's topics and positions -------------------------------------------------------
    def refresh_topics(self) -> None:
        """The scheduler's ``refresh-topics`` task: new topics and partitions join the flow, and
        remote topics' changed size limits reach its copies (read again when
        :meth:`FlowStream.limits_due` says so). With nothing new the flow's mapping stays the
        same object: a stream goes on."""
        topics = self.remote_topics
        partitions, limits = dict(topics.source_partitions), dict(topics.max_message_bytes)
        mapping = topics.prepare(limits=self.stream.limits_due())
        changed = {
            remote: limit
            for remote, limit in topics.max_message_bytes.items()
            if limits.get(remote, limit) != limit
        }
        for remote, limit in sorted(changed.items()):
            log.info(
                "%s: %s takes records of at most %d bytes now (max.message.bytes, was %d)",
                self.spec.flow,
                remote,
                limit,
                limits[remote],
            )
        if mapping == self.mapping and topics.source_partitions == partitions and not changed:
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
        """Fence the transactional producers of ``partitions`` (and the driver's) on the
        target; False (logged) when the target did not let it, or when this job's lease is not
        fresh: a job that may have lost it (frozen, cut off) must not fence the producers of
        the job that took it over, which fenced this one's when it started (and this job's
        next batch, once it renews, fences its own leftovers as it starts its producers)."""
        if self.lease is not None and not self.lease.fresh():
            log.warning(
                "%s: its open transactions are left to the job holding the flow's lease "
                "(this one's lease is not fresh: it may have lost it)",
                self.spec.flow,
            )
            return False
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
        self.add_runs(runs)
        self.store_added_runs()

    def add_runs(self, runs: dict[Partition, list[Run]]) -> None:
        """Add runs of copies to the offset map (its translations take them at once), to be
        stored on the target by :meth:`store_added_runs` before positions past them are
        written. A run that grows between two stores is stored once, as it then is."""
        with self._unstored_lock:
            for tp, partition_runs in sorted(runs.items()):
                for run in self.offset_map.add(tp, partition_runs):
                    self._unstored[(tp, run.downstream)] = run

    def store_added_runs(self) -> None:
        """Store the runs added since the last store (:meth:`add_runs`) on the target; those
        added meanwhile stay for the next."""
        with self._unstored_lock:
            storing = dict(self._unstored)
        if not storing:
            return
        topic = self.spec.offset_map_topic
        write_records(
            self.producers[self.spec.target],
            topic,
            [record_of(tp, run) for (tp, _downstream), run in sorted(storing.items())],
            cluster=self.spec.target,
            principal=client_principal(self.spec.target_client),
            what=f"writing the offset map to {topic}",
            hint="the batch is copied again when the flow resumes; check the target cluster",
            error=ClusterUnreachable,
            timeout_s=60,
        )
        with self._unstored_lock:
            for key, run in storing.items():
                if self._unstored.get(key) == run:
                    del self._unstored[key]
