"""Offset syncs: when they are emitted, how offsets translate with them, which checkpoints go out.

Differential tests drive MirrorMaker 2's own ``OffsetSyncWriter`` and ``OffsetSyncStore``
(connect-mirror 4.3.1, with its assertions on) through ``tests/java/Mm2Oracle.java``.
"""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest

from mirrorflow.mm2.formats import Checkpoint, OffsetSync, TopicPartition
from mirrorflow.mm2.offset_syncs import (
    SYNCS_PER_PARTITION,
    OffsetSyncEmitter,
    OffsetSyncStore,
    PartitionSyncState,
    checkpoint_is_more_recent,
)
from tests.mm2_oracle import Mm2Oracle, shared

TP = TopicPartition("t", 0)


@pytest.fixture(scope="module")
def mm2() -> Mm2Oracle:
    return shared()


def offsets(syncs: list[OffsetSync]) -> list[tuple[int, int]]:
    return [(s.upstream_offset, s.downstream_offset) for s in syncs]


def contiguous(first_up: int, first_down: int, count: int) -> tuple[list[int], list[int]]:
    return list(range(first_up, first_up + count)), list(range(first_down, first_down + count))


# Emission: which copies get a sync now, which wait for the commit.


@pytest.mark.parametrize("first_upstream_offset", [0, 500])
def test_first_copy_of_a_lifetime_is_synced_at_once(first_upstream_offset):
    emitter = OffsetSyncEmitter()
    assert offsets(emitter.copied(TP, [first_upstream_offset], [7])) == [(first_upstream_offset, 7)]
    assert emitter.promote_delayed() == []


def test_consecutive_copies_wait_for_the_commit_and_only_the_latest_is_written():
    emitter = OffsetSyncEmitter()
    assert offsets(emitter.copied(TP, *contiguous(0, 0, 5))) == [(0, 0)]
    assert offsets(emitter.copied(TP, *contiguous(5, 5, 3))) == []
    assert emitter.promote_delayed() == [OffsetSync("t", 0, 7, 7)]
    assert emitter.promote_delayed() == []


def test_skipped_upstream_offsets_sync_the_copy_after_the_gap():
    emitter = OffsetSyncEmitter()
    syncs = emitter.copied(TP, [10, 11, 15, 16, 17], [0, 1, 2, 3, 4])
    assert offsets(syncs) == [(10, 0), (15, 2)]
    assert offsets(emitter.promote_delayed()) == [(17, 4)]


def test_a_sync_is_due_when_translation_would_fall_offset_lag_max_behind():
    # Translation goes one past the last sync, so with offset.lag.max=10 the sync at 0 serves
    # downstream offsets up to 10 and the copy at 11 needs a new one.
    emitter = OffsetSyncEmitter(max_offset_lag=10)
    assert offsets(emitter.copied(TP, *contiguous(100, 0, 30))) == [(100, 0), (111, 11), (122, 22)]


def test_a_sync_is_due_for_every_copy_when_offset_lag_max_is_zero():
    emitter = OffsetSyncEmitter(max_offset_lag=0)
    assert offsets(emitter.copied(TP, *contiguous(0, 0, 4))) == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_a_truncated_target_topic_is_synced_at_once():
    emitter = OffsetSyncEmitter()
    syncs = emitter.copied(TP, [0, 1, 2, 3], [50, 51, 0, 1])
    assert offsets(syncs) == [(0, 50), (2, 0)]


def test_a_copy_due_for_a_sync_replaces_the_held_back_one():
    emitter = OffsetSyncEmitter()
    emitter.copied(TP, [0, 1, 2], [0, 1, 2])
    assert offsets(emitter.copied(TP, [9], [3])) == [(9, 3)]
    assert emitter.promote_delayed() == []


def test_a_restarted_emitter_syncs_its_first_copy_again():
    running = OffsetSyncEmitter()
    running.copied(TP, *contiguous(0, 0, 5))
    assert running.copied(TP, [5], [5]) == []
    assert offsets(OffsetSyncEmitter().copied(TP, [5], [5])) == [(5, 5)]


def test_partitions_are_tracked_separately():
    emitter = OffsetSyncEmitter()
    other = TopicPartition("t", 1)
    assert offsets(emitter.copied(TP, [0, 1], [0, 1])) == [(0, 0)]
    assert offsets(emitter.copied(other, [1, 2], [10, 11])) == [(1, 10)]
    assert sorted(emitter.promote_delayed(), key=lambda s: s.partition) == [
        OffsetSync("t", 0, 1, 1),
        OffsetSync("t", 1, 2, 11),
    ]


def test_an_empty_batch_changes_nothing():
    emitter = OffsetSyncEmitter()
    emitter.copied(TP, [0, 1], [0, 1])
    assert emitter.copied(TP, [], []) == []
    assert emitter.promote_delayed() == [OffsetSync("t", 0, 1, 1)]


def test_a_batch_needs_one_downstream_offset_per_upstream_offset():
    with pytest.raises(ValueError, match="3 upstream offsets but 2 downstream offsets"):
        OffsetSyncEmitter().copied(TP, [0, 1, 2], [0, 1])


def random_copies(rnd: random.Random, count: int) -> tuple[list[int], list[int]]:
    """Copies in upstream order with occasional gaps, truncations, rewinds and repeats."""
    ups, downs, up, down = [], [], rnd.randrange(3), rnd.randrange(3)
    for _ in range(count):
        roll = rnd.random()
        if roll < 0.05:
            up += rnd.randrange(2, 20)
        elif roll < 0.07:
            down = max(0, down - rnd.randrange(1, 30))
        elif roll < 0.08:
            up = max(0, up - rnd.randrange(1, 5))
        elif roll < 0.09:
            up, down = up - 1, down - 1
        if rnd.random() < 0.1:
            down += rnd.randrange(1, 3)  # transaction markers on the target
        ups.append(up)
        downs.append(down)
        up, down = up + 1, down + 1
    return ups, downs


@pytest.mark.parametrize("seed", range(20))
def test_a_whole_batch_gives_the_syncs_of_its_records_one_by_one(seed):
    rnd = random.Random(seed)
    lag = rnd.choice([0, 1, 3, 10, 100])
    ups, downs = random_copies(rnd, 300) if seed % 2 else contiguous(7, 0, 300)
    one_by_one = PartitionSyncState(lag)
    expected = [
        i
        for i, (up, down) in enumerate(zip(ups, downs, strict=True))
        if one_by_one.update(up, down)
    ]
    batched = PartitionSyncState(lag)
    due, start = [], 0
    while start < len(ups):
        end = start + rnd.randrange(1, 80)
        due += [start + i for i in batched.update_batch(ups[start:end], downs[start:end])]
        start = end
    assert due == expected
    assert batched == one_by_one


@pytest.mark.parametrize("seed", range(12))
def test_emitter_writes_the_syncs_mirrormaker_2_sends(mm2: Mm2Oracle, seed):
    """Same copies, batches and commits: the same syncs as OffsetSyncWriter, in the same order.

    MirrorMaker 2 is asked as if each pending sync were sent right after its record.
    """
    rnd = random.Random(seed)
    lag = rnd.choice([0, 1, 3, 10, 100])
    emitter = OffsetSyncEmitter(lag)
    copies = {p: random_copies(rnd, 400) for p in range(3)}
    ops, ours = [], []
    while any(ups for ups, _ in copies.values()):
        if rnd.random() < 0.15:
            ops.append("promote")
            ours.append(emitter.promote_delayed())
            continue
        partition = rnd.randrange(3)
        ups, downs = copies[partition]
        size = rnd.choice([1, rnd.randrange(1, 60)])
        batch = list(zip(ups[:size], downs[:size], strict=True))
        copies[partition] = ups[size:], downs[size:]
        ops.append(f"copy,{partition}," + ",".join(f"{up}:{down}" for up, down in batch))
        ours.append(emitter.copied(TopicPartition("t", partition), ups[:size], downs[:size]))
    sent = mm2.writer(lag, ops)
    assert sent == [
        [(s.partition, s.upstream_offset, s.downstream_offset) for s in o] for o in ours
    ]


# Translation: the store of syncs and translate_downstream.


def started_store(*syncs: tuple[int, int]) -> OffsetSyncStore:
    store = OffsetSyncStore(initialization_must_read_to_end=True)
    store.finish_initial_read()
    for up, down in syncs:
        store.add(OffsetSync(TP.topic, TP.partition, up, down))
    return store


def test_nothing_translates_before_the_initial_read_has_finished():
    store = OffsetSyncStore(initialization_must_read_to_end=True)
    store.add(OffsetSync("t", 0, 100, 200))
    assert [store.translate_downstream(TP, up) for up in (0, 100, 200)] == [None] * 3
    store.finish_initial_read()
    assert [store.translate_downstream(TP, up) for up in (0, 100, 200)] == [-1, 200, 201]


def test_a_partition_without_syncs_does_not_translate():
    assert started_store((5, 5)).translate_downstream(TopicPartition("t", 1), 5) is None


def test_offsets_translate_exactly_at_a_sync_and_at_most_one_past_it():
    store = started_store((100, 200))
    assert store.translate_downstream(TP, 150) == 201
    store.add(OffsetSync("t", 0, 150, 251))
    assert store.translate_downstream(TP, 150) == 251
    assert store.translate_downstream(TP, 149) == 201
    assert store.translate_downstream(TP, 5) == -1  # before every sync: too old


def test_a_downstream_reset_is_followed_and_an_upstream_rewind_forgets_history():
    store = started_store((100, 200), (150, 251), (200, 10))
    assert store.translate_downstream(TP, 200) == 10
    store.add(OffsetSync("t", 0, 20, 20))
    assert store.translate_downstream(TP, 20) == 20
    assert store.translate_downstream(TP, 150) == 21
    assert store.syncs(TP) == (OffsetSync("t", 0, 20, 20),) * SYNCS_PER_PARTITION


def test_older_offsets_translate_with_less_precision():
    """MirrorMaker 2's OffsetSyncStoreTest.testPastOffsetTranslation, with its figures."""
    store = OffsetSyncStore(initialization_must_read_to_end=True)
    for offset in range(0, 1001, 10):
        store.add(OffsetSync("t", 0, offset, offset))
    store.finish_initial_read()

    def translates(sync_offset: int, previous_offset: int) -> None:
        below = -1 if previous_offset == -1 else previous_offset + 1
        got = [store.translate_downstream(TP, sync_offset + d) for d in (-1, 0, 1, 2)]
        assert got == [below, sync_offset, sync_offset + 1, sync_offset + 1]

    # Only the last sync of the initial read is kept when checkpoints could not be read.
    translates(1000, -1)
    for offset in range(1010, 10001, 10):
        store.add(OffsetSync("t", 0, offset, offset))
        assert_sync_invariants(store.syncs(TP))
    translates(1000, -1)
    for sync_offset, previous_offset in [
        (4840, 1000), (6760, 4840), (8680, 6760), (9160, 8680), (9640, 9160),
        (9880, 9640), (9940, 9880), (9970, 9940), (9990, 9970), (10000, 9990),
    ]:  # fmt: skip
        translates(sync_offset, previous_offset)


def test_history_from_the_initial_read_is_kept_when_checkpoints_were_read():
    store = OffsetSyncStore(initialization_must_read_to_end=False)
    for offset in range(0, 1001, 10):
        store.add(OffsetSync("t", 0, offset, offset))
    store.finish_initial_read()
    assert store.translate_downstream(TP, 0) == 0
    assert 0 < store.translate_downstream(TP, 500) <= 500


def assert_sync_invariants(syncs: tuple[OffsetSync, ...]) -> None:
    """MirrorMaker 2's assertSparseSyncInvariant: invariants A to C on one sync array."""
    assert len(syncs) == SYNCS_PER_PARTITION
    for j in range(SYNCS_PER_PARTITION):
        for i in range(j):
            up_i, up_j = syncs[i].upstream_offset, syncs[j].upstream_offset
            if up_i == up_j:
                continue
            assert up_i > up_j, f"A: syncs[{i}]={up_i} is not after syncs[{j}]={up_j}"
            assert up_i >= up_j + (1 << max(i - 2, 0)), f"C({i},{j}): {up_i} too close to {up_j}"
            bound = up_j + (1 << j) - (1 << i)
            assert bound >= 2**63 or up_i <= bound, f"B({i},{j}): {up_i} > {bound}"


@pytest.mark.parametrize("step", [1, 3, 10, 127, 2**20 + 1, 2**52 + 7])
def test_store_keeps_its_invariants_and_expires_at_most_one_distinct_sync_per_new_one(step):
    """Port of testKeepMostDistinctSyncs, with invariant checks at each step."""
    store = started_store()
    distinct_before = 1
    for offset in range(0, 400 * step, step):
        store.add(OffsetSync("t", 0, offset, offset))
        syncs = store.syncs(TP)
        assert syncs[0].upstream_offset == offset  # invariant A: the latest sync is first
        assert syncs[-1].upstream_offset == 0  # invariant D: the earliest sync is kept
        distinct = 1 + sum(syncs[i] is not syncs[i - 1] for i in range(1, SYNCS_PER_PARTITION))
        assert distinct >= distinct_before - 1
        distinct_before = distinct
    assert_sync_invariants(store.syncs(TP))


def random_syncs(rnd: random.Random, count: int) -> list[tuple[int, int, int]]:
    """(partition, up, down): mostly forward with steps of all sizes, some rewinds and repeats."""
    ups, down, syncs = [rnd.randrange(1000), rnd.randrange(1000)], 0, []
    for _ in range(count):
        partition = rnd.randrange(2)
        roll = rnd.random()
        if roll < 0.02:
            ups[partition] = max(0, ups[partition] - rnd.randrange(1, 500))
        elif roll > 0.04:
            ups[partition] += rnd.choice([1, 1, 2, 3, rnd.randrange(100), rnd.randrange(10**4)])
        down += rnd.randrange(50)
        syncs.append((partition, ups[partition], down))
    return syncs


@pytest.mark.parametrize("seed", range(16))
def test_store_holds_and_translates_like_mirrormaker_2(mm2: Mm2Oracle, seed):
    """The same syncs give the same 64 syncs per partition and the same translations."""
    rnd = random.Random(seed)
    must_read_to_end = seed % 2 == 0
    store = OffsetSyncStore(initialization_must_read_to_end=must_read_to_end)
    syncs = random_syncs(rnd, 300)
    start_at = rnd.randrange(len(syncs))
    ops, ours = [], []
    for index, (partition, up, down) in enumerate(syncs):
        if index == start_at:
            ops.append("start")
            ours.append("started")
            store.finish_initial_read()
        tp = TopicPartition("t", partition)
        ops.append(f"sync,{partition},{up},{down}")
        store.add(OffsetSync("t", partition, up, down))
        ours.append("/".join(f"{s.upstream_offset}:{s.downstream_offset}" for s in store.syncs(tp)))
        assert_sync_invariants(store.syncs(tp))
        for query in (rnd.randrange(up + 10), up, up + 1):
            ops.append(f"translate,{partition},{query}")
            translated = store.translate_downstream(tp, query)
            ours.append("none" if translated is None else str(translated))
    assert mm2.store(must_read_to_end, ops) == ours


# End to end: copies, emitted syncs, translation.


@pytest.mark.parametrize("seed", range(8))
def test_translation_never_skips_a_copied_record(seed):
    """Replicate a partition with gaps, batches, commits and crashes; translate every offset.

    A group at upstream offset u has yet to read every record at or after u. Its translated
    offset must not be past the latest copy of any of them, nor past the end of the target.
    After a crash the job copies again from its last commit, as at-least-once replication does;
    records it has yet to copy again will land at the end of the target. (As in MirrorMaker 2,
    a failover in the middle of that catch-up may skip their older copies.)
    """
    rnd = random.Random(seed)
    source = sorted(rnd.sample(range(3000), 1200))  # upstream gaps: compaction, markers, filters
    emitter = OffsetSyncEmitter(rnd.choice([1, 5, 10, 100]))
    store = OffsetSyncStore(initialization_must_read_to_end=rnd.random() < 0.5)
    start_after = rnd.randrange(20)
    emitted = 0
    latest_copy: dict[int, int] = {}
    next_down = rnd.randrange(100)
    position = committed = 0

    def write(syncs: list[OffsetSync]) -> None:
        nonlocal emitted
        for sync in syncs:
            store.add(sync)
            emitted += 1
            if emitted == start_after:
                store.finish_initial_read()

    while position < len(source):
        ups = source[position : position + rnd.randrange(1, 60)]
        downs = []
        for up in ups:
            next_down += 1 + (rnd.random() < 0.05)  # transaction markers on the target
            latest_copy[up] = next_down - 1
            downs.append(next_down - 1)
        write(emitter.copied(TP, ups, downs))
        position += len(ups)
        roll = rnd.random()
        if roll < 0.2:
            write(emitter.promote_delayed())
            committed = position
        elif roll < 0.25:  # crash: delayed syncs are lost, copying resumes at the last commit
            emitter = OffsetSyncEmitter(emitter.max_offset_lag)
            position = committed
        if rnd.random() < 0.2 or position == len(source):
            copied = {up: latest_copy[up] for up in source[:position]}
            assert_never_skips(store, copied, next_down, source[-1] + 3)
    store.finish_initial_read()
    assert_never_skips(store, latest_copy, next_down, source[-1] + 3)


def assert_never_skips(
    store: OffsetSyncStore, copies: dict[int, int], end: int, groups_up_to: int
) -> None:
    """Translate groups at upstream offsets 0 to ``groups_up_to``.

    ``copies`` maps the upstream offset of each copied record to the downstream offset of its
    latest copy; ``end`` is the next downstream offset.
    """
    copied = sorted(copies)
    # bound[k]: the lowest downstream offset among copies of copied[k:], or the end of the target.
    bound = [end] * (len(copied) + 1)
    for k in range(len(copied) - 1, -1, -1):
        bound[k] = min(bound[k + 1], copies[copied[k]])
    previous = -1
    for up in range(groups_up_to):
        translated = store.translate_downstream(TP, up)
        if translated is None or translated == -1:
            continue
        assert translated <= bound[bisect_left(copied, up)], f"group at {up} skips records"
        assert translated >= previous, f"translation goes back at upstream offset {up}"
        previous = translated


@pytest.mark.parametrize("seed", range(6))
def test_every_copy_translates_less_than_offset_lag_max_behind_its_own_offset(seed):
    """With every emitted sync at hand, a group that stopped at any copy re-reads < lag records."""
    rnd = random.Random(seed)
    lag = rnd.choice([1, 2, 10, 100])
    emitter = OffsetSyncEmitter(lag)
    ups, downs = [u for u, _ in enumerate(range(2000)) if rnd.random() < 0.9], []
    next_down = 0
    for _ in ups:
        next_down += 1 + (rnd.random() < 0.05)
        downs.append(next_down)
    syncs: list[OffsetSync] = []
    start = 0
    while start < len(ups):
        end = start + rnd.randrange(1, 100)
        syncs += emitter.copied(TP, ups[start:end], downs[start:end])
        if rnd.random() < 0.3:
            syncs += emitter.promote_delayed()
        start = end
    syncs += emitter.promote_delayed()
    synced_ups = [s.upstream_offset for s in syncs]
    assert synced_ups == sorted(synced_ups)
    for up, down in zip(ups, downs, strict=True):
        sync = syncs[bisect_left(synced_ups, up + 1) - 1]
        translated = sync.downstream_offset + (sync.upstream_offset != up)
        assert 0 <= down - translated < lag


def test_a_caught_up_group_translates_to_the_end_of_the_target_after_a_commit():
    emitter = OffsetSyncEmitter()
    store = started_store()
    for sync in emitter.copied(TP, [0, 1, 2, 4, 5, 6], [10, 11, 12, 13, 14, 15]):
        store.add(sync)
    assert store.translate_downstream(TP, 7) == 14  # behind: the delayed sync is not written
    for sync in emitter.promote_delayed():
        store.add(sync)
    assert store.translate_downstream(TP, 7) == 16


# Checkpoints.


@pytest.mark.parametrize(
    ("previous", "new", "emitted"),
    [
        (None, (10, 5), True),
        ((10, 5), (12, 6), True),  # the downstream offset advanced
        ((10, 5), (10, 5), False),  # repeated checkpoint
        ((10, 5), (12, 5), False),  # upstream moved but downstream did not
        ((10, 5), (11, 4), False),  # the downstream offset would go back
        ((10, 5), (3, 1), True),  # the group was rewound upstream
    ],
)
def test_a_checkpoint_is_emitted_only_if_more_recent(previous, new, emitted):
    def checkpoint(offsets: tuple[int, int] | None) -> Checkpoint | None:
        return offsets and Checkpoint("g", "A.t", 0, *offsets)

    assert checkpoint_is_more_recent(checkpoint(previous), checkpoint(new)) is emitted
