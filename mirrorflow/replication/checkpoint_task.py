"""The checkpoint task, MirrorMaker 2's ``MirrorCheckpointTask``, with exact translation.

:class:`GroupCheckpoints`: every ``emit.checkpoints.interval.seconds`` it reads the committed
offsets of the flow's groups (``groups`` / ``groups.exclude``, the list refreshed every
``refresh.groups.interval.seconds``) on the source, translates those of replicated topics with the
flow's :mod:`offset map <mirrorflow.replication.offset_map>` (exactly, where MirrorMaker 2 goes
back to its nearest sampled sync) into :class:`GroupOffsets`, and writes the results in
MirrorMaker 2's format to ``<source>.checkpoints.internal`` on the target, partition 0, where
``RemoteClusterUtils.translateOffsets`` reads them. A group's checkpoint never moves backwards
unless the group itself rewinds on the source (MirrorMaker 2's ``checkpointIsMoreRecent``); the
checkpoints written before a restart are read back first
(:mod:`~mirrorflow.replication.checkpoint_stores`).

Its :meth:`~GroupCheckpoints.snapshot` is what the group offset sync
(:mod:`~mirrorflow.replication.group_offset_sync`) commits on the target; a group the source says
is gone leaves it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaException

from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.formats import Checkpoint
from mirrorflow.mm2.offset_syncs import checkpoint_is_more_recent
from mirrorflow.replication import clients
from mirrorflow.replication.checkpoint_stores import GroupKey, OffsetMapReader, read_checkpoints
from mirrorflow.replication.group_offsets_client import GroupOffsetsClient
from mirrorflow.replication.offset_map import OffsetMap, Partition, Translation
from mirrorflow.replication.scheduler import TaskFailed
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import (
    ADMIN_TIMEOUT_S,
    ClusterAdmin,
    client_principal,
    cluster_error,
    write_records,
)

log = logging.getLogger(__name__)


@dataclass
class GroupOffsets:
    """One group's committed offsets on the source, translated: source partition -> result."""

    group: str
    translations: dict[Partition, Translation | None] = field(default_factory=dict)
    metadata: dict[Partition, str] = field(default_factory=dict)
    asked: bool = False  # whether any partition was asked about (the flow has positions)

    @property
    def gone(self) -> bool:
        """The source said the group has no committed offset on any of the flow's partitions
        (deleted there, say)."""
        return self.asked and not self.translations


class GroupCheckpoints:
    """Writes the flow's checkpoints; see the module's documentation."""

    def __init__(
        self,
        spec: MirrorSpec,
        admins: dict[str, ClusterAdmin],
        offset_map: OffsetMap,
        positions: Callable[[], dict[Partition, int]] = dict,
        producer=None,
        on_written: Callable[[dict[GroupKey, float]], None] | None = None,
    ) -> None:
        self.spec, self.offset_map, self.positions = spec, offset_map, positions
        # Told after each run that wrote (none, when no checkpoint moved) each written
        # checkpoint's latency (ms): from its creation (the group's offsets read and
        # translated) to its acknowledgement, MirrorMaker 2's checkpoint-latency-ms.
        self.on_written = on_written
        self.source, self.target = admins[spec.source], admins[spec.target]
        self.offsets = GroupOffsetsClient(self.source, spec.source_consumer_client)
        if producer is None:  # False: translation only, nothing written
            config = {**spec.target_client, "enable.idempotence": True, "acks": "all"}
            producer = clients.producer(spec.target, config)
        self.producer = producer
        self.latest: dict[GroupKey, Checkpoint] = {}
        self.latest_written_ms: dict[GroupKey, int] = {}  # when those read back were written
        self.exactness: dict[GroupKey, str] = {}
        self.emitted_at: dict[GroupKey, float] = {}
        self.translated: dict[str, GroupOffsets] = {}  # each group's offsets at the last emit
        self.due: list[Checkpoint] = []  # the checkpoints the last emit wrote (or would write)
        self.groups: list[str] | None = None
        # Listed groups the source last said have no committed offset on the flow's partitions
        # (deleted there, say): no checkpoint of theirs is synced until they have one again.
        self.gone: set[str] = set()
        self.written = 0
        self._started = False
        self._lock = threading.Lock()
        # Failback: the opposite flow's map, read from this flow's source as it grows.
        self.reverse_map = OffsetMap()
        self._reverse_reader = (
            OffsetMapReader(spec, self.reverse_map, missing_ok=True, reverse=True)
            if spec.reverse_checkpoints_enabled
            else None
        )

    # -- what MirrorMaker 2's task does at start and on its refresh schedule ------------------
    def start(self) -> None:
        """Read back the checkpoints written before (so none moves backwards after a restart)."""
        if not self._started:
            reader = read_checkpoints(self.spec)
            self.latest.update(reader.latest)
            self.latest_written_ms.update(reader.written_ms)
            self._started = True

    def refresh_groups(self) -> list[str]:
        """The source's consumer groups that pass the flow's ``groups`` / ``groups.exclude``."""
        try:
            listed = self.source.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result()
        except KafkaException as exc:
            raise cluster_error(
                self.source, "listing consumer groups", exc, "DESCRIBE on the cluster"
            ) from None
        groups = sorted(
            g.group_id for g in listed.valid if self.spec.should_replicate_group(g.group_id)
        )
        with self._lock:
            self.groups = groups
            self.gone &= set(groups)
        return groups

    # -- translation --------------------------------------------------------------------------
    def group_offsets(self, group: str) -> GroupOffsets:
        """``group``'s committed offsets of the flow's partitions on the source, translated.

        The flow's partitions are those the mirror has positions for (every replicated source
        partition it has seen)."""
        positions = self.positions()
        back = self._reverse_partitions()
        result = GroupOffsets(group, asked=bool(positions or back))
        committed = self.offsets.committed(group, sorted({*positions, *back}))
        for key, (offset, metadata) in sorted(committed.items()):
            translation = None
            if key in back:  # a copy of the target's topic: translated back with its map
                translation = self.reverse_map.translate_back(back[key], offset)
                if translation is not None:  # as a checkpoint: this flow's source, then target
                    translation = Translation(offset, translation.upstream, translation.exactness)
            if key not in back or (self.spec.provenance and key in positions):
                forward = self.offset_map.translate(key, offset, positions.get(key))
                translation = _earlier(forward, translation)
            result.translations[key] = translation
            result.metadata[key] = metadata
        return result

    def _reverse_partitions(self) -> dict[Partition, Partition]:
        """The source's copies of the target's partitions (those the opposite flow's map
        knows), each with the target partition it copies."""
        if self._reverse_reader is None:
            return {}
        self._reverse_reader.read_to_end()
        back = {}
        for topic, partition in list(self.reverse_map.partitions):
            remote = self.spec.reverse_remote_topic(topic)
            if remote is not None:
                back[(remote, partition)] = (topic, partition)
        return back

    # -- one run -------------------------------------------------------------------------------
    def emit(self, write: bool = True) -> int:
        """Translate every group's offsets and write the checkpoints that moved; their number.

        ``write=False`` (a dry run) writes nothing: the checkpoints that would be written are
        only kept in memory (:attr:`latest`, :attr:`due`)."""
        self.start()
        if self.groups is None:
            self.refresh_groups()
        due: list[tuple[Checkpoint, str]] = []
        created: dict[GroupKey, float] = {}
        self.translated = {}
        for group in self.groups or []:
            offsets = self.translated[group] = self.group_offsets(group)
            if offsets.gone:
                self._forget(group)
                continue
            with self._lock:
                self.gone.discard(group)
            translated_at = time.time()
            for (topic, partition), translation in sorted(offsets.translations.items()):
                if translation is None:
                    continue  # nothing of the partition copied yet
                checkpoint = Checkpoint(
                    group,
                    self.spec.checkpoint_topic(topic),
                    partition,
                    translation.upstream,
                    translation.downstream,
                    offsets.metadata[(topic, partition)],
                )
                key = (group, checkpoint.topic, partition)
                if checkpoint_is_more_recent(self.latest.get(key), checkpoint):
                    due.append((checkpoint, translation.exactness))
                    created[key] = translated_at
        if due and write:
            self._write([c for c, _ in due])
        if write and self.on_written is not None:  # every group checked, the moved ones written
            acknowledged = time.time()
            self.on_written({k: (acknowledged - at) * 1000 for k, at in created.items()})
        self.due = [c for c, _ in due]
        now = time.time()
        with self._lock:
            for checkpoint, exactness in due:
                key = (checkpoint.group, checkpoint.topic, checkpoint.partition)
                self.latest[key] = checkpoint
                self.exactness[key] = exactness
                self.emitted_at[key] = now
        if write:
            self.written += len(due)
        return len(due)

    def _write(self, checkpoints: list[Checkpoint]) -> None:
        topic = self.spec.checkpoints_topic
        write_records(
            self.producer,
            topic,
            [(c.key(), c.value()) for c in checkpoints],
            cluster=self.spec.target,
            principal=client_principal(self.spec.target_client),
            what=f"writing checkpoints to {topic}",
            hint="check the target cluster; the checkpoints are written again next interval",
        )

    def scheduled_emit(self) -> None:
        """The mirror job's periodic task: a refusal is counted and retried, never fatal."""
        try:
            count = self.emit()
        except MirrorflowError as exc:  # unreachable too: the copying notices that itself
            raise TaskFailed(str(exc)) from None
        if count:
            log.info("%s: %d checkpoints written", self.spec.flow, count)

    def scheduled_refresh(self) -> None:
        try:
            self.refresh_groups()
        except MirrorflowError as exc:  # unreachable too: the copying notices that itself
            raise TaskFailed(str(exc)) from None

    def snapshot(self) -> dict[GroupKey, Checkpoint]:
        """The latest checkpoint per group and target partition (a copy, for other threads), of
        the groups of the last listing that had committed offsets at their last look: a group
        deleted on the source drops out (so the group offset sync leaves it alone), and so
        does one checkpointed before a restart that the source no longer lists."""
        with self._lock:
            listed = set(self.groups or ()) - self.gone
            return {key: c for key, c in self.latest.items() if key[0] in listed}

    def _forget(self, group: str) -> None:
        """``group`` has no committed offset on the flow's partitions on the source (deleted
        there, say): its checkpoints leave the snapshot; it starts afresh if it comes back."""
        with self._lock:
            self.gone.add(group)
            for store in (self.latest, self.latest_written_ms, self.exactness, self.emitted_at):
                for key in [k for k in store if k[0] == group]:
                    del store[key]

    def still_on_source(self, group: str) -> bool:
        """Whether ``group`` has committed offsets on the flow's partitions on the source now
        (asked by the group offset sync before it creates a group absent from the target). A
        group without them is forgotten. When the source does not answer, the last
        checkpoints stand: True, as in an emergency the target's groups need them."""
        try:
            if not self.group_offsets(group).gone:
                return True
        except (MirrorflowError, KafkaException):
            return True
        self._forget(group)
        return False


def _earlier(forward: Translation | None, back: Translation | None) -> Translation | None:
    """Provenance mode: a partition holds the records first written on either cluster; the
    first record of either side the group has not read (``forward``: this flow's copies,
    ``back``: the opposite flow's), so that it loses nothing. It reads again the records of
    the other side between the two, if any ("both-sides"). Otherwise the one given."""
    if forward is None or back is None:
        return forward or back
    earlier = min(forward, back, key=lambda t: t.downstream)
    return Translation(forward.upstream, earlier.downstream, "both-sides")
