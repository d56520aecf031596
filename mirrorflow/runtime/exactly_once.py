"""An exactly-once batch seen from its driver: Spark's Kafka batch source reads the batch's
ranges (:func:`read_ranges`), the Python workers copy each source partition in a Kafka
transaction that also commits its position and its runs of the offset map
(:func:`copy_in_transactions`, with :func:`mirrorflow.runtime.eos_writer.copy_records` on the
executors), and a failed or cancelled batch's partitions are fenced (:func:`fence`), which
aborts their open transactions: nothing of it becomes visible but what it committed. A small
batch is read and copied in the driver by the same writer, without a Spark job, all its
partitions in one transaction (:func:`copy_in_driver`, :mod:`mirrorflow.runtime.range_reader`),
which may take past its ranges what arrives until it commits (``follow``).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from mirrorflow.mm2.formats import OffsetSync
from mirrorflow.replication.offset_map import OffsetMap, Run
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.runtime import eos_writer, record_transforms
from mirrorflow.runtime.copier import SOURCE_STALL_S
from mirrorflow.runtime.metrics import Copied, Stats
from mirrorflow.runtime.spark_session import JobSpark, kafka_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from mirrorflow.runtime.range_reader import RangeReader

Partition = tuple[str, int]

# Spark's Kafka batch source asks the source for its partitions in the driver, before a job
# starts (for the starts, then the ends), which no job cancellation reaches: each call gives
# up after this long (its requests too), tried once, unless the flow's consumer sets
# default.api.timeout.ms (60 s by Kafka's default).
SOURCE_PLAN_TIMEOUT_S = 5.0


def reader_group(flow: str) -> str:
    """The group id of a flow's Spark Kafka reads: the same for every batch, so Spark's
    executors reuse their pooled consumers. Never joined nor committed: no ACL."""
    return f"mirrorflow-reader-{flow}"


def transactional_prefix(spec: MirrorSpec) -> str:
    """The transactional ids of a flow's copies: ``<prefix>-<topic>-<partition>``, one per
    source partition, so that a new task of a partition fences its earlier ones, and
    ``<prefix>-driver``, the driver's small batches' (all their partitions in one transaction)."""
    return f"mirrorflow-{spec.source}->{spec.target}"


def fence(spec: MirrorSpec, producer_config: dict, partitions: list[Partition]) -> None:
    """Fence the transactional producers of the flow's ``partitions`` and the driver's on its
    target, which aborts their open transactions (a
    :class:`~mirrorflow.errors.MirrorflowError` names those the target did not let it fence)."""
    prefix = transactional_prefix(spec)
    eos_writer.abort_transactions(
        spec.target,
        producer_config,
        [
            eos_writer.driver_transactional_id(prefix),
            *(eos_writer.transactional_id(prefix, *tp) for tp in partitions),
        ],
        spec.offsets_topic,
        SOURCE_STALL_S,
    )


def read_ranges(
    spark: SparkSession, spec: MirrorSpec, ranges: list[tuple[Partition, int, int]]
) -> DataFrame:
    """The ranges (partition, first offset, end) as a DataFrame of Spark's Kafka batch
    source."""
    assign: dict[str, list[int]] = {}
    starts: dict[str, dict[str, int]] = {}
    ends: dict[str, dict[str, int]] = {}
    for (topic, partition), start, until in ranges:
        assign.setdefault(topic, []).append(partition)
        starts.setdefault(topic, {})[str(partition)] = start
        ends.setdefault(topic, {})[str(partition)] = until
    consumer = dict(spec.source_consumer)
    if "default.api.timeout.ms" not in consumer:  # at least request.timeout.ms, as Kafka asks
        plan_ms = int(SOURCE_PLAN_TIMEOUT_S * 1000)
        request_ms = int(consumer.setdefault("request.timeout.ms", str(plan_ms)))
        consumer["default.api.timeout.ms"] = str(max(plan_ms, request_ms))
    return (
        spark.read.format("kafka")
        .options(**kafka_options(consumer))
        # One group id per flow, not Spark's new one per query: executors' pooled consumers
        # are keyed by group id and partition, so each batch reuses the last batch's
        # connections (and the records it fetched past its end) instead of a new consumer
        # per partition (connect, SASL, metadata, a full fetch): over a 50 ms link that
        # was most of each batch's 5-7 s. Never joined nor committed (``assign``).
        .option("kafka.group.id", reader_group(spec.flow))
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starts))
        .option("endingOffsets", json.dumps(ends))
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "false")
        .option("kafkaConsumer.pollTimeoutMs", str(int(SOURCE_STALL_S * 1000)))
        # One try of each planning call (SOURCE_PLAN_TIMEOUT_S): a failed batch is retried
        # by the flow, with backoff, and a hold is not kept waiting by Spark's retries.
        .option("fetchOffset.numRetries", "1")
        .load()
    )


@dataclass
class TransactionalCopy:
    """What an exactly-once batch committed: records and bytes in all, each partition's runs
    of copies (by target offset) and figures, the offset syncs to write (in order), and the
    offset after each partition's last copy (``reached``)."""

    records: int = 0
    bytes: int = 0
    runs: dict[Partition, list[Run]] = field(default_factory=dict)
    copied: dict[Partition, Copied] = field(default_factory=dict)
    syncs: list[OffsetSync] = field(default_factory=list)
    reached: dict[Partition, int] = field(default_factory=dict)


def copy_in_transactions(frame: DataFrame, settings: eos_writer.CopySettings) -> TransactionalCopy:
    """Copy the records of ``frame`` (:func:`read_ranges`) of the topics
    ``settings.remote_topics`` maps, each source partition in transactions of its own that
    also commit its position and its runs (see :class:`eos_writer.CopySettings`)."""
    from pyspark.sql import functions as F

    def copy(batches):
        return eos_writer.copy_records(settings, map(eos_writer.records_of, batches))

    rows = (
        frame.where(F.col("topic").isin(list(settings.remote_topics)))
        .select(
            "topic",
            "partition",
            "offset",
            "key",
            "value",
            # Headers as JSON text (values base64): Arrow's conversion of an array of
            # structs costs more than all the rest of the copy (ListVector.setValueCount).
            F.when(
                F.size("headers") > 0,
                F.to_json(
                    F.transform(
                        "headers",
                        lambda h: F.struct(h.key.alias("k"), F.base64(h.value).alias("v")),
                    )
                ),
            ).alias("headers"),
            F.expr("unix_millis(timestamp)").alias("ts_ms"),
            *([eos_writer.KEEP_COLUMN] if eos_writer.KEEP_COLUMN in frame.columns else []),
        )
        # As many tasks as the application has slots, not one per source partition: each task
        # pays a Python worker's round and a check of the flow's lease, and a few hundred
        # records per partition (a caught-up flow's batch) took a wave of tasks per slot.
        .coalesce(frame.sparkSession.sparkContext.defaultParallelism)
        .mapInArrow(copy, eos_writer.RESULT_DDL)
        .collect()
    )
    return _collect(rows)


@dataclass
class DriverCopy:
    """What the driver keeps for its small exactly-once batches (:func:`copy_in_driver`): its
    reader of the source, its transactional producer from one batch to the next (by its
    transactional id, :func:`~mirrorflow.runtime.eos_writer.driver_transactional_id`), and its
    check that it still holds the flow's lease."""

    reader: RangeReader
    confirm: Callable[[], None]
    producers: dict[str, Any] = field(default_factory=dict)

    def drop_producers(self) -> None:
        """Forget the kept producer (a batch failed: its state is unknown; or the flow's
        transactional ids were fenced)."""
        self.producers.clear()


def copy_in_driver(
    driver: DriverCopy,
    ranges: list[tuple[Partition, int, int]],
    settings: eos_writer.CopySettings,
    follow: dict[Partition, int] | None = None,
    until: float | None = None,
) -> TransactionalCopy:
    """Copy ``ranges`` as :func:`copy_in_transactions` does, in this process, all in one
    transaction: the driver's reader reads them (and, ``follow``, what arrives until ``until``:
    :meth:`~mirrorflow.runtime.range_reader.RangeReader.read`), and the same writer copies them
    as they come with the producer the driver kept (a small batch, without a Spark job). A
    failure drops it."""
    results = eos_writer.copy_records(
        settings, driver.reader.read(ranges, follow, until), driver.producers, driver.confirm
    )
    try:
        rows = [SimpleNamespace(**row) for batch in results for row in batch.to_pylist()]
    except BaseException as exc:
        driver.drop_producers()
        # The failed batch's producers go now, not with its traceback's frames, which may be
        # kept until the interpreter's exit: a librdkafka client destroyed then may call back
        # into a finalized interpreter. (A job whose first batch in the driver was refused
        # its transactional id exited with SIGSEGV once in a suite run; not reproduced alone.)
        traceback.clear_frames(exc.__traceback__)
        raise
    return _collect(rows)


def _collect(rows: list[Any]) -> TransactionalCopy:
    """What the writer's result rows (``eos_writer.RESULT_SCHEMA``, as attributes) say."""
    result = TransactionalCopy()
    for r in rows:
        if r.kind == "run":
            result.runs.setdefault((r.topic, r.partition), []).append(
                Run(r.upstream, r.downstream, r.records)
            )
    for partition_runs in result.runs.values():
        partition_runs.sort(key=lambda run: run.downstream)
    result.syncs = [
        OffsetSync(r.topic, r.partition, r.upstream, r.downstream)
        for r in sorted(rows, key=lambda r: (r.topic, r.partition, r.upstream))
        if r.kind != "run"
    ]
    for r in rows:
        if r.kind != "last":
            continue
        tp = (r.topic, r.partition)
        result.reached[tp] = max(result.reached.get(tp, 0), r.upstream + 1)
        figures = Copied(
            r.records,
            r.bytes,
            Stats.of(r.age_min, r.age_max, r.age_sum, r.age_count),
            Stats.of(r.latency_min, r.latency_max, r.latency_sum, r.latency_count),
        )
        result.copied[tp] = result.copied[tp].merge(figures) if tp in result.copied else figures
        result.records += r.records
        result.bytes += r.bytes
    return result


def copy_batch(
    spark: JobSpark,
    spec: MirrorSpec,
    ranges: list[tuple[Partition, int, int]],
    *,
    mapping: dict[str, str],
    producer_config: dict,
    max_message_bytes: dict[str, int],
    positions: dict[Partition, int],
    offset_map: OffsetMap,
    lease_holder: dict | None,
    driver: DriverCopy | None = None,
    follow: dict[Partition, int] | None = None,
    until: float | None = None,
) -> TransactionalCopy:
    """One exactly-once batch of the flow ``spec``: Spark's Kafka batch source reads ``ranges``
    (the flow's record transforms applied, if any), and the Python workers copy each source
    partition to its remote topic (``mapping``) in transactions that also commit its position
    (after ``positions``) and its runs, which are then added to ``offset_map``. The offset
    syncs it returns are for the caller to write once it returns. With ``driver`` (a flow
    without record transforms), the driver reads and copies the ranges itself
    (:func:`copy_in_driver`), and what arrives meanwhile in ``follow``'s partitions until
    ``until``."""
    settings = eos_writer.CopySettings(
        source_alias=spec.source,
        target_alias=spec.target,
        producer_config=producer_config,
        remote_topics=mapping,
        max_message_bytes=max_message_bytes,
        max_offset_lag=spec.max_offset_lag,
        transactional_id_prefix=transactional_prefix(spec),
        committed={tp: position - 1 for tp, position in positions.items()},
        offsets_topic=spec.offsets_topic,
        consumer_config=spec.target_consumer,
        admin_config=spec.target_admin,
        map_topic=spec.offset_map_topic,
        flow=spec.flow,
        lease_holder=lease_holder,
        last_runs={tp: run for tp in positions if (run := offset_map.last_run(tp)) is not None},
    )
    if driver is not None and spec.transform is None:
        result = copy_in_driver(driver, ranges, settings, follow, until)
    else:
        frame = read_ranges(spark.session, spec, ranges)
        if spec.transform is not None:
            frame = record_transforms.with_transform(frame, spec.flow, mapping, spec.transform)
        result = copy_in_transactions(frame, settings)
    for tp, partition_runs in result.runs.items():
        offset_map.add(tp, partition_runs)
    return result
