"""Reading a batch's offset ranges of the source in the driver, for a small exactly-once batch
copied there without a Spark job (:class:`RangeReader`).

An exactly-once batch's tasks read their ranges with Spark's Kafka batch source and copy them in
the Python workers (:mod:`mirrorflow.runtime.eos_writer`). A caught-up flow's batches are small,
and a Spark job costs the driver's JVM about 0.7 CPU-s whatever it holds (planning, code
generation, scheduling), so at a steady trickle most of an exactly-once flow's CPU went to
scheduling. A batch of at most ``--local-batch-max-records`` records (exactly once, 50,000 by
default: :data:`mirrorflow.replication.spec.EOS_LOCAL_BATCH_MAX_RECORDS`) is read here instead, by
one consumer the flow keeps, and copied by the same writer in the driver's Python: the same
transactions, positions, offset map and offset syncs as a Spark task's.

The records are those Spark's source would give: each range's offsets from its start below its
end, with the source consumer's isolation level as the flow's Java clients have it (MirrorMaker
2's ``read_uncommitted`` unless the flow sets ``read_committed``: the ends were listed so), gaps
(compaction, transaction markers, aborted records) skipped. A source that gives nothing of a
range for :data:`~mirrorflow.runtime.copier.SOURCE_STALL_S` fails the batch in one line, as a
Spark task's poll timeout does.

Caught up, a batch also *follows* the flow's partitions (``read(..., follow, until)``): past its
ranges it takes every record that arrives, as it arrives, until its transaction is due to commit
(:meth:`mirrorflow.runtime.batches.Batches.commit_due`). The writer produces each into the open
transaction at once, so a record waits for the commit, not for the next batch's plan and copy:
Connect's ``transaction.boundary = interval``, records produced as polled and committed on the
interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import cast

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.topics import client_principal, refusal, unauthorized
from mirrorflow.runtime import eos_writer
from mirrorflow.runtime.copier import SOURCE_STALL_S

Partition = tuple[str, int]

CHUNK = 500  # records handed to the writer at once
# A read's wait for records; following, a record is copied at most this long after it is
# fetched (a 50-ms wait, which woke the driver's Python less often, cost 0.02 cores less at 1,000
# records/s but 10 ms more at p50: more copies in flight at the commit's flush)
WAIT_S = 0.01
FOLLOW_FETCH_MIN_BYTES = 64 << 10
# A following reader's fetch waits this long at most for FOLLOW_FETCH_MIN_BYTES (10 ms: exactly
# once's p99 at 1,000 records/s was 119.8-126.0 ms in three runs, 117.4 at 5 ms, at the same CPU;
# 2 ms gained nothing more; answering each record, fetch.min.bytes 1, gained 4-5 ms but cost
# 0.04 cores more: at 10,000 records/s 0.24-0.27 cores, MirrorMaker 2 0.25-0.26).
FOLLOW_FETCH_WAIT_MS = 5
# Following, at its commit's due time a read goes on until the fetch the broker then holds is
# answered (within FOLLOW_FETCH_WAIT_MS), at most this long, and ends with its records: what
# reached the source before the due time is in this transaction. Before, the read ended between
# two fetches: the records of the last few ms waited a whole interval more, and the time since
# the last fetch was lost to every record of the transaction (at 1,000 records/s, p50 and p99
# each 2-3 ms more). A read of a trickle, whose fetches come back empty, commits this much later.
IN_FLIGHT_WAIT_S = (FOLLOW_FETCH_WAIT_MS + 5) / 1000


class RangeReader:
    """Reads offset ranges of the flow ``flow``'s source (``source``: its alias) in the driver.

    One consumer for the flow's life; between two batches it has nothing assigned, so it sends
    the source nothing. It never joins nor commits a group (READ on the topics is all it
    needs, as Spark's reader)."""

    def __init__(
        self,
        source: str,
        flow: str,
        consumer_config: dict[str, str],
        java_consumer: dict[str, str],
        cancelled: Callable[[], bool] = lambda: False,
        stopping: Callable[[], bool] = lambda: False,
        follows: bool = False,
    ) -> None:
        """``consumer_config``: the flow's source consumer settings for librdkafka;
        ``java_consumer``: as its Java clients take them (their isolation level applies);
        ``cancelled``: whether the batch was cancelled (a pause): a read then stops;
        ``stopping``: whether the flow is asked to stop: a read follows no more; ``follows``:
        whether its reads follow their partitions (``read``'s ``follow``)."""
        self.cancelled, self.stopping = cancelled, stopping
        committed = java_consumer.get("isolation.level") == "read_committed"
        self.source = source
        self.principal = client_principal(consumer_config)
        self._consumer = clients.assigned_consumer(
            source,
            consumer_config,
            f"mirrorflow-reader-{flow}",
            {
                "isolation.level": "read_committed" if committed else "read_uncommitted",
                # a range's start is known: an offset reset means the range is gone (deleted)
                "auto.offset.reset": "earliest",
                # A fetch at a range's end waits on the broker this long for more: the next
                # batch's assignment is fetched only once it is answered (500 ms by default).
                "fetch.wait.max.ms": FOLLOW_FETCH_WAIT_MS if follows else 10,
                # A reader that follows (see the module): the broker answers a fetch once this
                # much has arrived or at that wait, not at each record (at 1,000 records/s,
                # 0.06 cores less in the driver in one run). Its batches' first fetch may wait
                # the 10 ms, so a reader that never follows (transaction.boundary = poll)
                # keeps Kafka's 1 byte.
                **({"fetch.min.bytes": FOLLOW_FETCH_MIN_BYTES} if follows else {}),
            },
        )

    def read(
        self,
        ranges: list[tuple[Partition, int, int]],
        follow: dict[Partition, int] | None = None,
        until: float | None = None,
    ) -> Iterator[eos_writer.Records]:
        """The records of ``ranges`` (partition, first offset, end) as the exactly-once writer
        takes them, in chunks of :data:`CHUNK`, each partition's in offset order. With
        ``follow`` (partition: its position) and ``until`` (monotonic), then also the records
        of those partitions that arrive, from their positions, until then (or a stop), each
        wait's as soon as they are read."""
        from confluent_kafka import TopicPartition

        ends = {tp: end for tp, start, end in ranges if end > start}
        starts = {tp: start for tp, start, end in ranges if end > start}
        if follow and until is not None:
            for tp, position in follow.items():
                starts.setdefault(tp, position)
        else:
            until = None
        if not starts:
            return
        self._consumer.assign([TopicPartition(t, p, start) for (t, p), start in starts.items()])
        try:
            yield from self._read(starts, ends, until)
        finally:
            self._consumer.unassign()

    def _read(
        self, starts: dict[Partition, int], ends: dict[Partition, int], until: float | None
    ) -> Iterator[eos_writer.Records]:
        from confluent_kafka import TopicPartition

        remaining = dict(ends)
        following = dict(starts)  # the offset after the last record read
        heard = time.monotonic()
        rows: list[tuple] = []
        while remaining or (until is not None and time.monotonic() < until and not self.stopping()):
            if self.cancelled():
                raise MirrorflowError("the batch was cancelled", "it is copied again on resume")
            if remaining:
                # A short wait: librdkafka returns after it unless as many records are there
                # as the ranges may still hold (a batch's last ones, not a wait after them: a
                # range with gaps waits it out), and a range's end is seen by its position (it
                # passes transaction markers too).
                left = sum(remaining[tp] - following[tp] for tp in remaining)
                wait_s, most = WAIT_S, max(1, min(CHUNK, left))
            else:  # following, until its commit is due
                assert until is not None
                wait_s, most = max(0.0, min(WAIT_S, until - time.monotonic())), CHUNK
            messages = self._consumer.consume(most, wait_s)
            self._take(messages, rows, following, None if until is not None else remaining)
            if messages:
                heard = time.monotonic()
            if len(rows) >= CHUNK or (rows and not remaining):  # following: copied as read
                yield _records(rows)
                rows = []
            if not remaining:
                continue
            reached = self._consumer.position([TopicPartition(t, p) for t, p in remaining])
            for position in reached:
                tp = (position.topic, position.partition)
                if position.offset >= remaining[tp]:
                    del remaining[tp]
            if remaining and time.monotonic() - heard > SOURCE_STALL_S:
                (topic, partition), _end = sorted(remaining.items())[0]
                at = {(p.topic, p.partition): p.offset for p in reached}
                offset = max(at.get((topic, partition), -1), starts[(topic, partition)])
                raise ClusterUnreachable(
                    f"cluster {self.source} did not answer: no records of {topic}-{partition} "
                    f"from offset {offset} within {SOURCE_STALL_S:.0f}s",
                    f"check that {self.source} is up; retrying",
                )
        if until is not None and not self.stopping() and not self.cancelled():
            # The fetch the broker holds at the commit's due time has what reached the source
            # until it answers: the read ends with its records (see IN_FLIGHT_WAIT_S).
            messages = self._consumer.consume(1, IN_FLIGHT_WAIT_S)
            if messages:
                messages += self._consumer.consume(CHUNK, 0)
            self._take(messages, rows, following, None)
        if rows:
            yield _records(rows)

    def _take(
        self,
        messages: list,
        rows: list[tuple],
        following: dict[Partition, int],
        ends: dict[Partition, int] | None,
    ) -> None:
        """Add the records of ``messages`` to ``rows`` (``following``: each partition's offset
        after its last one read); ``ends``: the ranges' ends not reached yet, past which a
        record is not taken (None: following, every record is)."""
        from confluent_kafka import KafkaError

        for msg in messages:
            error = msg.error()
            if error is not None:
                # the end of a partition; librdkafka's look-up of the coordinator of the
                # group it never joins (refused without DESCRIBE on it, not needed)
                if error.code() in (
                    KafkaError._PARTITION_EOF,
                    KafkaError.GROUP_AUTHORIZATION_FAILED,
                ):
                    continue
                self._raise(error, cast(str, msg.topic()), cast(int, msg.partition()))
            # a record's (not an event's): topic, partition, offset and headers as a list
            tp = cast(Partition, (msg.topic(), msg.partition()))
            offset = cast(int, msg.offset())
            if ends is not None and offset >= ends.get(tp, -1):
                continue  # past its range (fetched with the range's last records)
            following[tp] = offset + 1
            headers = cast(list[tuple[str, bytes | None]] | None, msg.headers())
            timestamp_type, timestamp = msg.timestamp()
            rows.append(
                (
                    tp[0],
                    tp[1],
                    offset,
                    msg.key(),
                    msg.value(),
                    headers or None,
                    timestamp if timestamp_type else None,
                )
            )

    def _raise(self, error, topic: str, partition: int) -> None:
        if unauthorized(error):
            raise refusal(
                self.source,
                self.principal,
                f"reading {topic}-{partition}",
                error.str(),
                f"READ on topic {topic}",
            )
        raise MirrorflowError(
            f"reading {topic}-{partition} on {self.source} failed: {error.str()}",
            f"check {self.source}; the batch is retried",
        )

    def close(self) -> None:
        self._consumer.close()


def _records(rows: list[tuple]) -> eos_writer.Records:
    return dict(zip(eos_writer.INPUT_COLUMNS, map(list, zip(*rows, strict=True)), strict=True))
