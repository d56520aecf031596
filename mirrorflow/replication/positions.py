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
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from mirrorflow.errors import ClusterUnreachable
from mirrorflow.mm2.formats import SourceOffset
from mirrorflow.replication import clients
from mirrorflow.replication.topic_reader import TopicReader
from mirrorflow.replication.topics import client_principal, refusal, unauthorized

# Connect's default number of partitions for its offsets topic (offset.storage.partitions).
OFFSETS_TOPIC_PARTITIONS = 25


def offsets_topic(source_alias: str) -> str:
    """MirrorMaker 2's Connect offsets topic for flows from ``source_alias``."""
    return f"mm2-offsets.{source_alias}.internal"


class SourceOffsetReader(TopicReader):
    """Reads committed positions of one source cluster's partitions, incrementally."""

    def __init__(
        self,
        consumer_config: dict[str, str],
        admin_config: dict[str, str],
        topic: str,
        source_alias: str,
        cluster: str = "",
    ) -> None:
        """``cluster``: the alias of the cluster that holds ``topic`` (the target)."""
        super().__init__(
            consumer_config,
            admin_config,
            topic,
            f"mirrorflow-offsets-reader-{source_alias}",
            cluster=cluster,
        )
        self.source_alias = source_alias
        self.positions: dict[tuple[str, int], int] = {}

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        position = SourceOffset.from_record(key, value)
        if position is not None and position.cluster == self.source_alias:
            self.positions[(position.topic, position.partition)] = position.offset

    def read_to_end(self, timeout_s: float = 60.0) -> dict[tuple[str, int], int]:
        """Every committed position up to the end of the topic: (topic, partition) -> offset."""
        super().read_to_end(timeout_s)
        return dict(self.positions)


if TYPE_CHECKING:
    from mirrorflow.replication.lease import FlowLease


class PositionWriter:
    """Writes positions to the offsets topic as MirrorMaker 2's Connect worker does.

    Each record is keyed and partitioned as Connect's ``KafkaOffsetBackingStore`` writes it
    (murmur2 of the key, Java's default partitioner), so a later write of either tool for the
    same source partition lands in the same partition and is read last.
    """

    def __init__(
        self, producer_config: dict[str, str], topic: str, source_alias: str, cluster: str = ""
    ) -> None:
        """``cluster``: the alias of the cluster that holds ``topic`` (the target)."""
        self.topic, self.source_alias = topic, source_alias
        self.lease: FlowLease | None = None  # the flow's, once the job holds it
        self.cluster = cluster or "(the cluster of " + topic + ")"
        self.principal = client_principal(producer_config)
        self._producer_config: dict[str, object] = {
            **producer_config,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
        }
        # Started at its first write without the lease: a running flow's positions go in the
        # lease's transactions, and an idle client still wakes its threads every second.
        self._producer: Producer | None = None

    def write(self, positions: dict[tuple[str, int], int], timeout_s: float = 60.0) -> None:
        """Record that every offset below ``positions[(topic, partition)]`` was replicated.
        With the flow's :attr:`lease`, in a transaction of the lease's: they land only while
        this job holds it (:class:`~mirrorflow.replication.lease.LeaseLost` otherwise)."""
        if self.lease is not None:
            records = []
            for (topic, partition), next_offset in sorted(positions.items()):
                record = SourceOffset(self.source_alias, topic, partition, next_offset - 1)
                records.append((self.topic, record.value(), record.key()))
            self.lease.commit(records)
            return
        if self._producer is None:
            self._producer = clients.producer(self.cluster, self._producer_config)
        producer = self._producer
        failures: list[KafkaError] = []
        for (topic, partition), next_offset in sorted(positions.items()):
            record = SourceOffset(self.source_alias, topic, partition, next_offset - 1)

            def delivered(err: KafkaError | None, _msg: Message) -> None:
                if err is not None:
                    failures.append(err)

            try:
                producer.produce(
                    self.topic,
                    record.value(),
                    record.key(),
                    on_delivery=delivered,
                )
            except KafkaException as exc:  # refused at once: the topic failed before
                failures.append(exc.args[0])
                break
        remaining = producer.flush(timeout_s)
        if failures and unauthorized(failures[0]):
            raise refusal(
                self.cluster,
                self.principal,
                f"writing positions to {self.topic}",
                failures[0].str(),
                f"WRITE on topic {self.topic}",
            )
        if failures or remaining:
            cause = failures[0].str() if failures else f"not acknowledged within {timeout_s:.0f}s"
            raise ClusterUnreachable(
                f"writing positions to {self.topic} failed: {cause}",
                "the batch is copied again when the flow resumes; check the target cluster",
            )

    def close(self) -> None:
        if self._producer is not None:
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
