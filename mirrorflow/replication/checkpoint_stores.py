"""The two stores the checkpoint task reads back from topics: MirrorMaker 2's ``CheckpointStore``
and the offset map's counterpart of its ``OffsetSyncStore``.

:class:`CheckpointReader` (:func:`read_checkpoints`) has the latest checkpoint of each group and
target partition in ``<source>.checkpoints.internal`` on the target, read back at start so that
no checkpoint moves backwards after a restart, and read by the client tools
(:mod:`~mirrorflow.replication.remote_cluster`). :class:`OffsetMapReader`
(:func:`read_offset_map`) loads the flow's :mod:`offset map <mirrorflow.replication.offset_map>`
from its topic on the target, then what was added since; :func:`expire_offset_map` drops the
runs whose records the source no longer has, in memory and in that topic.
"""

from __future__ import annotations

import time

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition

from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.formats import Checkpoint
from mirrorflow.replication import clients
from mirrorflow.replication.offset_map import OffsetMap, record_of
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topic_reader import TopicReader
from mirrorflow.replication.topics import ADMIN_TIMEOUT_S, ClusterAdmin, cluster_error

GroupKey = tuple[str, str, int]  # group, target topic, partition


class OffsetMapReader(TopicReader):
    """Loads a flow's offset map from its topic on the target, then what was added since.

    ``reverse``: the opposite flow's map instead, which lives on this flow's source."""

    def __init__(
        self,
        spec: MirrorSpec,
        offset_map: OffsetMap,
        missing_ok: bool = False,
        reverse: bool = False,
    ) -> None:
        if reverse:
            client, admin, topic, cluster = (
                spec.source_consumer_client,
                spec.source_admin,
                spec.reverse_map_topic,
                spec.source,
            )
        else:
            client, admin, topic, cluster = (
                spec.target_consumer,
                spec.target_admin,
                spec.offset_map_topic,
                spec.target,
            )
        group = f"mirrorflow-offset-map-reader-{topic}"
        super().__init__(client, admin, topic, group, missing_ok, cluster)
        self.offset_map = offset_map

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is not None:
            self.offset_map.load(key, value)


class CheckpointReader(TopicReader):
    """The latest checkpoint of each group and target partition in ``<source>.checkpoints.internal``
    (the last record wins, as in ``RemoteClusterUtils``)."""

    def __init__(
        self,
        consumer_config: dict[str, str],
        admin_config: dict[str, str],
        topic: str,
        cluster: str = "",
    ):
        group = f"mirrorflow-checkpoints-{topic}"
        super().__init__(consumer_config, admin_config, topic, group, True, cluster)
        self.latest: dict[GroupKey, Checkpoint] = {}
        self.written_ms: dict[GroupKey, int] = {}  # each latest checkpoint's record timestamp
        self.skipped = 0

    def apply_message(self, msg) -> None:
        try:
            checkpoint = Checkpoint.from_record(msg.key(), msg.value())
        except ValueError:
            self.skipped += 1  # MirrorMaker 2's CheckpointStore skips bad records too
            return
        key = (checkpoint.group, checkpoint.topic, checkpoint.partition)
        self.latest[key] = checkpoint
        self.written_ms[key] = msg.timestamp()[1]

    def rows(self, group: str | None = None, metadata: bool = True) -> list[dict[str, object]]:
        """The latest checkpoints (of ``group``; None: all) as rows, with their age now
        (``mirrorflow checkpoints``, a flow's page; the page leaves out the metadata)."""
        now_ms = time.time() * 1000
        rows: list[dict[str, object]] = []
        for key, c in sorted(self.latest.items()):
            if group is not None and c.group != group:
                continue
            row: dict[str, object] = {
                "group": c.group,
                "topic": c.topic,
                "partition": c.partition,
                "upstream_offset": c.upstream_offset,
                "offset": c.downstream_offset,
            }
            if metadata:
                row["metadata"] = c.metadata
            row["age_s"] = round((now_ms - self.written_ms[key]) / 1000, 1)
            rows.append(row)
        return rows


def read_offset_map(spec: MirrorSpec) -> OffsetMap:
    """The flow's offset map as stored on the target now."""
    offset_map = OffsetMap()
    reader = OffsetMapReader(spec, offset_map, missing_ok=True)
    try:
        reader.read_to_end()
    finally:
        reader.close()
    return offset_map


def read_checkpoints(spec: MirrorSpec) -> CheckpointReader:
    """The checkpoints on the flow's target: ``.latest`` per group and target partition, and
    when each was written (``.written_ms``)."""
    reader = CheckpointReader(
        spec.target_consumer, spec.target_admin, spec.checkpoints_topic, spec.target
    )
    try:
        reader.read_to_end()
    finally:
        reader.close()
    return reader


def expire_offset_map(
    spec: MirrorSpec, source: ClusterAdmin, offset_map: OffsetMap, producer
) -> int:
    """Drop the runs whose records are all gone from the source (retention, deleted records),
    in memory and, by tombstones, in the offset-map topic; the number dropped."""
    from confluent_kafka.admin import OffsetSpec

    partitions = list(offset_map.partitions)
    if not partitions:
        return 0
    try:
        answers = clients.list_offsets(
            source.client,
            {TopicPartition(t, p): OffsetSpec.earliest() for t, p in partitions},
            IsolationLevel.READ_UNCOMMITTED,
            request_timeout=ADMIN_TIMEOUT_S,
        )
        starts = {(tp.topic, tp.partition): offset for tp, offset in answers.items()}
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return 0  # a deleted source topic: its runs stay until the topic is back
        topics = ", ".join(sorted({t for t, _p in partitions}))
        needs = f"DESCRIBE on topic(s) {topics}"
        raise cluster_error(source, "listing the log start offsets", exc, needs) from None
    dropped = 0
    for tp, start in starts.items():
        for run in offset_map.expire(tp, start):
            key, _value = record_of(tp, run)
            producer.produce(spec.offset_map_topic, None, key, partition=0)
            dropped += 1
    if dropped and producer.flush(ADMIN_TIMEOUT_S):
        raise MirrorflowError(
            f"writing tombstones to {spec.offset_map_topic} on {spec.target} timed out",
            "check the target cluster; the runs are dropped again at the next expiry",
        )
    return dropped
