"""A flow's batches: each partition's range from its position to the source's end, planned by
the driver and copied at once, then written.

:meth:`Batches.plan` lists the source's ends and cuts the ranges (at most
``--max-records-per-batch`` records in all, shared in proportion). :meth:`Batches.copy` copies
them:

- **at least once** (the default): the JVM copier (:class:`~mirrorflow.runtime.copier.JvmCopier`)
  copies them on the executors with Kafka's Java clients, one task per range, and writes
  MirrorMaker 2's offset syncs from the acknowledgements; once every copy is acknowledged the
  batch's runs go to the offset map, then its positions are written. A small batch
  (:meth:`Batches.runs_locally`) runs the same tasks in the driver's JVM, without a Spark job, as
  Spark SQL answers ``collect`` of a local relation on the driver (``Dataset.isLocal``);
- **exactly once**: Spark's Kafka batch source reads the ranges and
  :func:`mirrorflow.runtime.eos_writer.copy_records` commits each partition's copies, its runs of
  the offset map and its position in one Kafka transaction; the offset syncs follow. A small
  batch (the same rule) is read by the driver's :class:`~mirrorflow.runtime.range_reader.
  RangeReader` and copied by the same writer in the driver's Python, without a Spark job, in
  one transaction for all its partitions (not for a flow with record transforms, which Spark
  applies). Caught up, such a batch goes on taking the records that arrive, each produced into
  its open transaction as it is read, until the transaction is due to commit
  (:meth:`Batches.commit_due`: ``transaction_interval_ms`` after the last commit).

A batch that fails or is cancelled keeps what it committed (exactly once, its open transactions
are aborted); a source that stops answering mid-batch leaves its ranges unfinished
(``stalled``), what was copied kept.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.mm2.formats import OffsetSync
from mirrorflow.replication.topics import client_principal, write_records
from mirrorflow.runtime import exactly_once
from mirrorflow.runtime.batch_errors import BatchCancelled, batch_error
from mirrorflow.runtime.copier import SOURCE_STALL_S
from mirrorflow.runtime.metrics import Copied

if TYPE_CHECKING:
    from mirrorflow.runtime.driver import MirrorJob

log = logging.getLogger("mirrorflow.mirror")

Partition = tuple[str, int]
LOCAL_BATCH_MAX_BYTES = 8 << 20  # a local batch's records times the flow's mean record size
EOS_LOCAL_BATCH_MAX_BYTES = 64 << 20  # likewise, exactly once
# Exactly once, caught up: the longest a batch in the driver takes what arrives before its commit
# is due (an interval longer than this waits the rest before the batch starts), which keeps a
# transaction's records in the driver few and the transaction short, under the producer's
# transaction.timeout.ms.
FOLLOW_MAX_S = 1.0


class Batches:
    """The batches of ``job``'s flow: planned, copied and written one at a time."""

    def __init__(self, job: MirrorJob) -> None:
        self.job = job
        self.capped = False  # the last plan left records for the next batch
        self.stalled: list[tuple[Partition, int]] = []  # ranges the source left unfinished
        # A run to the end (``--once``): the source's ends at its start, planned to and no further.
        self.once_ends: dict[Partition, int] | None = None
        # What small exactly-once batches keep from one to the next (made at the first)
        self._driver: exactly_once.DriverCopy | None = None
        # Exactly once: when the last batch's transaction committed (monotonic; a batch that
        # took what arrived until its commit was due: when it stopped taking them)
        self.committed_at = float("-inf")

    @property
    def follow(self) -> bool:
        """Whether the flow's caught-up batches take the records that arrive until their
        commit is due: exactly once with an interval boundary (not ``transaction.boundary =
        poll``), in the driver (no record transforms, which Spark applies; driver batches not
        turned off)."""
        spec = self.job.spec
        return (
            spec.exactly_once
            and spec.transaction_interval_ms > 0
            and spec.transform is None
            and spec.local_batch_limit > 0
        )

    def commit_due(self) -> float | None:
        """Exactly once, caught up (the last plan took every record, not ``--once``): when the
        next batch's transaction may commit (monotonic), ``transaction_interval_ms`` after the
        last; None when it commits as soon as it is copied (a backlog, ``--once``,
        ``transaction.boundary = poll``, at least once)."""
        spec = self.job.spec
        interval = spec.transaction_interval_ms / 1000
        if not spec.exactly_once or not interval or self.capped or self.once_ends is not None:
            return None
        return self.committed_at + interval

    def close(self) -> None:
        """Close what the batches keep between them (the driver's reader of the source, its
        producers)."""
        if self._driver is not None:
            self._driver.drop_producers()
            self._driver.reader.close()
            self._driver = None

    def plan(self) -> list[tuple[Partition, int, int]]:
        """The next batch: (partition, from, until) with records, at most the batch's size."""
        job = self.job
        plan_at = time.time()
        partitions = job.partitions()
        job.start_partitions([tp for tp in partitions if tp not in job.positions])
        ends = self.once_ends if self.once_ends is not None else job.source_offsets.ends(partitions)
        job.backlog.planned_ends, job.backlog.plan_at = ends, plan_at
        job.backlog.observe(ends, job.positions, int(plan_at * 1000))
        pending = {}
        for tp in partitions:
            end, position = ends.get(tp, 0), job.positions[tp]
            if position > end:
                restart = job.source_offsets.starts([tp])[tp]
                log.warning(
                    "%s: %s-%d ends at %d, before its position %d (topic re-created or "
                    "truncated); copying from %d",
                    job.spec.flow,
                    tp[0],
                    tp[1],
                    end,
                    position,
                    restart,
                )
                job.positions[tp] = position = restart
            if end > position:
                pending[tp] = end - position
        if job.metrics is not None:
            job.metrics.lag(job.positions, ends, job.mapping, plan_at)
        total, cap = sum(pending.values()), job.spec.max_records_per_batch
        self.capped = total > cap
        if not total:
            job.backlog.caught_up_at = plan_at
        ranges = []
        for tp, count in sorted(pending.items()):
            take = count if total <= cap else max(1, count * cap // total)
            ranges.append((tp, job.positions[tp], job.positions[tp] + take))
        return ranges

    def copy(self, ranges: list[tuple[Partition, int, int]]) -> None:
        """Copy one batch (its ranges), write its positions and record it; a cancellation
        (:meth:`~mirrorflow.runtime.driver.MirrorJob.cancel`) ends it early
        (:class:`~mirrorflow.runtime.batch_errors.BatchCancelled`, or, at least once, the
        positions of what was copied)."""
        job, spec = self.job, self.job.spec
        local = self.runs_locally(ranges) and not (spec.exactly_once and spec.transform)
        batch = job.begin_batch([tp for tp, _start, _until in ranges])
        # A Spark job's tag, which its cancellation names (a batch in the driver has no job:
        # two calls into the JVM fewer, ~2 ms of a small exactly-once batch's ~25).
        context = None if local else job.spark.context
        if context is not None:
            context.addJobTag(batch)
        try:
            self._copy(batch, ranges, local)
        finally:
            if context is not None:
                context.removeJobTag(batch)
            job.end_batch(batch)

    def _copy(self, batch: str, ranges: list[tuple[Partition, int, int]], local: bool) -> None:
        job, spec, report = self.job, self.job.spec, self.job.report
        mapping = job.mapping
        if report.state != "RUNNING":  # copying from now on, not idle (what the page says)
            job.record_state("RUNNING")
        started = time.monotonic()
        planned = sum(until - start for _tp, start, until in ranges)
        if spec.exactly_once:
            try:
                records, size, syncs, copied, followed = self._copy_in_transactions(
                    ranges, mapping, local
                )
            except Exception as exc:  # Spark's error: its text holds the copy's message
                # A killed or failed task may leave its transaction open, which would hold
                # back the target partition's read_committed consumers: abort them now.
                self._abort_transactions([tp for tp, _s, _u in ranges])
                if job.cancelled:
                    raise BatchCancelled from None
                if isinstance(exc, MirrorflowError):
                    raise
                raise batch_error(spec, exc) from None
            done = f"{records} records, {size} bytes, {syncs} offset syncs" + (
                " (in the driver)" if local else ""
            )
            report.local_batches += local
            planned_until = {tp: until for tp, _start, until in ranges}
            beyond = {tp: r for tp, r in followed.items() if r > planned_until.get(tp, 0)}
            if beyond:  # it took what arrived past its ranges too
                ranges = [
                    (tp, job.positions[tp], beyond.get(tp) or planned_until[tp])
                    for tp in sorted({*planned_until, *beyond})
                ]
                ends = job.backlog.planned_ends
                job.backlog.planned_ends = {
                    **ends,
                    **{tp: r for tp, r in beyond.items() if r > ends.get(tp, 0)},
                }
        else:
            self.stalled = []
            try:
                result = job.copier.copy(
                    batch,
                    ranges,
                    job.copier.settings(mapping, job.remote_topics.max_message_bytes),
                    local,
                    f"mirror {spec.flow} batch {report.batches}",
                )
            except MirrorflowError:
                if job.cancelled:  # cancelled by Spark: copied again on resume
                    log.warning(
                        "%s: batch %d cancelled by Spark: what it copied is copied again when "
                        "the flow resumes",
                        spec.flow,
                        report.batches,
                    )
                    raise BatchCancelled from None
                raise
            self.stalled = result.stalled
            records, size, runs, copied = result.records, result.bytes, result.runs, result.copied
            reached = result.reached
            ranges = [(tp, start, reached[i]) for i, (tp, start, _until) in enumerate(ranges)]
            done = f"{records} records, {size} bytes" + (" (in the driver)" if local else "")
            report.local_batches += local
            job.store_runs(runs)
            assert job.writer is not None
            job.writer.write({tp: until for tp, start, until in ranges if until > start})
            if self.stalled and not job.cancelled:
                (topic, partition), offset = self.stalled[0]
                for tp, _start, until in ranges:
                    job.positions[tp] = until
                raise ClusterUnreachable(
                    f"cluster {spec.source} did not answer: no records of "
                    f"{topic}-{partition} from offset {offset} within {SOURCE_STALL_S:.0f}s "
                    "(what was copied is kept)",
                    f"check that {spec.source} is up; retrying",
                )
        for tp, _start, until in ranges:
            job.positions[tp] = until
        report.copied[0] += records
        report.copied[1] += size
        if job.metrics is not None:
            job.metrics.batch(
                copied, job.positions, job.backlog.planned_ends, mapping, job.backlog.plan_at
            )
        elapsed = time.monotonic() - started
        cut = sum(until - start for _tp, start, until in ranges) < planned
        log.info(
            "%s batch %d: %s from %d partitions in %.3f s%s",
            spec.flow,
            report.batches,
            done,
            len(ranges),
            elapsed,
            " (cancelled: the flow was paused; positions at its last acknowledged copies)"
            if cut
            else "",
        )
        report.last_batch_s, report.last_batch_at = elapsed, time.time()
        job.copied_now()
        if not self.capped and not cut:  # everything on the source at the plan is copied
            job.backlog.caught_up_at = job.backlog.plan_at
        job.record_state("RUNNING")

    def _abort_transactions(self, partitions: list[Partition]) -> None:
        """An exactly-once batch that failed or was cancelled: fence its partitions'
        transactional producers, which aborts their open transactions (a worker killed
        mid-transaction leaves one open, which would hold back every read_committed consumer of
        the target partition until the transaction timeout). A transaction committed before
        stays committed, with its positions: the flow resumes after it."""
        job = self.job
        if self._driver is not None:
            self._driver.drop_producers()  # fenced now, or in an unknown state
        if not job.fence(partitions):
            return
        log.info(
            "%s: batch %d %s: the open transactions of its %d partitions are aborted; nothing "
            "of it is visible but what it committed",
            job.spec.flow,
            job.report.batches,
            "cancelled (the flow was paused)" if job.cancelled else "failed",
            len(partitions),
        )

    def runs_locally(self, ranges: list[tuple[Partition, int, int]]) -> bool:
        """Whether a batch is small enough to copy in the driver (at least once, its JVM;
        exactly once, its Python): at most
        ``local_batch_max_records`` records (0: never; by default 1,000 at least once, 50,000
        exactly once), and at most :data:`LOCAL_BATCH_MAX_BYTES` (exactly once:
        :data:`EOS_LOCAL_BATCH_MAX_BYTES`, the driver's Python streams them) by the flow's mean
        record size so far."""
        spec = self.job.spec
        limit = spec.local_batch_limit
        records = sum(until - start for _tp, start, until in ranges)
        if limit <= 0 or records > limit:
            return False
        copied = self.job.report.copied
        mean = copied[1] / copied[0] if copied[0] else 0
        most = EOS_LOCAL_BATCH_MAX_BYTES if spec.exactly_once else LOCAL_BATCH_MAX_BYTES
        return records * mean <= most

    def _copy_in_transactions(
        self, ranges: list[tuple[Partition, int, int]], mapping: dict[str, str], local: bool
    ) -> tuple[int, int, int, dict[Partition, Copied], dict[Partition, int]]:
        """Exactly-once: the Python workers (``local``: the driver) copy each source partition
        in a transaction that also commits its position and its runs in the offset map; then
        the offset syncs go out. Returns (records, bytes, syncs, what was copied per
        partition, the offset after each partition's last copy).

        Caught up, a batch in the driver also takes what arrives in the flow's partitions until
        its commit is due (:meth:`commit_due`), at most :data:`FOLLOW_MAX_S`; the next is due
        ``transaction_interval_ms`` after that (after the end of a batch that did not)."""
        job = self.job
        started = time.monotonic()
        if local and self._driver is None:
            from mirrorflow.runtime.range_reader import RangeReader

            spec = job.spec
            reader = RangeReader(
                spec.source,
                spec.flow,
                spec.source_consumer_client,
                spec.source_consumer,
                cancelled=lambda: job.cancelled,
                stopping=job.stopping,
                follows=self.follow,
            )
            self._driver = exactly_once.DriverCopy(reader, self._confirm_lease)
        elif not local and self._driver is not None:
            # A Spark batch's cancellation fences the driver's id too (without a batch of the
            # driver's to drop it): the next small batch starts a new producer.
            self._driver.drop_producers()
        due = self.commit_due()
        until = min(due, started + FOLLOW_MAX_S) if due is not None else None
        follow = local and until is not None and until > started and self.follow
        result = exactly_once.copy_batch(
            job.spark,
            job.spec,
            ranges,
            mapping=mapping,
            producer_config=job.copy_producer_config,
            max_message_bytes=dict(job.remote_topics.max_message_bytes),
            positions=job.positions,
            offset_map=job.offset_map,
            lease_holder=asdict(job.lease.holder) if job.lease is not None else None,
            driver=self._driver if local else None,
            follow={tp: job.positions[tp] for tp in job.partitions(mapping) if tp in job.positions}
            if follow
            else None,
            until=until if follow else None,
        )
        # the commit's start (it took records until then), or, if it did not follow, its end
        self.committed_at = until if follow and until is not None else time.monotonic()
        if job.spec.emit_offset_syncs and result.syncs:
            self._write_offset_syncs(result.syncs)
        return result.records, result.bytes, len(result.syncs), result.copied, result.reached

    def _confirm_lease(self) -> None:
        """Before a small batch in the driver commits: the job still holds the flow's lease,
        renewed first unless fresh (no other job can have taken it since), as a stream checks
        it; :class:`~mirrorflow.replication.lease.LeaseLost` otherwise. (A Spark task reads the
        leases topic instead, once its new producers have fenced their partitions.)"""
        lease = self.job.lease
        if lease is not None and not lease.fresh():
            lease.renew()

    def _write_offset_syncs(self, syncs: list[OffsetSync]) -> None:
        job, spec = self.job, self.job.spec
        cluster, topic = spec.offset_syncs_cluster, spec.offset_syncs_topic
        config = spec.source_client if cluster == spec.source else spec.target_client
        write_records(
            job.producers[cluster],
            topic,
            [(sync.key(), sync.value()) for sync in syncs],
            cluster=cluster,
            principal=client_principal(config),
            what=f"writing offset syncs to {topic}",
            hint="the batch will be replayed when the job restarts; check the cluster",
            timeout_s=60,
            # A pause does not wait for a cluster that does not answer (the source, where the
            # syncs are by default): the batch is committed, its syncs left to the producer.
            abandon=lambda: job.cancelled,
        )
