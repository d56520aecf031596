"""The JVM copier from the driver's side: a flow's handle on it (:class:`JvmCopier`: its settings,
a batch's copy), its results decoded, and its continuous streams.

The copier (``jvm/mirror-copier``, class :data:`mirrorflow.runtime.jvm.COPIER_CLASS`) copies
offset ranges of source partitions with Kafka's Java clients, as a Spark job or in the driver's
JVM, and answers in one encoded block (``MirrorCopier.Copied.encode``): :class:`CopierResult`.

A :class:`CopyStream` is the copier run continuously in the driver's JVM: one task, with one
consumer for all the flow's source partitions, reading from the flow's positions with no end,
copying records as they arrive and writing offset syncs, until it is ended; partitions new to the
flow join it while it runs. The driver only supervises it: every
:data:`~mirrorflow.runtime.streaming.STREAM_COMMIT_S` it harvests what was acknowledged since the
last harvest (a :class:`CopierResult` whose ``reached`` offsets are the positions to write, and
whose runs all lie below them) and writes it, as it does after a batch.
"""

from __future__ import annotations

import builtins  # the type bytes, which a field of CopierResult hides in its class
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mirrorflow.config.librdkafka import principal
from mirrorflow.replication.offset_map import Run
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.runtime import eos_writer as mirror_writer
from mirrorflow.runtime import jvm, record_transforms
from mirrorflow.runtime.batch_errors import batch_error
from mirrorflow.runtime.metrics import Copied, Stats

if TYPE_CHECKING:
    from mirrorflow.runtime.spark_session import JobSpark

Partition = tuple[str, int]
# A batch's task waits at most this long for records its range holds (a source that stopped
# answering mid-batch): then it fails, the batch is retried with backoff, and the site's other
# flows get their Spark slots back. (Spark's Kafka reader fetches uninterruptibly: a cancelled
# exactly-once task ends only when its fetch does.)
SOURCE_STALL_S = 10.0
STREAM_OPEN = 2**63 - 1  # a stream's allowance without end (MirrorCopier.OPEN)
# A batch's producer lingers 20 ms (fuller requests, for throughput); a stream's, copying
# records as they arrive, 5 ms (Kafka 4's default), unless the flow sets producer linger.ms.
STREAM_LINGER_MS = 5
# A batch's producer fills requests of up to 512 KiB per partition (throughput). A stream's uses
# Kafka's default, 16 KiB: each partition with copies waiting takes a buffer of ``batch.size``
# from its producer's pool, which keeps it, and a stream writes to every partition of its flow,
# hundreds in a mesh (every cluster's heartbeat chains). At 512 KiB, the 30 streams of a mesh of
# 6 in one application held more than the driver's 1 GiB heap (OutOfMemoryError).
BATCHES_BATCH_SIZE = 512 << 10
STREAM_BATCH_SIZE = 16 << 10
# Both are capped at the smallest max.message.bytes of the flow's remote topics: Kafka's producer
# splits a batch the broker refuses as too large into batches of its own batch.size, so a
# batch.size above a topic's limit splits forever (KAFKA-8350; fixed in clients newer than the
# 3.9 that Spark's Kafka connector brings): no copy of that topic would ever be acknowledged.

_HEAD = struct.Struct(">qqqq")  # records, bytes, ranges, batches split (a stream's producer)
_RANGE = struct.Struct(">13q")  # see MirrorCopier.Copied.encode
_RUN = struct.Struct(">qqqq")  # range index, first source offset, first target offset, count


@dataclass
class CopierResult:
    """What the copier copied of its ranges (in their order): records and bytes in all, per
    partition its figures and runs of copies, the offset each range reached, the ranges the
    source left unfinished (``stalled``: partition, offset), and, for a stream's ranges, when
    each was last caught up (epoch ms, -1 never) and the end its consumer last saw (-1
    unknown); for a stream, how many batches its producer has split so far (the target refused
    them as too large: ``MirrorCopier.Stream.batchesSplit``)."""

    records: int = 0
    bytes: int = 0
    copied: dict[Partition, Copied] = field(default_factory=dict)
    runs: dict[Partition, list[Run]] = field(default_factory=dict)
    reached: list[int] = field(default_factory=list)
    stalled: list[tuple[Partition, int]] = field(default_factory=list)
    caught_up_ms: list[int] = field(default_factory=list)
    ends_seen: list[int] = field(default_factory=list)
    batches_split: int = 0

    @classmethod
    def decode(cls, data: builtins.bytes, partitions: list[Partition]) -> CopierResult:
        """``MirrorCopier.Copied.encode``'s block for ranges of ``partitions`` (in order)."""
        records, size, count, split = _HEAD.unpack_from(data)
        result = cls(records, size, batches_split=split)
        ranges_end = _HEAD.size + _RANGE.size * count
        copied, reached = result.copied, result.reached
        caught_up_ms, ends_seen = result.caught_up_ms, result.ends_seen
        # A stream's harvest decodes every partition of its flow each second (some 65 in a
        # mesh of 6): the loop makes only what it keeps.
        for tp, (nbytes, a0, a1, a2, a3, l0, l1, l2, l3, until, stall, caught_up, end) in zip(
            partitions, _RANGE.iter_unpack(data[_HEAD.size : ranges_end]), strict=False
        ):
            figures = Copied(
                0,
                nbytes,
                Stats(a0, a1, a2, a3) if a3 > 0 else Stats(),
                Stats(l0, l1, l2, l3) if l3 > 0 else Stats(),
            )
            known = copied.get(tp)
            copied[tp] = known.merge(figures) if known else figures
            reached.append(until)
            caught_up_ms.append(caught_up)
            ends_seen.append(end)
            if stall:
                result.stalled.append((tp, until))
        runs = result.runs
        for index, up, down, n in _RUN.iter_unpack(memoryview(data)[ranges_end:]):
            tp = partitions[index]
            partition_runs = runs.get(tp)
            if partition_runs is None:
                partition_runs = runs[tp] = []
            partition_runs.append(Run(up, down, n))
            known = copied.get(tp)
            if known is None:
                known = copied[tp] = Copied()
            known.records += n
        return result


def java_lines(copier: Any, lines: list[str]) -> Any:
    """``lines`` as a Java list, in one py4j call (``MirrorCopier.lines``; py4j would send a
    Python list item by item, a round trip each: hundreds for a flow of many partitions)."""
    return copier.lines("\n".join(lines))


def java_settings(copier: Any, settings: dict[str, str]) -> Any:
    """``settings`` as a Java map, in one py4j call (``MirrorCopier.settings``), as
    :func:`java_lines`. A value holding a NUL character (none of Kafka's) goes entry by
    entry."""
    if any("\0" in k or "\0" in v for k, v in settings.items()):
        java_map = copier.settings("")
        for k, v in settings.items():
            java_map.put(k, v)
        return java_map
    return copier.settings("\0".join(f"{k}\0{v}" for k, v in settings.items()))


class CopyStream:
    """A continuous copy of ``partitions`` from ``starts`` (their positions) in the driver's
    JVM, named ``batch`` (so that ``MirrorCopier.cancel`` ends it, as a batch's); ``settings``
    is the copier's Java map of settings (its ``batch`` set here)."""

    def __init__(
        self,
        copier,
        batch: str,
        partitions: list[Partition],
        starts: list[int],
        settings,
        allowed_until_ms: int = STREAM_OPEN,
    ) -> None:
        self.copier, self.batch, self.partitions = copier, batch, list(partitions)
        settings.put("batch", batch)
        settings.put("stream.allowed.until.ms", str(allowed_until_ms))
        self.producer = self._producer(settings)
        copier.stream(self._lines(partitions, starts), settings)

    @staticmethod
    def _producer(settings) -> tuple[str | None, ...]:
        """The settings of a stream's producer that depend on its remote topics' limits."""
        return tuple(
            settings.get(name)
            for name in (
                "producer.max.request.size",
                "producer.batch.size",
                "stream.producer.batch.size",
            )
        )

    def _lines(self, partitions: list[Partition], starts: list[int]) -> Any:
        return java_lines(
            self.copier,
            [f"{t}\t{p}\t{start}" for (t, p), start in zip(partitions, starts, strict=True)],
        )

    def extend(self, partitions: list[Partition], starts: list[int], settings) -> bool:
        """Add ``partitions`` (new to the flow) from ``starts`` to the running stream, which
        goes on copying the others; ``settings``: the copier's settings for the flow's topics
        now (the new remote topics' names and size limits). False, and nothing added, when
        they need a producer the stream does not have (a remote topic taking larger records,
        or smaller batches): then end the stream and start another."""
        if self._producer(settings) != self.producer:
            return False
        self.copier.extend(self.batch, self._lines(partitions, starts), settings)
        self.partitions.extend(partitions)
        return True

    def allow(self, until_ms: int) -> None:
        """Let the stream read and copy until ``until_ms`` (epoch ms): past it, its tasks copy
        nothing more (not even what they polled) until allowed again or ended."""
        self.copier.allow(self.batch, until_ms)

    def harvest(self) -> CopierResult:
        """What was acknowledged since the last harvest; raises (py4j's error, holding the
        copier's message) when a partition's task failed: then :meth:`end` it."""
        return CopierResult.decode(bytes(self.copier.harvest(self.batch)), self.partitions)

    def end(self) -> tuple[CopierResult, str | None]:
        """Stop every task (at its next poll, its copies acknowledged) and return what was
        acknowledged since the last harvest, and the first task's error (its Java classes and
        messages, one cause a line), or None."""
        result = CopierResult.decode(bytes(self.copier.endStream(self.batch)), self.partitions)
        return result, self.copier.streamError(self.batch)


class JvmCopier:
    """A flow's JVM copier seen from its driver (at least once): the copier's Java class, looked
    up once (a py4j round trip), its settings as a Java map, built again only when the flow's
    topics or their size limits change, and a batch's copy, as a Spark job or in the driver's
    JVM."""

    def __init__(self, spark: JobSpark, spec: MirrorSpec) -> None:
        self.spark, self.spec = spark, spec
        self._class: Any = None  # py4j's objects are untyped
        self._settings: tuple[tuple, Any] | None = None
        self._transform_plan: str | None = None

    def transform_plan(self) -> str | None:
        """The flow's record transforms as the copier evaluates them (analysed by Spark once:
        an expression it cannot evaluate fails here, in one line), or None."""
        if self.spec.transform is None:
            return None
        if self._transform_plan is None:
            self._transform_plan = record_transforms.copier_plan(
                self.spark.session, self.spec.flow, self.spec.transform
            )
        return self._transform_plan

    @property
    def java(self) -> Any:
        """The copier's Java class (``MirrorCopier``)."""
        if self._class is None:
            # _jvm: py4j's view of the JVM, Optional to pyspark, set while the context runs
            self._class = getattr(self.spark.context._jvm, jvm.COPIER_CLASS)
        return self._class

    def forget(self, batch: str) -> None:
        """Drop what the copier keeps of a cancelled or stalled ``batch`` (in the driver's
        JVM), if it ever ran one."""
        if self._class is not None:
            self._class.forget(batch)

    def settings(self, mapping: dict[str, str], max_message_bytes: dict[str, int]) -> Any:
        """The copier's settings (:func:`copier_settings`, with the flow's record transforms)
        for the flow's topics (``mapping``: source -> remote) and their remote topics' size
        limits, as a Java map."""
        limits = {rem: max_message_bytes[rem] for rem in mapping.values()}
        key = (tuple(sorted(mapping.items())), tuple(sorted(limits.items())))
        if self._settings is not None and self._settings[0] == key:
            return self._settings[1]
        spec = self.spec
        settings = copier_settings(spec, mapping, limits)
        plan = self.transform_plan()
        if plan is not None and spec.transform is not None:
            settings["transform"] = plan
            settings["transform.headers"] = str(spec.transform.changes_headers).lower()
            settings["transform.record"] = str(spec.transform.changes_record).lower()
        java_map = java_settings(self.java, settings)
        self._settings = (key, java_map)
        return java_map

    def copy(
        self,
        batch: str,
        ranges: list[tuple[Partition, int, int]],
        settings: Any,
        local: bool,
        description: str,
    ) -> CopierResult:
        """Copy the ranges and write their offset syncs, as a Spark job named
        ``description`` or (``local``) in the driver's JVM: each partition's runs of copies,
        what it copied of each (bytes, record ages at read, replication latencies at
        acknowledgement) and the offset each range reached (its end, or less when the batch
        was cancelled or its source stalled). A failure ends in the batch's one line."""
        lines = java_lines(
            self.java, [f"{t}\t{p}\t{start}\t{until}" for (t, p), start, until in ranges]
        )
        settings.put("batch", batch)
        context = self.spark.context
        try:
            if local:
                encoded = self.java.copyLocal(lines, settings)
            else:
                context.setJobDescription(description)
                try:
                    encoded = self.java.copy(context._jsc, lines, settings)
                finally:
                    # None clears it (pyspark annotates str)
                    context.setJobDescription(None)  # type: ignore[arg-type]
        except Exception as exc:  # py4j's error: its text holds the copier's message
            raise batch_error(self.spec, exc) from None
        return CopierResult.decode(bytes(encoded), [tp for tp, _start, _until in ranges])


def copier_settings(
    spec: MirrorSpec, mapping: dict[str, str], limits: dict[str, int]
) -> dict[str, str]:
    """The copier's settings (see ``MirrorCopier``'s documentation) for ``spec``'s flow copying
    ``mapping`` (source topic -> remote topic), whose remote topics take records of at most
    ``limits`` bytes: its clients' Java properties (``consumer.*``, ``producer.*``, a stream's
    own ``stream.producer.*``, ``syncs.producer.*``), the remote topics and their limits, the
    offset syncs' settings. Not the record transforms (:meth:`JvmCopier.transform_plan`)."""
    largest = min(max(max(limits.values(), default=0), 1 << 20) + (64 << 10), (1 << 31) - 1)
    smallest = min(limits.values(), default=None)

    def batch_size(size: int | str) -> str:  # see BATCHES_BATCH_SIZE: at most a topic's limit
        return str(int(size) if smallest is None else min(int(size), smallest))

    producer = {
        "linger.ms": "20",
        **spec.target_producer,
        "batch.size": batch_size(spec.target_producer.get("batch.size", BATCHES_BATCH_SIZE)),
        "enable.idempotence": "true",
        "acks": "all",
        "max.request.size": str(largest),
        "buffer.memory": str(min(max(64 << 20, 2 * largest), 256 << 20)),
    }
    settings = {
        "source": spec.source,
        "target": spec.target,
        "source.principal": principal(spec.source_consumer),
        "target.principal": principal(spec.target_producer),
        "record.overhead": str(mirror_writer.RECORD_OVERHEAD),
        "poll.timeout.ms": str(int(SOURCE_STALL_S * 1000)),
        "error.prefix": mirror_writer.ERROR_PREFIX,
        **{f"consumer.{k}": v for k, v in spec.source_consumer.items()},
        **{f"producer.{k}": v for k, v in producer.items()},
        **{f"topic.{src}": rem for src, rem in mapping.items()},
        **{f"limit.{rem}": str(limit) for rem, limit in limits.items()},
        # A stream reads heartbeat topics once a beat, not as each heartbeat arrives.
        **{f"paced.{src}": "true" for src in mapping if spec.is_heartbeats_topic(src)},
    }
    # A stream's producer: its copies wait less (latency), and its batches are Kafka's default
    # size, unless the flow sets them.
    if "linger.ms" not in spec.target_producer:
        settings["stream.producer.linger.ms"] = str(STREAM_LINGER_MS)
    if "batch.size" not in spec.target_producer:
        settings["stream.producer.batch.size"] = batch_size(STREAM_BATCH_SIZE)
    settings["stream.end.grace.ms"] = str(spec.stop_grace_ms)
    if spec.emit_offset_syncs:
        settings["syncs.topic"] = spec.offset_syncs_topic
        settings["syncs.lag.max"] = str(spec.max_offset_lag)
        settings["syncs.interval.ms"] = str(spec.offset_flush_interval_ms)
        settings["syncs"] = spec.offset_syncs_cluster
        settings["syncs.principal"] = principal(spec.offset_syncs_producer)
        for k, v in spec.offset_syncs_producer.items():
            settings[f"syncs.producer.{k}"] = v
    return settings
