"""A flow's stream, supervised from its driver: the continuous copy a caught-up at-least-once
flow runs instead of batches.

The copy itself is the JVM copier's (:class:`~mirrorflow.runtime.copier.CopyStream`: one task,
one consumer for all the flow's source partitions, in the driver's JVM). :class:`FlowStream`
starts it from the flow's positions, every :data:`STREAM_COMMIT_S` (caught up,
:data:`STREAM_IDLE_COMMIT_S`) takes what it acknowledged (its runs into the offset map in memory,
its figures; the offset map's records on the target, then the positions, with the flow's next
lease renewal, the positions in its transaction), hands it the topics and partitions new to the
flow as the refresh finds them, lets it copy only while the flow's lease is fresh (holding it,
not ending it, while the target does not answer a renewal), and ends it at a stop or pause, a
topic leaving the flow, or a failed task (in the batch's one-line error).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.lag import Lag
from mirrorflow.runtime.batch_errors import BatchCancelled, batch_error
from mirrorflow.runtime.copier import STREAM_OPEN, CopierResult, CopyStream

if TYPE_CHECKING:
    from mirrorflow.runtime.driver import MirrorJob

log = logging.getLogger("mirrorflow.mirror")

Partition = tuple[str, int]
# A stream's acknowledged copies are taken, written (offset map, then positions) and counted in
# the flow's figures this often;
STREAM_COMMIT_S = 1.0
# and this often once its last harvest found it caught up (every partition read to its end, its
# copies acknowledged): an idle mesh's streams copy only heartbeats, a few a second, and their
# harvests (a py4j round trip, the Python that takes it in) were about a fifth of its idle CPU.
STREAM_IDLE_COMMIT_S = 2.0
# A stream that ended (a topic left the flow) starts again at once, catching up itself, when
# the flow is this far behind at most: no Spark job, which in an application of many flows waits
# for the executors' few slots behind the others' batches.
STREAM_AGAIN_MAX_RECORDS = 50_000
# The copier's error for a record larger than its remote topic's limit as the stream knows it.
TOO_LARGE = "is larger than max.message.bytes="
# A stream's fetches that found every partition caught up at most this long ago stand for the
# flow's lag as the source would answer it (seen_lag): its heartbeat topics are read once a
# second, a caught-up stream harvested every STREAM_IDLE_COMMIT_S.
SEEN_FRESH_S = 5.0


class FlowStream:
    """The stream of ``job``'s flow: :meth:`run` copies continuously until it ends."""

    def __init__(self, job: MirrorJob) -> None:
        self.job = job
        self.holding = False  # the target did not answer a renewal: copying nothing
        self.unwritten: dict[Partition, int] = {}  # positions reached, written with the lease
        self._unwritten_lock = threading.Lock()  # the stream's harvests and the renewal task
        self._write_lock = threading.Lock()  # held while positions are written
        self.running = False  # a stream copies (run has not returned)
        self._limits_read_at = float("-inf")  # monotonic: the remote topics' limits last read
        self._limits_asked = False  # the stream's producer split a batch: read them now
        self._positions_written_at = float("-inf")  # monotonic: the last write of positions
        # When its fetches last found every partition caught up (Unix time), and the ends they
        # saw then; None while it is behind or not running.
        self._seen: tuple[float, dict[Partition, int]] | None = None
        self._interval_s = STREAM_COMMIT_S  # between the last harvest and the one before

    def starts_again(self, ranges: list[tuple[Partition, int, int]]) -> bool:
        """Whether a stream that just ended starts again rather than a batch of ``ranges``
        (the whole backlog, not capped): a continuous flow whose backlog is small, at most
        :data:`STREAM_AGAIN_MAX_RECORDS`."""
        spec = self.job.spec
        return (
            spec.continuous
            and not spec.exactly_once
            and sum(until - start for _tp, start, until in ranges) <= STREAM_AGAIN_MAX_RECORDS
        )

    def limits_due(self) -> bool:
        """Whether the flow's topic refresh reads its remote topics' size limits again
        (``max.message.bytes``; a new topic's is always read): at every refresh while the flow
        copies in batches. A stream's producer tells when the target refuses its batches as too
        large (it splits them, :meth:`_batches_split`): while the flow streams, they are read at
        once then, and otherwise every ``sync.topic.configs.interval.seconds`` (a raised
        limit; MirrorMaker 2's interval for topic configs; a record over the limit the stream
        knows also has it read, :meth:`_limit_raised`). Each read describes every remote
        topic's configs: at every refresh, an idle mesh of 6 (30 flows, some 65 heartbeat
        topics each) spent about 0.06 cores on them."""
        now = time.monotonic()
        due = (
            not self.running
            or self._limits_asked
            or now - self._limits_read_at >= self.job.spec.sync_configs_interval_s
        )
        if due:
            self._limits_read_at, self._limits_asked = now, False
        return due

    def _batches_split(self) -> None:
        """The stream's producer split batches the target refused as too large: a remote
        topic's ``max.message.bytes`` is now under the stream's batches, which Kafka's producer
        would split into batches of the same size forever (KAFKA-8350). The topic refresh runs
        now and reads the limits; a lowered one ends the stream, which starts again with
        batches that fit."""
        job = self.job
        if not self._limits_asked:
            log.info(
                "%s: the target refused a batch of the stream as too large for its topic: the "
                "remote topics' size limits (max.message.bytes) are read again now",
                job.spec.flow,
            )
        self._limits_asked = True
        if job.scheduler is not None:
            job.scheduler.run_soon("refresh-topics")

    def run(self, behind: int = 0) -> None:
        """Copy continuously from the flow's positions until a stop or pause, a topic leaving
        the flow, or a failed task (:class:`~mirrorflow.errors.MirrorflowError`, one line);
        :class:`~mirrorflow.runtime.batch_errors.BatchCancelled` once the flow is cancelled.
        ``behind``: the records it starts behind (a stream started again)."""
        job = self.job
        assert job.scheduler is not None
        mapping = job.mapping
        partitions = [tp for tp in job.partitions() if tp in job.positions]
        limits = self._limits(mapping)
        batch = job.begin_batch(partitions)
        error: str | None = None
        with self._unwritten_lock:
            self.unwritten = {}
        self.running, split, self._seen = True, 0, None
        try:
            allowed = self.allowance_ms()
            stream = CopyStream(
                job.copier.java,
                batch,
                partitions,
                [job.positions[tp] for tp in partitions],
                job.copier.settings(mapping, job.remote_topics.max_message_bytes),
                allowed,
            )
            if behind:
                log.info(
                    "%s: copying continuously from %d partitions, %d records behind: the "
                    "stream catches them up",
                    job.spec.flow,
                    len(partitions),
                    behind,
                )
            else:
                log.info(
                    "%s: caught up; copying continuously from %d partitions",
                    job.spec.flow,
                    len(partitions),
                )
            try:
                while not job.wait_for_stop(self._next_harvest()):
                    try:
                        harvested = stream.harvest()
                    except Exception as exc:  # py4j's error: a task failed (see end())
                        error = str(exc)
                        break
                    self._commit(harvested, stream.partitions, mapping)
                    if harvested.batches_split > split:
                        split = harvested.batches_split
                        self._batches_split()
                    allowance = self.allowance_ms()
                    if allowance != allowed:  # a py4j round trip: only when the lease moved it
                        stream.allow(allowance)
                        allowed = allowance
                    if job.mapping is not mapping:
                        extended = self._extend(stream, mapping, limits)
                        if extended is None:
                            break
                        mapping, limits = extended, self._limits(extended)
                    if (
                        job.stopping()
                        or job.scheduler.error is not None
                        or job.tasks_unanswered() is not None
                    ):
                        break
            finally:
                harvested, failed = stream.end()
                error = failed or error
                self._commit(harvested, stream.partitions, mapping, final=True)
        finally:
            self.running, self._seen = False, None
            job.end_batch(batch)
            with self._unwritten_lock:  # written at the end, or read again at the retry
                self.unwritten = {}
        if error is not None and not self._limit_raised(error, mapping):
            raise batch_error(job.spec, error)
        if job.cancelled:
            raise BatchCancelled

    def _limit_raised(self, error: str, mapping: dict[str, str]) -> bool:
        """Whether the stream ended on a record larger than its remote topic's limit as last
        read (the copier's ``is larger than max.message.bytes=``) while the target now takes it:
        the limit was raised since (a streaming flow reads them every
        ``sync.topic.configs.interval.seconds``, :meth:`limits_due`). Then the stream starts
        again with the new limits, from that record, instead of the flow failing."""
        if TOO_LARGE not in error:
            return False
        before = self._limits(mapping)
        try:
            self.job.remote_topics.read_limits(sorted(before))
        except MirrorflowError:  # the target does not answer: the record's error stands
            return False
        raised = {r: n for r, n in self._limits(mapping).items() if n > before[r]}
        for remote, limit in sorted(raised.items()):
            log.info(
                "%s: %s takes records of at most %d bytes now (max.message.bytes, was %d): "
                "the stream starts again with it",
                self.job.spec.flow,
                remote,
                limit,
                before[remote],
            )
        return bool(raised)

    def _limits(self, mapping: dict[str, str]) -> dict[str, int]:
        """The size limits (``max.message.bytes``) of ``mapping``'s remote topics, as last read."""
        known = self.job.remote_topics.max_message_bytes
        return {remote: known[remote] for remote in mapping.values()}

    def _extend(
        self, stream: CopyStream, mapping: dict[str, str], limits: dict[str, int]
    ) -> dict[str, str] | None:
        """The flow's topics changed (``mapping`` was theirs, ``limits`` their remote topics'
        size limits) while ``stream`` ran: new topics and partitions join it, from where each
        starts, and it goes on; returns the mapping it now copies. None when it cannot take the
        change (a topic left the flow or changed its remote, a remote topic's limit changed, or
        a new remote topic needs other producer settings: larger records, smaller batches):
        then it ends, and the flow plans again. (A producer whose batches exceed a topic's
        limit would split them forever, KAFKA-8350; and the copier checks records against the
        limits it started with.)"""
        job = self.job
        now = job.mapping
        if any(now.get(source) != remote for source, remote in mapping.items()):
            return None
        if self._limits(mapping) != limits:
            log.info(
                "%s: a remote topic's size limit changed: the stream starts again with it",
                job.spec.flow,
            )
            return None
        streamed = set(stream.partitions)
        new = [tp for tp in job.partitions(now) if tp not in streamed]
        if not new:
            return now
        job.start_partitions([tp for tp in new if tp not in job.positions])
        settings = job.copier.settings(now, job.remote_topics.max_message_bytes)
        if not stream.extend(new, [job.positions[tp] for tp in new], settings):
            return None
        job.in_flight_partitions(stream.partitions)
        log.info(
            "%s: %d new partitions join the stream (%s)",
            job.spec.flow,
            len(new),
            ", ".join(sorted({topic for topic, _p in new})),
        )
        return now

    def _next_harvest(self) -> float:
        """How long until the stream's next harvest (kept as the figures' interval):
        :data:`STREAM_IDLE_COMMIT_S` while its last found it caught up (and copying: not
        holding), :data:`STREAM_COMMIT_S` otherwise. A stop, a pause or a cancel ends the wait
        at once."""
        caught_up = self._seen is not None and not self.holding
        self._interval_s = STREAM_IDLE_COMMIT_S if caught_up else STREAM_COMMIT_S
        return self._interval_s

    def seen_lag(self) -> Lag | None:
        """The flow's lag as the running stream's own fetches saw it, when they found every
        partition caught up at most :data:`SEEN_FRESH_S` ago: nothing behind, up to the ends
        the source's answers to them gave (the lag task then asks the source nothing). None
        while it is behind, holding (it fetches nothing then) or not running."""
        seen = self._seen
        if not self.running or self.holding or seen is None:
            return None
        at, ends = seen
        if time.time() - at > SEEN_FRESH_S:
            return None
        return Lag(at, dict(ends), dict(ends))

    def allowance_ms(self) -> int:
        """Until when (epoch ms) a stream may copy: while the flow's lease is fresh, renewed
        first if it is not (:class:`~mirrorflow.replication.lease.LeaseLost` if another job
        took it). A job frozen past it (SIGSTOP, a long pause) finds on waking that its stream
        may not copy any more, and copies nothing until it has renewed the lease here.

        A target that does not answer a renewal (the ``renew-lease`` task's, which carries the
        positions, or this one; down, or too slow: a transaction waits
        :data:`~mirrorflow.replication.lease.COMMIT_TIMEOUT_S`) holds the stream: its
        allowance is past, so it copies nothing, but it does not end; it
        tries a renewal here at every harvest and copies again as soon as one succeeds, with no
        restart and no batch. The flow fails as it does for any task's outage, once the target
        has not answered for ``retry_timeout_s``."""
        job = self.job
        lease = job.lease
        if lease is None:
            return STREAM_OPEN
        if self.holding or not lease.fresh():
            try:
                lease.renew()
            except ClusterUnreachable as exc:
                self._hold(exc)
                return min(int(time.time() * 1000), int(lease.fresh_until() * 1000))
        if self.holding:
            self.holding = False
            log.info("%s: lease renewed: the stream copies again", job.spec.flow)
        return int(lease.fresh_until() * 1000)

    def write_positions(self, when_due: bool = False) -> bool:
        """Write the positions the stream reached and has not written, in one transaction
        that renews the flow's lease (the ``renew-lease`` task calls it on its beat,
        ``when_due``: only once ``offset.flush.interval.ms`` has passed since the last write, as
        MirrorMaker 2 flushes its source offsets; a stream that ends, always): whether it
        wrote any. Positions that wait renew nothing: the renewal task renews the lease alone.

        The write happens outside the lock the stream's harvests take: a target that does not
        answer makes a write wait (:data:`~mirrorflow.replication.lease.COMMIT_TIMEOUT_S`),
        and the stream must meanwhile go on harvesting, holding and seeing a stop. Positions
        only grow, so one reached again during the write stays unwritten for the next."""
        assert self.job.writer is not None
        with self._write_lock:  # one write at a time: the renewal task's, the stream's end
            flush_s = self.job.spec.offset_flush_interval_ms / 1000
            if when_due and time.monotonic() - self._positions_written_at < flush_s:
                return False
            with self._unwritten_lock:
                if not self.unwritten:
                    return False
                writing = dict(self.unwritten)
            self.job.store_added_runs()  # the offset map first: it covers every copy below
            self.job.writer.write(writing)
            self._positions_written_at = time.monotonic()
            with self._unwritten_lock:
                for tp, reached in writing.items():
                    if self.unwritten.get(tp) == reached:
                        del self.unwritten[tp]
            return True

    def _hold(self, exc: ClusterUnreachable) -> None:
        """The target did not answer a renewal: the stream holds (copies nothing) until one
        succeeds (:meth:`allowance_ms`)."""
        if not self.holding:
            self.holding = True
            log.warning(
                "%s: the stream holds (copies nothing) until the lease is renewed: %s",
                self.job.spec.flow,
                exc.message,
            )

    def _commit(
        self,
        harvested: CopierResult,
        partitions: list[Partition],
        mapping: dict[str, str],
        final: bool = False,
    ) -> None:
        """Write what a stream acknowledged since its last harvest: its runs to the offset map,
        then the positions it reached, with the first lease renewal once
        ``offset.flush.interval.ms`` has passed (or at once if ``final``: the stream ended); its
        figures to the metrics and ``progress.json``.

        Positions are written every ``offset.flush.interval.ms`` (mirrorflow's default 5 s), in
        the transaction of the lease renewal then due, rather than at every harvest: a flow's
        control traffic on its target is one transaction per renewal
        (:data:`~mirrorflow.replication.lease.RENEW_S`), busy or idle, with the positions and,
        before them, the offset map's runs that grew since (each as it now is: the offset map
        in memory, which checkpoints translate with, takes them at the harvest) in one renewal
        of those in an interval. In a mesh, every flow copies a heartbeat a second to each of
        hundreds of heartbeat topics: a position per partition at each renewal was most of a
        renewal's cost. A job killed between two writes copies up to that much again when it
        starts (at least once), as MirrorMaker 2 does since its last offset flush (every 60 s
        by default)."""
        job = self.job
        assert job.writer is not None
        now = time.time()
        job.add_runs(harvested.runs)  # stored with the positions they let pass
        moved = {
            tp: reached
            for tp, reached in zip(partitions, harvested.reached, strict=True)
            if reached > job.positions.get(tp, reached)
        }
        with self._unwritten_lock:
            self.unwritten.update(moved)
        if final or job.lease is None:
            self.write_positions()
        job.positions.update(moved)
        report, backlog, metrics = job.report, job.backlog, job.metrics
        report.copied[0] += harvested.records
        report.copied[1] += harvested.bytes
        ends = {
            tp: max(end, job.positions[tp])
            for tp, end in zip(partitions, harvested.ends_seen, strict=True)
            if end >= 0
        }
        if ends:
            backlog.planned_ends.update(ends)
            backlog.plan_at = now
            backlog.observe(ends, job.positions, int(now * 1000))
        caught_up = harvested.caught_up_ms
        # Every partition's task found nothing new with its copies acknowledged: when the last
        # of them did, everything then on the source was copied.
        idle = (
            bool(caught_up)
            and min(caught_up) >= 0
            and all(job.positions[tp] >= end for tp, end in ends.items())
        )
        if idle:
            backlog.caught_up_at = max(backlog.caught_up_at or 0.0, min(caught_up) / 1000)
        self._seen = (min(caught_up) / 1000, ends) if idle else None
        if harvested.records:
            job.copied_now()
            report.last_batch_at = now
            report.last_batch_s = self._interval_s
            if metrics is not None:
                metrics.batch(harvested.copied, job.positions, ends, mapping, now)
            if report.state != "RUNNING":
                job.record_state("RUNNING")
            return
        if metrics is not None:
            if idle and backlog.caught_up_at is not None:
                metrics.caught_up(job.positions, mapping, backlog.caught_up_at)
            else:
                metrics.lag(job.positions, ends, mapping, now)
        if idle and report.state != "IDLE":  # else copies are still unacknowledged: not idle
            job.record_state("IDLE")
