"""The executor side of the exactly-once mirror job: copy Kafka records in transactions.

In exactly-once mode (``<target>.exactly.once.source.support = enabled``) Spark's Kafka batch source
reads the offset ranges the driver planned; each Spark task gets the records of one source partition
and hands them, as Arrow batches made Python columns (:func:`records_of`), to :func:`copy_records`,
which runs in a Python worker. It produces every record to the same partition of the remote topic
with the same key, value, headers and timestamp through that partition's transactional
confluent-kafka producer, adds the partition's position as MirrorMaker 2's own record of Connect's
offsets topic, and commits both together. The delivery reports give the exact downstream offset of
each copy: it returns the offset syncs that MirrorMaker 2's rule makes due (a fresh rule state per
task, so never fewer syncs than MirrorMaker 2) plus the last copy of each partition, which the
driver writes once the batch is committed. A small batch runs it in the driver instead
(:func:`mirrorflow.runtime.exactly_once.copy_in_driver`), over the driver's own read of the ranges,
all its partitions in one transaction, with the producer kept from one batch to the next.

(At-least-once copies never come here: mirrorflow's JVM copier writes them, see
:mod:`mirrorflow.runtime.driver`.)

Nothing here imports Spark but a task's attempt number: plain Python over ``pyarrow`` batches
and column dicts.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import pyarrow as pa

from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.offset_syncs import PartitionSyncState
from mirrorflow.replication import clients
from mirrorflow.replication.offset_map import PartitionMap, Run, record_of, runs_of
from mirrorflow.replication.topics import client_principal, refusal, unauthorized

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Producer  # imported where used, as the others

STATS = ("min", "max", "sum", "count")
INPUT_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers", "ts_ms")
"""The columns of the records :func:`copy_records` takes, as :data:`Records`."""
Records = dict[str, list[Any]]
"""Records as columns of Python values, :data:`INPUT_COLUMNS` (and :data:`KEEP_COLUMN`, if the
flow has record transforms), ``headers`` a list of ``(key, value)`` (``None``: no headers): the
driver's reader builds them so (:mod:`mirrorflow.runtime.range_reader`); a Spark task's Arrow
batch becomes them with :func:`records_of`."""
KEEP_COLUMN = "keep"
"""Present when the flow has record transforms: false for a record they drop (not copied; the
partition's position still moves past it)."""
RESULT_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("upstream", pa.int64()),
        ("downstream", pa.int64()),
        # "sync": due now; "last": the partition's last copy; "run": a run of copies (records =
        # its count) for the offset map
        ("kind", pa.string()),
        ("records", pa.int64()),
        ("bytes", pa.int64()),
        # on "last": record age when read and replication latency when committed (now minus
        # the record's timestamp, ms; MirrorMaker 2's record-age-ms, replication-latency-ms)
        *((f"{stat}_{what}", pa.int64()) for stat in ("age", "latency") for what in STATS),
    ]
)
RESULT_DDL = (
    "topic string, partition int, upstream long, downstream long, kind string, "
    "records long, bytes long, "
    + ", ".join(f"{stat}_{what} long" for stat in ("age", "latency") for what in STATS)
)
ERROR_PREFIX = "mirrorflow-copy-error: "
# Extra bytes a record takes in a record batch beyond its key, value and headers.
RECORD_OVERHEAD = 100


class CopyError(RuntimeError):
    """A record could not be copied; the message names topic, partition and offset."""

    def __init__(self, message: str) -> None:
        super().__init__(ERROR_PREFIX + message)


@dataclass(frozen=True)
class CopySettings:
    """What a task needs to copy records: picklable plain data, shipped with the task."""

    source_alias: str
    target_alias: str
    producer_config: dict[str, Any] = field(repr=False)  # librdkafka's: str, int or bool
    remote_topics: dict[str, str]
    max_message_bytes: dict[str, int]
    max_offset_lag: int
    # Each source partition's copies and its position record commit in one transaction;
    # offsets at or below the committed position are already on the target and are skipped.
    transactional_id_prefix: str
    offsets_topic: str
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    consumer_config: dict[str, str] = field(default_factory=dict, repr=False)
    admin_config: dict[str, str] = field(default_factory=dict, repr=False)
    flush_timeout_s: float = 300.0
    # The offset map (see mirrorflow.replication.offset_map): its topic on the target, and each
    # partition's last run, which a batch's first copies may continue.
    map_topic: str = ""
    last_runs: dict[tuple[str, int], Run] = field(default_factory=dict)
    # The flow and the holder of its lease (asdict of lease.Holder): checked once a task's
    # producers have fenced their partitions' earlier ones, before they commit (lease.confirm).
    flow: str = ""
    lease_holder: dict[str, Any] | None = None


def transactional_id(prefix: str, topic: str, partition: int) -> str:
    """The ``transactional.id`` of a Spark task's copies of one source partition (``prefix``:
    ``mirrorflow-S->T``)."""
    return f"{prefix}-{topic}-{partition}"


def driver_transactional_id(prefix: str) -> str:
    """The ``transactional.id`` of the driver's small batches: one transaction holds all their
    partitions (it ends in a word, so no partition's id, which ends in a number, is the same)."""
    return f"{prefix}-driver"


def abort_transactions(
    cluster: str,
    producer_config: dict,
    transactional_ids: list[str],
    offsets_topic: str,
    timeout_s: float = 30.0,
) -> None:
    """Fence the transactional producers of ``transactional_ids`` (a producer initialised with
    the same ``transactional.id``), which aborts their open transactions: a worker killed
    mid-batch leaves its transaction open, and an open transaction holds back every
    read_committed consumer of the partition until ``transaction.timeout.ms``. A
    :class:`MirrorflowError` names the ids that could not be fenced (on ``cluster``, the
    target, which holds ``offsets_topic``)."""
    from concurrent.futures import ThreadPoolExecutor

    from confluent_kafka import KafkaException

    def fence(txn_id: str) -> str | None:
        producer = clients.producer(cluster, {**producer_config, "transactional.id": txn_id})
        try:
            clients.init_transactions(producer, offsets_topic, timeout_s)
            return None
        except KafkaException as exc:
            return f"{txn_id}: {exc.args[0].str()}"

    if not transactional_ids:
        return
    with ThreadPoolExecutor(max_workers=min(8, len(transactional_ids))) as pool:
        failed = [f for f in pool.map(fence, transactional_ids) if f is not None]
    if failed:
        raise MirrorflowError(
            f"could not abort the open transactions of {len(failed)} transactional id(s): "
            + "; ".join(failed[:3]),
            "they end after the target's transaction timeout (transaction.timeout.ms)",
        )


def _transactional_producer(settings: CopySettings, txn_id: str):
    """A new transactional producer, with a transaction begun.

    Its ``transactional.id`` is stable per flow and partition (the driver's: per flow), so
    initialising it fences off any earlier producer of the same id (a zombie of a previous
    attempt or job, or the one another Python worker used for an earlier batch) and aborts
    its open transaction. A Spark task's producer is therefore never reused across tasks:
    another worker may have fenced it since (the driver keeps its one: see
    :func:`copy_records`).
    """
    from confluent_kafka import KafkaException

    producer = clients.producer(
        settings.target_alias,
        {
            **settings.producer_config,
            "transactional.id": txn_id,
            "partitioner": "murmur2_random",  # Java's partitioner, as Connect's offsets topic uses
        },
    )
    try:
        clients.init_transactions(producer, settings.offsets_topic, settings.flush_timeout_s)
    except KafkaException as exc:
        _start_failed(settings, txn_id, exc)
    _begin(settings, producer, txn_id)
    return producer


def _begin(settings: CopySettings, producer: Producer, txn_id: str) -> None:
    from confluent_kafka import KafkaException

    try:
        producer.begin_transaction()
    except KafkaException as exc:
        _start_failed(settings, txn_id, exc)


def _start_failed(settings: CopySettings, txn_id: str, exc: Exception) -> NoReturn:
    error = exc.args[0]
    action = f"starting a transaction ({txn_id})"
    needs = f"WRITE on transactional ids prefixed {settings.transactional_id_prefix}-"
    _raise_if_refused(settings, action, error, needs)
    raise CopyError(
        f"starting a transaction ({txn_id}) on {settings.target_alias} failed: {error.str()}"
    ) from None


def _confirm_lease(settings: CopySettings, holder: dict[str, Any], partitions) -> None:
    """The job still holds the flow's lease (checked after the task's producers fenced their
    partitions' earlier ones, before any of them commits: once per task, for all of them), or
    every transaction of the task is aborted and the task fails in one line."""
    from mirrorflow.replication import lease

    try:
        lease.confirm(
            settings.flow,
            settings.target_alias,
            settings.consumer_config,
            settings.admin_config,
            lease.Holder(**holder),
        )
    except MirrorflowError as exc:
        _abort_all(settings, partitions)
        raise CopyError(str(exc)) from None


def _transactions(partitions) -> dict[str, list[_Partition]]:
    """The partitions by the transaction holding their copies (the driver's hold all theirs in
    one; a Spark task's, each its own)."""
    groups: dict[str, list[_Partition]] = {}
    for p in partitions.values():
        groups.setdefault(p.txn_id, []).append(p)
    return groups


def _abort_all(settings: CopySettings, partitions) -> None:
    for group in _transactions(partitions).values():
        group[0].producer.abort_transaction(settings.flush_timeout_s)


class _Acks:
    """Delivery reports of one partition's copies, in production order."""

    __slots__ = ("downstream", "error", "error_index")

    def __init__(self) -> None:
        self.downstream: list[int] = []
        self.error: KafkaError | None = None
        self.error_index = -1

    def __call__(self, err, msg) -> None:
        if err is None:
            self.downstream.append(msg.offset())
        elif self.error is None:
            self.error, self.error_index = err, len(self.downstream)


@dataclass
class _Partition:
    topic: str
    partition: int
    remote: str
    producer: Producer
    txn_id: str
    skip_through: int = -1  # exactly-once: upstream offsets already committed on the target
    acks: _Acks = field(default_factory=_Acks)
    upstream: list[int] = field(default_factory=list)
    seen: int = -1  # the last offset read this batch, copied or dropped by the transforms
    bytes: int = 0
    # the copies' record ages when read (ms) and their records' timestamps: min, max, sum, count
    age: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    timestamps: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    committed_at_ms: int = 0
    runs: list[Run] = field(default_factory=list)  # this batch's copies, for the offset map


def records_of(batch: pa.RecordBatch) -> Records:
    """A Spark task's Arrow batch (``headers`` as JSON, see :func:`_decode_headers`) as
    :data:`Records`."""
    names = [*INPUT_COLUMNS, *([KEEP_COLUMN] if KEEP_COLUMN in batch.schema.names else [])]
    records = {name: batch.column(name).to_pylist() for name in names}
    records["headers"] = [_decode_headers(h) if h else None for h in records["headers"]]
    return records


def copy_records(
    settings: CopySettings,
    batches: Iterable[Records],
    producers: dict[str, Producer] | None = None,
    confirm: Callable[[], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Copy the records in ``batches`` to the target; yield syncs and per-partition totals
    (one Arrow batch, :data:`RESULT_SCHEMA`).

    A Spark task starts a transactional producer per source partition, which fences the earlier
    ones, and commits one transaction per partition. The driver's small batches
    (:func:`mirrorflow.runtime.exactly_once.copy_in_driver`) copy all their partitions in one
    transaction, of the producer of :func:`driver_transactional_id`, which they keep in
    ``producers`` (by transactional id) from one batch to the next; ``confirm`` (the driver's
    own check that its lease is fresh) replaces the task's read of the leases topic. A caller
    whose batch failed, or that fences the flow's transactional ids, drops it: its state is
    unknown, or it is fenced."""
    committed = dict(settings.committed)
    if _task_attempt() > 0:
        # A retried task may follow an attempt that committed before it failed.
        from mirrorflow.replication.positions import SourceOffsetReader

        reader = SourceOffsetReader(
            settings.consumer_config,
            settings.admin_config,
            settings.offsets_topic,
            settings.source_alias,
            cluster=settings.target_alias,
        )
        try:
            committed.update(reader.read_to_end())
        finally:
            reader.close()
    partitions: dict[tuple[str, int], _Partition] = {}
    begun: dict[str, Producer] = {}  # the producers whose transaction this batch began
    mapped: set[str] = set()  # the transactions holding the offset map's partition (_enlist)
    for batch in batches:
        _produce_batch(settings, batch, partitions, committed, producers, begun, mapped)
    _commit_transactions(settings, partitions, confirm)
    _check_acks(settings, partitions)
    yield _results(settings, partitions)


def _task_attempt() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.attemptNumber() if context is not None else 0


def _new_partition(
    settings: CopySettings,
    topic: str,
    part: int,
    committed,
    producers: dict | None,
    begun: dict[str, Producer],
    mapped: set[str],
) -> _Partition:
    remote = settings.remote_topics.get(topic)
    if remote is None:
        raise CopyError(f"no remote topic was prepared for source topic {topic}")
    prefix = settings.transactional_id_prefix
    if producers is None:
        txn_id = transactional_id(prefix, topic, part)
    else:
        txn_id = driver_transactional_id(prefix)
    producer = begun.get(txn_id)
    if producer is None:
        producer = producers.pop(txn_id, None) if producers is not None else None
        if producer is not None:
            _begin(settings, producer, txn_id)
        else:
            producer = _transactional_producer(settings, txn_id)
        if producers is not None:
            producers[txn_id] = producer
        begun[txn_id] = producer
    p = _Partition(topic, part, remote, producer, txn_id, committed.get((topic, part), -1))
    _enlist(settings, p, mapped)
    return p


def _enlist(settings: CopySettings, p: _Partition, mapped: set[str]) -> None:
    """Put the partitions that ``p``'s commit writes (its position's partition of the offsets
    topic, and the offset map's unless its transaction is in ``mapped``) in its transaction
    now, while it copies, by writing what they already hold: the committed position, the last
    run. A transactional producer adds a partition to its transaction (a round trip to the
    coordinator) before its first record there; left to the commit, that round trip delays
    every copy of the transaction. The same key and value again change nothing a reader sees."""
    from mirrorflow.mm2.formats import SourceOffset

    records: list[tuple[str, bytes, bytes, int]] = []  # -1: the partitioner's partition
    if p.skip_through >= 0:
        position = SourceOffset(settings.source_alias, p.topic, p.partition, p.skip_through)
        records.append((settings.offsets_topic, position.value(), position.key(), -1))
    last = settings.last_runs.get((p.topic, p.partition))
    if settings.map_topic and last is not None and p.txn_id not in mapped:
        key, value = record_of((p.topic, p.partition), last)
        records.append((settings.map_topic, value, key, 0))
        mapped.add(p.txn_id)
    for topic, value, key, partition in records:
        while True:
            try:
                p.producer.produce(topic, value, key, partition=partition)
                break
            except BufferError:  # its queue is full of copies: as the copies wait for room
                p.producer.poll(0.05)


def _produce_batch(
    settings: CopySettings, cols: Records, partitions, committed, producers, begun, mapped
) -> None:
    keep = cols.get(KEEP_COLUMN)
    now_ms = int(time.time() * 1000)
    current = None
    for i in range(len(cols["offset"])):
        topic, part = cols["topic"][i], cols["partition"][i]
        if current is None or current.topic != topic or current.partition != part:
            current = partitions.get((topic, part))
            if current is None:
                current = partitions[(topic, part)] = _new_partition(
                    settings, topic, part, committed, producers, begun, mapped
                )
            limit = settings.max_message_bytes.get(current.remote, 1 << 62)
            produce, poll = current.producer.produce, current.producer.poll
        if cols["offset"][i] <= current.skip_through:
            continue
        current.seen = cols["offset"][i]
        if keep is not None and not keep[i]:
            continue  # dropped by the flow's transforms: a gap in the offset map
        key, value, headers, ts = (
            cols["key"][i],
            cols["value"][i],
            cols["headers"][i],
            cols["ts_ms"][i],
        )
        size = (len(key) if key else 0) + (len(value) if value else 0)
        if headers:
            size += sum(len(k) + (len(v) if v else 0) for k, v in headers)
        if size + RECORD_OVERHEAD > limit:
            raise CopyError(
                f"record {topic}-{part}@{cols['offset'][i]} ({size} bytes) is larger than "
                f"max.message.bytes={limit} of {current.remote} on {settings.target_alias}; "
                f"raise max.message.bytes on the target topic (nothing after it was copied)"
            )
        while True:
            try:
                produce(
                    current.remote,
                    value,
                    key,
                    partition=part,
                    timestamp=ts,
                    headers=headers or None,
                    on_delivery=current.acks,
                )
                break
            except BufferError:
                poll(0.05)
        current.upstream.append(cols["offset"][i])
        current.bytes += size
        if ts is not None:
            _add(current.age, max(0, now_ms - ts))
            _add(current.timestamps, ts)
        if i % 1000 == 0:
            poll(0)


def _add(stats: list[int], value: int) -> None:
    """Add ``value`` to ``[min, max, sum, count]``."""
    if stats[3] == 0 or value < stats[0]:
        stats[0] = value
    if stats[3] == 0 or value > stats[1]:
        stats[1] = value
    stats[2] += value
    stats[3] += 1


def _latency(p: _Partition) -> list[int]:
    """The partition's replication latencies ``[min, max, sum, count]`` (ms): its commit time
    minus each copy's record timestamp (never below 0)."""
    low, high, total, count = p.timestamps
    if not count:
        return [0, 0, 0, 0]
    at = p.committed_at_ms
    return [max(0, at - high), max(0, at - low), max(0, count * at - total), count]


def _decode_headers(text: str) -> list[tuple[str, bytes | None]]:
    """Headers as the Spark job encodes them: JSON ``[{"k": key, "v": base64 value}]``, with
    ``v`` absent for a null value."""
    return [(h["k"], base64.b64decode(h["v"]) if "v" in h else None) for h in json.loads(text)]


def _commit_transactions(
    settings: CopySettings, partitions, confirm: Callable[[], None] | None = None
) -> None:
    """Add each partition's offset-map runs and position to its transaction and commit it (a
    transaction with no partition read is aborted)."""
    from confluent_kafka import KafkaException

    from mirrorflow.mm2.formats import SourceOffset

    if confirm is not None and partitions:
        try:
            confirm()
        except MirrorflowError as exc:
            _abort_all(settings, partitions)
            raise CopyError(str(exc)) from None
    elif settings.lease_holder is not None and partitions:
        _confirm_lease(settings, settings.lease_holder, partitions)

    for group in _transactions(partitions).values():
        producer = group[0].producer
        read = [p for p in group if p.seen >= 0]
        try:
            if not read:
                producer.abort_transaction(settings.flush_timeout_s)
                continue
            if settings.map_topic and any(p.upstream for p in read):
                # Every copy acknowledged first, once for the whole transaction (a flush per
                # partition waits a round trip each for the runs produced before it).
                producer.flush(settings.flush_timeout_s)
            for p in read:
                if settings.map_topic and p.upstream:
                    _add_runs(settings, p)
                # Past the records the transforms dropped too, as Connect commits the source
                # offsets of the records its transforms drop.
                position = SourceOffset(settings.source_alias, p.topic, p.partition, p.seen)
                producer.produce(settings.offsets_topic, position.value(), position.key())
            producer.commit_transaction(settings.flush_timeout_s)
            committed_at_ms = int(time.time() * 1000)
            for p in read:
                p.committed_at_ms = committed_at_ms
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                producer.abort_transaction(settings.flush_timeout_s)
            copies = ", ".join(f"{p.topic}-{p.partition}" for p in read[:3]) + (
                f" and {len(read) - 3} more partitions" if len(read) > 3 else ""
            )
            remotes = ", ".join(sorted({p.remote for p in read}))
            _raise_if_refused(
                settings,
                f"committing the copies of {copies} to {remotes}",
                error,
                f"WRITE on topics {remotes}, {settings.offsets_topic} and {settings.map_topic}",
            )
            raise CopyError(
                f"committing the copies of {copies} to {remotes} on "
                f"{settings.target_alias} failed: {error.str()} (nothing of it was committed)"
            ) from None


def _add_runs(settings: CopySettings, p: _Partition) -> None:
    """Write the runs of the partition's copies to the offset map, in its transaction (its
    copies flushed: once every copy is acknowledged; otherwise the commit fails anyway)."""
    if p.acks.error is not None or len(p.acks.downstream) != len(p.upstream):
        return
    p.runs = runs_of(p.upstream, p.acks.downstream)
    last = settings.last_runs.get((p.topic, p.partition))
    for run in PartitionMap([last] if last else []).add(p.runs):
        key, value = record_of((p.topic, p.partition), run)
        p.producer.produce(settings.map_topic, value, key, partition=0)


def _raise_if_refused(settings: CopySettings, action: str, error, needs: str) -> None:
    """A missing ACL on the target as the one line naming cluster, principal and the ACL."""
    if unauthorized(error):
        principal = client_principal(settings.producer_config)
        raise CopyError(str(refusal(settings.target_alias, principal, action, error.str(), needs)))


def _check_acks(settings: CopySettings, partitions) -> None:
    for p in partitions.values():
        if p.acks.error is not None:
            err = p.acks.error
            _raise_if_refused(
                settings, f"writing {p.remote}-{p.partition}", err, f"WRITE on topic {p.remote}"
            )
            offset = p.upstream[p.acks.error_index] if p.acks.error_index < len(p.upstream) else "?"
            raise CopyError(
                f"copying {p.topic}-{p.partition}@{offset} to {p.remote} on "
                f"{settings.target_alias} failed: {err.name()}: {err.str()}"
            )
        if len(p.acks.downstream) != len(p.upstream):
            raise CopyError(
                f"{p.topic}-{p.partition}: {len(p.upstream)} records sent to {p.remote} but "
                f"{len(p.acks.downstream)} acknowledged"
            )


def _results(settings: CopySettings, partitions) -> pa.RecordBatch:
    rows: dict[str, list] = {name: [] for name in RESULT_SCHEMA.names}

    none = [0] * (2 * len(STATS))

    def add(p: _Partition, up: int, down: int, kind: str, records: int, size: int, stats):
        for name, value in zip(
            RESULT_SCHEMA.names,
            (p.topic, p.partition, up, down, kind, records, size, *stats),
            strict=True,
        ):
            rows[name].append(value)

    for p in partitions.values():
        if not p.upstream:
            continue
        state = PartitionSyncState(max_offset_lag=settings.max_offset_lag)
        for index in state.update_batch(p.upstream, p.acks.downstream):
            add(p, p.upstream[index], p.acks.downstream[index], "sync", 0, 0, none)
        for run in p.runs:
            add(p, run.upstream, run.downstream, "run", run.count, 0, none)
        stats = [*p.age, *_latency(p)]
        add(p, p.upstream[-1], p.acks.downstream[-1], "last", len(p.upstream), p.bytes, stats)
    return pa.RecordBatch.from_pydict(rows, schema=RESULT_SCHEMA)
