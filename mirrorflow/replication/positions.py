"""A flow's positions, kept on the target as MirrorMaker 2 keeps them, in both delivery modes.

A position is the last replicated upstream offset of a source partition
(:class:`~mirrorflow.mm2.formats.SourceOffset`, MirrorMaker 2's Connect format, in
``mm2-offsets.<source>.internal`` on the target). At-least-once, the driver writes a batch's
positions once every copy of the batch is acknowledged; exactly-once, each source partition's
copies and its position are written in one Kafka transaction, so a ``read_committed`` reader
knows exactly which upstream offsets are already on the target. MirrorMaker 2 resumes from the
same records, so a flow can move between the two tools in either mode.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.mm2.formats import SourceOffset

# Connect's default number of partitions for its offsets topic (offset.storage.partitions).
OFFSETS_TOPIC_PARTITIONS = 25


def offsets_topic(source_alias: str) -> str:
    """MirrorMaker 2's Connect offsets topic for flows from ``source_alias``."""
    return f"mm2-offsets.{source_alias}.internal"


class SourceOffsetReader:
    """Reads committed positions of one source cluster's partitions, incrementally.

    "The end" is each partition's last stable offset (what a ``read_committed`` reader can
    reach), asked of the cluster on every call: a transaction that a fault left open does not
    hold the reader back, and its records, aborted once its producer is fenced, never count.
    """

    def __init__(
        self,
        consumer_config: dict[str, str],
        admin_config: dict[str, str],
        topic: str,
        source_alias: str,
    ) -> None:
        from confluent_kafka.admin import AdminClient

        self.topic, self.source_alias = topic, source_alias
        self.positions: dict[tuple[str, int], int] = {}
        self._consumer = Consumer(
            {
                **consumer_config,
                "group.id": f"mirrorflow-offsets-reader-{source_alias}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        self._admin = AdminClient(admin_config)
        self._partitions: list[TopicPartition] = []

    def _stable_ends(self, timeout_s: float) -> dict[int, int]:
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import OffsetSpec

        futures = self._admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in self._partitions},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=timeout_s,
        )
        return {tp.partition: f.result().offset for tp, f in futures.items()}

    def read_to_end(self, timeout_s: float = 60.0) -> dict[tuple[str, int], int]:
        """Every committed position up to the end of the topic: (topic, partition) -> offset."""
        if not self._partitions:
            metadata = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            if metadata.error is not None:
                raise MirrorflowError(f"cannot read {self.topic}: {metadata.error}")
            self._partitions = [TopicPartition(self.topic, p) for p in metadata.partitions]
            self._consumer.assign(
                [TopicPartition(self.topic, p, -2) for p in metadata.partitions]  # -2: beginning
            )
        deadline = time.monotonic() + timeout_s
        try:
            ends = self._stable_ends(timeout_s)
        except KafkaException as exc:
            raise ClusterUnreachable(
                f"reading positions from {self.topic}: {exc.args[0].str()}",
                "check the target cluster; the batch is retried",
            ) from None
        remaining = {p for p, end in ends.items() if end > 0}
        while remaining:
            if time.monotonic() > deadline:
                raise ClusterUnreachable(
                    f"reading positions from {self.topic} did not reach its end "
                    f"within {timeout_s:.0f}s",
                    "check the target cluster; the batch is retried",
                )
            msg = self._consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                position = SourceOffset.from_record(msg.key(), msg.value())
                if position is not None and position.cluster == self.source_alias:
                    self.positions[(position.topic, position.partition)] = position.offset
            elif msg is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                raise MirrorflowError(f"reading {self.topic} failed: {msg.error().str()}")
            # The position moves past transaction markers too, which no message shows.
            for tp in self._consumer.position([TopicPartition(self.topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
        return dict(self.positions)

    def close(self) -> None:
        self._consumer.close()


class PositionWriter:
    """Writes positions to the offsets topic as MirrorMaker 2's Connect worker does.

    Each record is keyed and partitioned as Connect's ``KafkaOffsetBackingStore`` writes it
    (murmur2 of the key, Java's default partitioner), so a later write of either tool for the
    same source partition lands in the same partition and is read last.
    """

    def __init__(self, producer_config: dict[str, str], topic: str, source_alias: str) -> None:
        from confluent_kafka import Producer

        self.topic, self.source_alias = topic, source_alias
        self._producer = Producer(
            {
                **producer_config,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",
            }
        )

    def write(self, positions: dict[tuple[str, int], int], timeout_s: float = 60.0) -> None:
        """Record that every offset below ``positions[(topic, partition)]`` was replicated."""
        failures: list[KafkaError] = []
        for (topic, partition), next_offset in sorted(positions.items()):
            record = SourceOffset(self.source_alias, topic, partition, next_offset - 1)
            self._producer.produce(
                self.topic,
                record.value(),
                record.key(),
                on_delivery=lambda err, _msg: err is not None and failures.append(err),
            )
        remaining = self._producer.flush(timeout_s)
        if failures or remaining:
            cause = failures[0].str() if failures else f"not acknowledged within {timeout_s:.0f}s"
            raise ClusterUnreachable(
                f"writing positions to {self.topic} failed: {cause}",
                "the batch is copied again when the flow resumes; check the target cluster",
            )

    def close(self) -> None:
        self._producer.flush(10)


def legacy_progress(directory: Path) -> dict[tuple[str, int], int]:
    """Where mirrorflow 0.x's at-least-once job stood: the next offset per source partition.

    That job kept its positions in a Spark streaming checkpoint directory: ``offsets/<N>``
    holds the end offsets of batch N (lines: ``v1``, the batch's metadata, then one JSON
    object ``{"topic": {"partition": offset}}`` per source) and ``commits/<N>`` exists once
    batch N was written. Returns the end offsets of the last committed batch, empty if none.
    """
    commits = directory / "commits"
    done = (
        sorted((int(p.name) for p in commits.glob("*") if p.name.isdigit()), reverse=True)
        if commits.is_dir()
        else []
    )
    for batch in done:
        offsets = directory / "offsets" / str(batch)
        try:
            lines = offsets.read_text().splitlines()
        except OSError:
            continue
        result: dict[tuple[str, int], int] = {}
        for line in lines[2:]:
            try:
                source = json.loads(line)
            except ValueError:
                continue
            if isinstance(source, dict):
                for topic, partitions in source.items():
                    for partition, offset in partitions.items():
                        result[(topic, int(partition))] = int(offset)
        return result
    return {}
