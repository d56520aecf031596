"""Offset syncs as MirrorMaker 2 emits and uses them: the emission rule, translation, checkpoints.

An offset sync pairs the upstream offset of a copied record with the downstream offset of its
copy. MirrorMaker 2 writes one whenever a consumer group's offset would otherwise translate too
far from where the group really is. It later translates group offsets with the syncs and writes
the results as checkpoints. This module ports those three pieces of MirrorMaker 2 (3.7+), without
any I/O:

- :class:`OffsetSyncEmitter` is ``OffsetSyncWriter`` without its producer. It returns the syncs to
  write now and, at commit time, the syncs it held back.
- :class:`OffsetSyncStore` is ``OffsetSyncStore`` without its Kafka-backed log. It keeps 64 syncs
  per partition with the 3.6+ (KAFKA-15202) replacement rules and translates upstream offsets.
- :func:`checkpoint_is_more_recent` is ``MirrorCheckpointTask.checkpointIsMoreRecent``.

Translation is conservative: a translated offset is never past the copy of a record that the
group has yet to consume, so consumers may re-read records after a failover but skip none. (After
a writer restarts and copies records again, that holds for a record once its new copy exists.)
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace

from mirrorflow.mm2.formats import Checkpoint, OffsetSync, TopicPartition

DEFAULT_MAX_OFFSET_LAG = 100
"""MirrorMaker 2's default ``offset.lag.max``."""

SYNCS_PER_PARTITION = 64
"""How many syncs ``OffsetSyncStore`` keeps per source partition (``Long.SIZE``)."""


@dataclass
class PartitionSyncState:
    """``OffsetSyncWriter.PartitionState``: one source partition's copies in this lifetime.

    A lifetime is one run of a writer: a restarted writer starts with a fresh state, so its first
    copied record always gets a sync.
    """

    max_offset_lag: int = DEFAULT_MAX_OFFSET_LAG
    previous_upstream_offset: int = -1
    previous_downstream_offset: int = -1
    last_sync_downstream_offset: int = -1

    def update(self, upstream_offset: int, downstream_offset: int) -> bool:
        """Record one copied record; True if MirrorMaker 2 would send its sync immediately."""
        no_previous_sync_this_lifetime = self.last_sync_downstream_offset == -1
        # Translation goes at most one offset past a sync, hence the + 1.
        translated_offset_too_stale = (
            downstream_offset - (self.last_sync_downstream_offset + 1) >= self.max_offset_lag
        )
        skipped_upstream_record = upstream_offset - self.previous_upstream_offset != 1
        truncated_downstream_topic = downstream_offset < self.previous_downstream_offset
        sync_now = (
            no_previous_sync_this_lifetime
            or translated_offset_too_stale
            or skipped_upstream_record
            or truncated_downstream_topic
        )
        if sync_now:
            self.last_sync_downstream_offset = downstream_offset
        self.previous_upstream_offset = upstream_offset
        self.previous_downstream_offset = downstream_offset
        return sync_now

    def update_batch(
        self, upstream_offsets: Sequence[int], downstream_offsets: Sequence[int]
    ) -> list[int]:
        """Record copied records in order; the indexes of those whose syncs are due now.

        The result equals calling :meth:`update` for each record. A batch whose upstream offsets
        are consecutive and whose downstream offsets do not go back (the usual case) costs a few
        C-level list operations plus a binary search per sync, instead of a step per record.
        """
        ups, downs = list(upstream_offsets), list(downstream_offsets)
        if len(ups) != len(downs):
            raise ValueError(
                f"{len(ups)} upstream offsets but {len(downs)} downstream offsets; "
                "each copied record needs both"
            )
        if not ups:
            return []
        one_run = ups == list(range(ups[0], ups[0] + len(ups))) and downs == sorted(downs)
        if not one_run or downs[0] < 0:
            return [
                i
                for i, (up, down) in enumerate(zip(ups, downs, strict=True))
                if self.update(up, down)
            ]
        # After the first record of a run, neither a skipped upstream record, nor a truncated
        # downstream topic, nor a first sync is possible: only staleness can trigger a sync,
        # and it first does at the first downstream offset that reaches the threshold.
        due = [0] if self.update(ups[0], downs[0]) else []
        index = 1
        while (
            index := bisect_left(
                downs, self.last_sync_downstream_offset + 1 + self.max_offset_lag, index
            )
        ) < len(downs):
            due.append(index)
            self.last_sync_downstream_offset = downs[index]
            index += 1
        self.previous_upstream_offset, self.previous_downstream_offset = ups[-1], downs[-1]
        return due


class OffsetSyncEmitter:
    """Decides which offset syncs to write, like MirrorMaker 2's ``OffsetSyncWriter``.

    Feed it the copies of each source partition in order with :meth:`copied`, as soon as their
    downstream offsets are known. Write the syncs it returns. At each commit, that is, wherever
    MirrorMaker 2 would flush Connect offsets, also write the syncs from :meth:`promote_delayed`.

    A sync is due at once for the first copy of a partition in this emitter's lifetime, when
    upstream offsets skip (compaction, transaction markers, filtered records), when the
    downstream offset goes back (the target topic was truncated or recreated), and when the
    last sync is ``offset.lag.max`` or more offsets behind. Any other copy only replaces the
    partition's delayed sync, which is written at the next commit.

    This class returns every due sync. MirrorMaker 2 keeps one pending sync per partition and,
    while 10 syncs are in flight, replaces it with newer ones. A writer that likewise writes
    only the last due sync of a partition per batch keeps translation safe, only less precise.
    """

    def __init__(self, max_offset_lag: int = DEFAULT_MAX_OFFSET_LAG) -> None:
        self.max_offset_lag = max_offset_lag
        self._states: dict[TopicPartition, PartitionSyncState] = {}
        self._delayed: dict[TopicPartition, OffsetSync] = {}

    def copied(
        self,
        tp: TopicPartition,
        upstream_offsets: Sequence[int],
        downstream_offsets: Sequence[int],
    ) -> list[OffsetSync]:
        """Record copies of ``tp``'s records, in upstream order; return the syncs due now."""
        state = self._states.get(tp)
        if state is None:
            state = self._states[tp] = PartitionSyncState(self.max_offset_lag)
        due = state.update_batch(upstream_offsets, downstream_offsets)
        if not upstream_offsets:
            return []
        last = len(upstream_offsets) - 1
        if due:
            self._delayed.pop(tp, None)
        if not due or due[-1] != last:
            self._delayed[tp] = OffsetSync(
                tp.topic, tp.partition, upstream_offsets[last], downstream_offsets[last]
            )
        return [
            OffsetSync(tp.topic, tp.partition, upstream_offsets[i], downstream_offsets[i])
            for i in due
        ]

    def promote_delayed(self) -> list[OffsetSync]:
        """At a commit: the held-back sync of each partition's latest copy, then forget them."""
        delayed = list(self._delayed.values())
        self._delayed.clear()
        return delayed


class OffsetSyncStore:
    """Translates upstream offsets to downstream offsets, like MirrorMaker 2's ``OffsetSyncStore``.

    Feed it every sync of the offset-syncs topic in order with :meth:`add`, then call
    :meth:`finish_initial_read` once it has read to the end of the topic, then keep feeding it.

    Per source partition it keeps 64 syncs, ``syncs[0]`` the latest, with older syncs spaced
    about exponentially further back so that recent offsets translate precisely and old ones
    still translate. ``initialization_must_read_to_end`` is MirrorMaker 2's
    ``!checkpointsReadOk``: when the previous checkpoints could not be loaded, only the last sync
    of the initial read is kept, so no translation goes behind a checkpoint written earlier.
    """

    def __init__(self, *, initialization_must_read_to_end: bool) -> None:
        self._initialization_must_read_to_end = initialization_must_read_to_end
        self._read_to_end = False
        self._syncs: dict[TopicPartition, list[OffsetSync]] = {}

    def finish_initial_read(self) -> None:
        """The initial read reached the end of the offset-syncs topic: start translating."""
        self._read_to_end = True

    def add(self, sync: OffsetSync) -> None:
        """Apply one sync read from the offset-syncs topic."""
        # Each record is its own entry, as in Java, even when equal to another: the sync array
        # tells entries apart by identity.
        sync = replace(sync)
        tp = sync.topic_partition
        syncs = self._syncs.get(tp)
        if syncs is None:
            self._syncs[tp] = [sync] * SYNCS_PER_PARTITION
        else:
            self._update_sync_array(syncs, list(syncs), sync)

    def syncs(self, tp: TopicPartition) -> tuple[OffsetSync, ...]:
        """The 64 syncs kept for ``tp``, latest first (empty before its first sync)."""
        return tuple(self._syncs.get(tp, ()))

    def translate_downstream(self, tp: TopicPartition, upstream_offset: int) -> int | None:
        """The downstream offset for a group at ``upstream_offset`` on source partition ``tp``.

        None before the initial read has finished or when ``tp`` has no sync; -1 when every
        kept sync is after ``upstream_offset`` (too old to translate). Otherwise the downstream
        offset of the latest sync at or before ``upstream_offset``, plus one if the group is
        past that sync: never further, since records after the sync may not have been copied.
        """
        syncs = self._syncs.get(tp)
        if not self._read_to_end or syncs is None:
            return None
        sync = next((s for s in syncs if s.upstream_offset <= upstream_offset), syncs[-1])
        if sync.upstream_offset > upstream_offset:
            return -1
        return sync.downstream_offset + (0 if sync.upstream_offset == upstream_offset else 1)

    def _update_sync_array(
        self, syncs: list[OffsetSync], original: list[OffsetSync], sync: OffsetSync
    ) -> None:
        """``OffsetSyncStore.updateSyncArray`` (3.6+): put ``sync`` first, restore B and C.

        Syncs are compared by identity, as in Java: two equal syncs read from two records are
        distinct entries. Python integers do not overflow, but every bound below that would
        overflow a Java long is decided the same way (see ``_invariant_b``/``_invariant_c``).
        """
        only_load_last_offset = not self._read_to_end and self._initialization_must_read_to_end
        upstream_rewind = sync.upstream_offset < syncs[0].upstream_offset
        if only_load_last_offset or upstream_rewind:
            syncs[:] = [sync] * SYNCS_PER_PARTITION
            return
        replacement = sync
        replacement_index = 0
        syncs[0] = replacement  # Invariant A: the latest sync is always first.
        for current in range(1, SYNCS_PER_PARTITION):
            previous = current - 1
            # Look for the oldest value of the original array that may move to `current`.
            while True:
                old_value = original[replacement_index]
                is_recent = _invariant_b(syncs[previous], old_value, previous, current)
                separated_from_previous = _invariant_c(syncs[previous], old_value, previous)
                following = current + 1
                separated_from_next = following >= SYNCS_PER_PARTITION or _invariant_c(
                    old_value, syncs[following], current
                )
                following_replacement = replacement_index + 1
                duplicate = (
                    following_replacement < SYNCS_PER_PARTITION
                    and old_value is original[following_replacement]
                )
                promote_old_value = is_recent and separated_from_previous and separated_from_next
                if promote_old_value:
                    replacement = old_value
                skip_old_value = duplicate or not separated_from_previous
                if promote_old_value or skip_old_value:
                    replacement_index += 1
                if not (replacement_index < current and skip_old_value):
                    break
            if _invariant_b(syncs[previous], syncs[current], previous, current):
                break  # The rest of the array already satisfies the invariants.
            syncs[current] = replacement


def _invariant_b(sync_i: OffsetSync, sync_j: OffsetSync, i: int, j: int) -> bool:
    """Invariant B: ``syncs[i].up <= syncs[j].up + 2^j - 2^i`` for distinct syncs, i < j.

    Where Java's long overflows, the bound is "negative" there and the invariant holds; here
    the bound exceeds every long, so the comparison holds too.
    """
    bound = sync_j.upstream_offset + (1 << j) - (1 << i)
    return sync_i is sync_j or bound < 0 or sync_i.upstream_offset <= bound


def _invariant_c(sync_i: OffsetSync, sync_j: OffsetSync, i: int) -> bool:
    """Invariant C: ``syncs[i].up >= syncs[j].up + 2^max(i-2,0)`` for distinct syncs, i < j.

    Where Java's long overflows, the invariant fails there; here the bound exceeds every
    long, so the comparison fails too.
    """
    bound = sync_j.upstream_offset + (1 << max(i - 2, 0))
    return sync_i is sync_j or (bound >= 0 and sync_i.upstream_offset >= bound)


def checkpoint_is_more_recent(previous: Checkpoint | None, new: Checkpoint) -> bool:
    """Whether MirrorMaker 2 would emit ``new`` after ``previous`` for the same group and partition.

    Yes for the first checkpoint, after an upstream rewind (the group was reset to an earlier
    offset), and when the downstream offset advances. Otherwise the downstream offset would stand
    still or move back, which the checkpoint task never emits.
    """
    return (
        previous is None
        or new.upstream_offset < previous.upstream_offset
        or new.downstream_offset > previous.downstream_offset
    )
