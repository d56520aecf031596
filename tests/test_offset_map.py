"""The offset map translates a committed source offset to exactly where a consumer resumes."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from mirrorflow.replication.offset_map import (
    OffsetMap,
    PartitionMap,
    Run,
    decode_key,
    decode_value,
    record_of,
    runs_of,
)

TP = ("orders", 3)


def simulate(seed: int) -> tuple[list[tuple[int, int]], int]:
    """A target partition's copies (source offset, target offset) in target order, from a
    source with gaps (markers, compaction) and a mirror that restarts and re-copies, and an
    exactly-once writer's commit markers; plus the mirror's position."""
    rng = random.Random(seed)
    source = [o for o in range(400) if rng.random() > 0.15]  # offsets that hold records
    copies, down, position = [], 0, 0
    while position < 400:
        start = next((i for i, o in enumerate(source) if o >= position), len(source))
        batch = source[start : start + rng.randint(1, 60)]
        for offset in batch:
            copies.append((offset, down))
            down += 1
        down += rng.choice([0, 0, 1])  # a commit marker on the target
        position = (batch[-1] + 1) if batch else 400
        if rng.random() < 0.2 and copies:  # a crash: the position goes back, records re-copied
            position = max(0, position - rng.randint(1, 50))
    return copies, position


def mapped(copies: list[tuple[int, int]], batch: int) -> PartitionMap:
    """The map of ``copies`` (target order), added ``batch`` copies at a time as batches are."""
    part = PartitionMap()
    for i in range(0, len(copies), batch):
        chunk = copies[i : i + batch]
        part.add(runs_of([u for u, _ in chunk], [d for _, d in chunk]))
    return part


def twice(copies: list[tuple[int, int]]) -> set[int]:
    """The source offsets copied more than once."""
    seen: set[int] = set()
    return {u for u, _ in copies if u in seen or seen.add(u)}


def resumed(copies: list[tuple[int, int]], downstream: int) -> list[int]:
    """The source offsets a consumer reads from target offset ``downstream`` on."""
    return [up for up, down in copies if down >= downstream]


@pytest.mark.parametrize("seed", range(40))
def test_a_consumer_resumes_with_exactly_the_records_it_had_not_consumed(seed):
    copies, position = simulate(seed)
    part = mapped(copies, 17)  # batches arrive in target order; the map merges what continues
    copied_twice = twice(copies)
    for committed in range(0, 401):
        t = part.translate(committed, position)
        read = resumed(copies, t.downstream)
        wanted = sorted({u for u, _ in copies if u >= committed})
        assert sorted(set(read)) == wanted, (committed, t)  # nothing lost
        times = Counter(read)
        repeats = [u for u in read if u < committed or times[u] > 1]
        assert set(repeats) <= copied_twice, (committed, t)  # repeats only of double copies
        assert t.exactness in ("exact", "before-first-copy")


def test_a_group_at_a_transaction_marker_resumes_after_the_last_record_before_it():
    part = PartitionMap(runs_of([0, 1, 2, 4, 5, 7], [0, 1, 2, 3, 4, 5]))  # markers at 3 and 6
    assert [part.translate(u, 8).downstream for u in range(9)] == [0, 1, 2, 3, 3, 4, 5, 5, 6]
    assert part.runs == [Run(0, 0, 3), Run(4, 3, 2), Run(7, 5, 1)]


def test_a_group_ahead_of_the_mirror_is_told_so_and_sent_to_the_next_copy():
    part = PartitionMap([Run(10, 0, 5)])
    assert part.translate(15, 15).exactness == "exact"
    ahead = part.translate(20, 15)
    assert (ahead.downstream, ahead.exactness) == (5, "ahead")
    before = part.translate(3, 15)
    assert (before.downstream, before.exactness) == (0, "before-first-copy")


def test_runs_that_continue_are_merged_and_each_stored_run_is_one_record():
    part = PartitionMap()
    assert part.add([Run(0, 0, 5)]) == [Run(0, 0, 5)]
    assert part.add([Run(5, 5, 5), Run(11, 10, 2)]) == [Run(0, 0, 10), Run(11, 10, 2)]
    stored = OffsetMap()
    for run in part.runs:
        stored.load(*record_of(TP, run))
    stored.load(*record_of(TP, Run(11, 10, 4)))  # the run grew: its record was rewritten
    assert stored.partitions[TP].runs == [Run(0, 0, 10), Run(11, 10, 4)]
    key, value = record_of(TP, Run(11, 10, 4))
    assert decode_key(key) == (TP, 10) and decode_value(10, value) == Run(11, 10, 4)
    stored.load(key, None)  # a tombstone forgets the run
    assert stored.partitions[TP].runs == [Run(0, 0, 10)]


def test_copies_that_go_back_on_the_target_are_refused():
    part = PartitionMap([Run(0, 100, 5)])
    with pytest.raises(ValueError, match="went back"):
        part.add([Run(5, 50, 1)])


def test_runs_below_the_source_log_start_expire_but_the_last_one_stays():
    part = PartitionMap([Run(0, 0, 10), Run(11, 10, 10), Run(22, 20, 10)])
    assert part.expire(25) == [Run(0, 0, 10), Run(11, 10, 10)]
    assert part.runs == [Run(22, 20, 10)]
    assert part.expire(1000) == []  # the last run is kept: later offsets still translate
    assert part.translate(40, 40).downstream == 30


@pytest.mark.parametrize("seed", range(40))
def test_a_group_that_read_the_copies_resumes_on_the_source_exactly_after_them(seed):
    """Failback: a group that consumed the target's copies up to some offset goes back to the
    source and reads every record whose copy it had not read, repeating only double copies."""
    copies, _position = simulate(seed)
    part = mapped(copies, 23)
    copied_twice = twice(copies)
    source = sorted({u for u, _ in copies})
    for stopped_at in range(0, copies[-1][1] + 3):
        back = part.translate_back(stopped_at)
        read_on_target = {u for u, d in copies if d < stopped_at}
        unread = {u for u, d in copies if d >= stopped_at} - read_on_target
        resumed_on_source = {u for u in source if u >= back.upstream}
        assert unread <= resumed_on_source, stopped_at  # nothing lost
        assert resumed_on_source & read_on_target <= copied_twice, stopped_at
