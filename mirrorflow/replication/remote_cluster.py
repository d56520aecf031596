"""The client side of checkpoints, what MirrorMaker 2 keeps in ``mirror-client``'s
``RemoteClusterUtils``: a group's offsets translated now beside its latest checkpoints
(:func:`translate_group`, ``mirrorflow translate``; MirrorMaker 2's ``translateOffsets``), the
latest checkpoints (:func:`latest_checkpoints`, ``mirrorflow checkpoints``), where a group resumes
on the target and a consumer assigned there (:func:`failover_offsets`,
:func:`seek_to_checkpoints`), and the flow's positions on the target (:func:`flow_positions`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.formats import Checkpoint
from mirrorflow.replication.checkpoint_stores import GroupKey, read_checkpoints, read_offset_map
from mirrorflow.replication.checkpoint_task import GroupCheckpoints, GroupOffsets
from mirrorflow.replication.offset_map import Partition
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin


def checkpoint_offset(checkpoint: Checkpoint) -> TopicPartition:
    """A checkpoint as an offset to commit or seek to, with the group's commit metadata."""
    c = checkpoint
    if c.metadata:
        return TopicPartition(c.topic, c.partition, c.downstream_offset, c.metadata)
    return TopicPartition(c.topic, c.partition, c.downstream_offset)


@dataclass(frozen=True)
class PartitionTranslation:
    """One partition of a group: where it stands on the source and where it resumes on the
    target, and the latest checkpoint written for it."""

    source_topic: str
    partition: int
    committed: int
    target_topic: str
    translated: int | None
    exactness: str  # see Translation; "not-copied" when nothing of the partition is copied
    checkpoint: int | None
    checkpoint_age_s: float | None

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def flow_admins(spec: MirrorSpec) -> dict[str, ClusterAdmin]:
    """An admin client of each of the flow's two clusters, by alias."""
    return {
        spec.source: ClusterAdmin(spec.source, spec.source_admin),
        spec.target: ClusterAdmin(spec.target, spec.target_admin),
    }


def flow_positions(spec: MirrorSpec) -> dict[Partition, int]:
    """The flow's positions on the target: the next source offset to copy, per partition."""
    from mirrorflow.replication.positions import SourceOffsetReader

    reader = SourceOffsetReader(
        spec.target_consumer, spec.target_admin, spec.offsets_topic, spec.source, spec.target
    )
    reader.missing_ok = True
    try:
        return {tp: last + 1 for tp, last in reader.read_to_end().items()}
    finally:
        reader.close()


def translate_group(spec: MirrorSpec, group: str) -> list[PartitionTranslation]:
    """``group``'s committed offsets on the source, translated now with the flow's offset map,
    beside the latest checkpoints (``mirrorflow translate``)."""
    admins = flow_admins(spec)
    for admin in admins.values():
        admin.metadata()
    offset_map = read_offset_map(spec)
    positions = flow_positions(spec)
    tool = GroupCheckpoints(spec, admins, offset_map, lambda: positions, producer=False)
    offsets = tool.group_offsets(group)
    checkpoints = read_checkpoints(spec)
    return translation_rows(spec, offsets, checkpoints.latest, checkpoints.written_ms)


def translation_rows(
    spec: MirrorSpec,
    offsets: GroupOffsets,
    latest: dict[GroupKey, Checkpoint],
    written_ms: Mapping[GroupKey, float],
) -> list[PartitionTranslation]:
    """A group's translated offsets beside its latest checkpoints (written when ``written_ms``)."""
    now_ms = time.time() * 1000
    rows = []
    for (topic, partition), translation in sorted(offsets.translations.items()):
        target_topic = spec.checkpoint_topic(topic)
        key = (offsets.group, target_topic, partition)
        checkpoint = latest.get(key)
        written = written_ms.get(key)
        rows.append(
            PartitionTranslation(
                topic,
                partition,
                translation.upstream if translation else -1,
                target_topic,
                translation.downstream if translation else None,
                translation.exactness if translation else "not-copied",
                checkpoint.downstream_offset if checkpoint else None,
                round(max(0.0, now_ms - written) / 1000, 1) if written else None,
            )
        )
    return rows


def latest_checkpoints(spec: MirrorSpec, group: str | None = None) -> list[dict[str, object]]:
    """The latest checkpoint per group and target partition (``mirrorflow checkpoints``)."""
    return read_checkpoints(spec).rows(group)


def failover_offsets(spec: MirrorSpec, group: str) -> list[TopicPartition]:
    """Where ``group`` resumes on the target, from its latest checkpoints: partitions of the
    remote topics with offsets (and the group's commit metadata), for a consumer's ``assign``
    or ``seek``, or an admin's ``alter_consumer_group_offsets``."""
    latest = read_checkpoints(spec).latest
    return [checkpoint_offset(c) for key, c in sorted(latest.items()) if key[0] == group]


def seek_to_checkpoints(consumer, spec: MirrorSpec, group: str) -> list[TopicPartition]:
    """Assign a confluent-kafka consumer on the target to ``group``'s checkpointed offsets."""
    offsets = failover_offsets(spec, group)
    if not offsets:
        raise MirrorflowError(
            f"no checkpoint of group {group} in {spec.checkpoints_topic} on {spec.target}",
            "check the group name and that the flow emits checkpoints (`mirrorflow checkpoints`)",
        )
    consumer.assign(offsets)
    return offsets
