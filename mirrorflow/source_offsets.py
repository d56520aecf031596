"""Exactly-once progress kept on the target: the last copied upstream offset per partition.

In exactly-once mode each source partition's copies of a batch and its position record
(:class:`~mirrorflow.formats.SourceOffset`, MirrorMaker 2's Connect format, in
``mm2-offsets.<source>.internal`` on the target) are written in one Kafka transaction. A
``read_committed`` reader of that topic therefore knows exactly which upstream offsets are
already on the target, and a replayed batch skips them. MirrorMaker 2 resumes from the same
records, so a flow can move between the two without copying anything twice.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from mirrorflow.errors import MirrorflowError
from mirrorflow.formats import SourceOffset

# Connect's default number of partitions for its offsets topic (offset.storage.partitions).
OFFSETS_TOPIC_PARTITIONS = 25


def offsets_topic(source_alias: str) -> str:
    """MirrorMaker 2's Connect offsets topic for flows from ``source_alias``."""
    return f"mm2-offsets.{source_alias}.internal"


class SourceOffsetReader:
    """Reads committed positions of one source cluster's partitions, incrementally."""

    def __init__(self, consumer_config: dict[str, str], topic: str, source_alias: str) -> None:
        self.topic, self.source_alias = topic, source_alias
        self.positions: dict[tuple[str, int], int] = {}
        self._consumer = Consumer(
            {
                **consumer_config,
                "group.id": f"mirrorflow-offsets-reader-{source_alias}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        self._assigned = False

    def read_to_end(self, timeout_s: float = 60.0) -> dict[tuple[str, int], int]:
        """Every committed position up to the end of the topic: (topic, partition) -> offset."""
        if not self._assigned:
            metadata = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            if metadata.error is not None:
                raise MirrorflowError(f"cannot read {self.topic}: {metadata.error}")
            self._consumer.assign(
                [TopicPartition(self.topic, p, -2) for p in metadata.partitions]  # -2: beginning
            )
            self._assigned = True
        remaining = {tp.partition for tp in self._consumer.assignment()}
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise MirrorflowError(
                    f"reading exactly-once positions from {self.topic} did not reach its end "
                    f"within {timeout_s:.0f}s",
                    "check the target cluster; the job retries the batch when restarted",
                )
            msg = self._consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    remaining.discard(msg.partition())
                    continue
                raise MirrorflowError(f"reading {self.topic} failed: {msg.error().str()}")
            position = SourceOffset.from_record(msg.key(), msg.value())
            if position is not None and position.cluster == self.source_alias:
                self.positions[(position.topic, position.partition)] = position.offset
        return dict(self.positions)

    def close(self) -> None:
        self._consumer.close()
