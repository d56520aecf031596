"""A flow's lag as the clusters say it is, not as its job last reported it.

Lag in records, per source partition, is the source's end offset (its last stable offset when the
flow reads ``read_committed``) minus the flow's position (the next offset to copy); lag in seconds
is the age of the oldest record not copied: now minus the source timestamp of the record at the
partition's position (the first record the flow will copy there). :func:`measure` reads both
from the source, for given positions: the mirror job measures its flows every
:data:`MEASURE_EVERY_S` (busy, idle, paused, or while its target is away), and whoever renders a
flow's health measures it when no job reports it (stalled, stopped), reading the positions from
the target (:func:`~mirrorflow.replication.remote_cluster.flow_positions`).

The timestamps come from a consumer assigned at the positions of the partitions behind, which
never joins nor commits its group (READ on the topics is all it needs, as the job's). A record
removed by retention is past: the first record still there is read instead (the oldest the flow
can still copy).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from mirrorflow.replication import clients
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ADMIN_TIMEOUT_S, ClusterAdmin, cluster_error

Partition = tuple[str, int]

MEASURE_EVERY_S = 10.0  # how often a job measures its flows' lag (docs/metrics-and-ui.md)
TIMESTAMP_WAIT_S = 5.0  # at most this long to read the records at the positions


@dataclass(frozen=True)
class Lag:
    """A measurement of a flow's lag: per partition, the source's end and the flow's position,
    and for the partitions behind, the timestamp (ms) of the record at the position when it
    was read."""

    measured_at: float  # Unix time
    ends: dict[Partition, int]
    positions: dict[Partition, int]
    oldest_ms: dict[Partition, int] = field(default_factory=dict)

    def behind(self) -> dict[Partition, int]:
        """Records not copied, per partition behind."""
        return {
            tp: end - self.positions.get(tp, end)
            for tp, end in self.ends.items()
            if end > self.positions.get(tp, end)
        }

    @property
    def records(self) -> int:
        return sum(self.behind().values())

    @property
    def oldest_at(self) -> float | None:
        """When the oldest record not copied was written (Unix time; None: none behind, or
        not read)."""
        known = [self.oldest_ms[tp] for tp in self.behind() if tp in self.oldest_ms]
        return min(known) / 1000 if known else None

    def seconds(self, now: float) -> float | None:
        """The age of the oldest record not copied at ``now``: 0 when none is behind, None when
        records are behind but none of theirs was read."""
        if not self.records:
            return 0.0
        oldest = self.oldest_at
        return None if oldest is None else max(0.0, now - oldest)

    def as_progress(self) -> dict[str, object]:
        """The measurement as ``progress.json`` keeps it (written so by a paused flow's
        application; a running job writes its own figures)."""
        return {
            "lag_records": self.records,
            "lag_measured_at": round(self.measured_at, 3),
            "oldest_uncopied_at": None if self.oldest_at is None else round(self.oldest_at, 3),
            "source_end_offsets_measured": _nested(self.ends),
            "source_positions": _nested(self.positions),
        }


def progress_lag(progress: Mapping[str, object], now: float) -> tuple[int | None, float | None]:
    """Records and seconds behind from a flow's ``progress.json`` (or a measurement as
    :meth:`Lag.as_progress` gives it) at ``now``: records as measured or planned last; seconds
    0 when nothing is behind, else the age of the oldest record not copied (its timestamp, as
    last measured), else the time since the flow was last caught up (an upper bound), else
    None. The one rule of the health page, the alerts and the trends."""
    records = _number(progress.get("lag_records"))
    if records is not None and records <= 0:
        return 0, 0.0
    oldest = _number(progress.get("oldest_uncopied_at"))
    caught_up = _number(progress.get("caught_up_at"))
    since = oldest if oldest is not None else caught_up
    seconds = None if since is None else max(0.0, now - since)
    return (None if records is None else int(records)), seconds


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def measure(
    spec: MirrorSpec,
    positions: Mapping[Partition, int],
    *,
    admin: ClusterAdmin | None = None,
    consumer=None,
    timestamps: bool = True,
) -> Lag:
    """The flow's lag now for ``positions`` (its partitions), read from the source: its ends
    and, with ``timestamps``, the record at each position behind. ``admin`` and ``consumer``:
    clients to reuse (the job keeps them); a consumer made here is closed. Raises the source's
    error in one line (:func:`~mirrorflow.replication.topics.cluster_error`) when it does not
    answer."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = admin or ClusterAdmin(spec.source, spec.source_admin)
    partitions = sorted(positions)
    ends: dict[Partition, int] = {}
    committed = spec.source_consumer.get("isolation.level") == "read_committed"
    if partitions:
        try:
            answers = clients.list_offsets(
                admin.client,
                {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions},
                IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED,
                request_timeout=ADMIN_TIMEOUT_S,
            )
            for tp, offset in answers.items():
                ends[(tp.topic, tp.partition)] = offset
        except Exception as exc:
            raise cluster_error(
                admin, "listing end offsets", exc, "DESCRIBE on the topics"
            ) from None
    measured_at = time.time()
    lag = Lag(measured_at, ends, dict(positions))
    behind = lag.behind()
    if not timestamps or not behind:
        return lag
    own = consumer is None
    consumer = consumer or timestamp_reader(spec)
    try:
        oldest = _first_timestamps(consumer, {tp: positions[tp] for tp in behind})
    finally:
        if own:
            consumer.close()
    return Lag(measured_at, ends, dict(positions), oldest)


def timestamp_reader(spec: MirrorSpec):
    """A consumer of the flow's source that reads the records at positions (never joins nor
    commits its group: ``assign`` only)."""
    return clients.assigned_consumer(
        spec.source,
        spec.source_consumer_client,
        f"mirrorflow-lag-{spec.flow}",
        {
            "auto.offset.reset": "earliest",  # a record gone with retention: the first left
            "max.partition.fetch.bytes": 65536,  # one record per partition is all it needs
            "fetch.wait.max.ms": 100,
        },
    )


def _first_timestamps(consumer, positions: dict[Partition, int]) -> dict[Partition, int]:
    """The timestamp (ms) of the first record at or after each position (within
    :data:`TIMESTAMP_WAIT_S`; a partition that gave none is left out)."""
    from confluent_kafka import TopicPartition

    consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
    found: dict[Partition, int] = {}
    deadline = time.monotonic() + TIMESTAMP_WAIT_S
    try:
        while len(found) < len(positions) and time.monotonic() < deadline:
            for message in consumer.consume(len(positions), 0.2):
                if message.error() is not None:
                    continue
                tp = (message.topic(), message.partition())
                kind, stamp = message.timestamp()
                if tp not in found and kind and stamp >= 0:
                    found[tp] = stamp
                    consumer.pause([TopicPartition(*tp)])
    finally:
        # librdkafka keeps a partition paused across unassign and assign: resumed, or the
        # next measurement would read nothing of it
        if found:
            consumer.resume([TopicPartition(*tp) for tp in found])
        consumer.unassign()
    return found


def _nested(offsets: Mapping[Partition, int]) -> dict[str, dict[str, int]]:
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return nested
