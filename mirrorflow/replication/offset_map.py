"""Exact offset translation: every copy's source and target offsets, kept as runs.

MirrorMaker 2 keeps a sample of (upstream, downstream) pairs, its offset syncs, and translates a
group's offset to at most one record past the nearest sync, so a failed-over group re-reads up to
``offset.lag.max`` records, and far more when it lags. mirrorflow knows the target offset of every
copy it makes, and keeps all of them, compressed: a :class:`Run` is a stretch of copies whose
source and target offsets both advance by exactly one. A run ends wherever either side skips an
offset: transaction markers, aborted or compacted records on the source, the commit markers of
the exactly-once writer on the target, a restart that copies some records again.

Translating a committed source offset ``u`` (the next record the group would read) gives the
target offset right after the last copy of a record before ``u``::

    translate(u) = 1 + downstream offset of the last copy (in target order) of a record < u

A consumer that starts there reads every record at or after ``u`` and, if the mirror copied some
records twice, only those twice; nothing it had consumed otherwise. Since the target offsets of
later runs are all above those of earlier runs, that last copy lies in the last run (in target
order) that starts before ``u``.

The runs are stored on the target cluster in a compacted topic, ``mirrorflow-offset-map.<source>.
internal``, one record per run (a growing run rewrites its record). They are written before the
flow's position moves past them (in exactly-once mode, in the same transaction), so the map always
covers every copy below the position. Runs entirely below a source partition's log start (deleted
by retention) are removed, so the map is bounded by the source's retention. This module holds the
logic and the record format, without I/O.
"""

from __future__ import annotations

import struct
import threading
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MAP_TOPIC_FORMAT = "mirrorflow-offset-map.{source}.internal"
OFFSET_MAP_TOPIC_CONFIG = {"segment.ms": str(3_600_000)}
"""Besides compaction: a segment closes (and can be compacted) within an hour, so a run that
grows batch after batch leaves one record, not one per batch (a broker's default is 7 days)."""
RECORD_VERSION = 0

Partition = tuple[str, int]  # source topic, partition


def map_topic(source: str) -> str:
    """The offset-map topic of flows from ``source`` (it lives on their target cluster)."""
    return MAP_TOPIC_FORMAT.format(source=source)


@dataclass(frozen=True)
class Run:
    """``count`` copies: source offsets ``upstream..`` landed at target offsets ``downstream..``."""

    upstream: int
    downstream: int
    count: int

    @property
    def upstream_end(self) -> int:
        """One past the run's last source offset."""
        return self.upstream + self.count

    @property
    def downstream_end(self) -> int:
        """One past the run's last target offset."""
        return self.downstream + self.count

    def continued_by(self, other: Run) -> bool:
        """Whether ``other`` starts exactly where this run ends, on both sides."""
        return other.upstream == self.upstream_end and other.downstream == self.downstream_end


def runs_of(upstream: Sequence[int], downstream: Sequence[int]) -> list[Run]:
    """The runs of copies given in target order: ``upstream[i]`` landed at ``downstream[i]``."""
    if len(upstream) != len(downstream):
        raise ValueError(f"{len(upstream)} source offsets but {len(downstream)} target offsets")
    runs: list[Run] = []
    start = 0
    for i in range(1, len(upstream) + 1):
        if (
            i == len(upstream)
            or upstream[i] != upstream[i - 1] + 1
            or downstream[i] != downstream[i - 1] + 1
        ):
            runs.append(Run(upstream[start], downstream[start], i - start))
            start = i
    return runs


@dataclass(frozen=True)
class Translation:
    """Where a group at source offset ``upstream`` resumes on the target, and how sure that is.

    ``exactness``:
    - ``exact``: the consumer reads exactly the records at or after ``upstream`` (plus any the
      mirror itself copied twice);
    - ``ahead``: the group is past what the mirror has copied so far; the offset is where the
      next copies land, so the records between the mirror's position and ``upstream`` will be
      read again once copied (a later translation is exact);
    - ``before-first-copy``: the group is before the first record the map knows (copying started
      later, or earlier runs expired with the source's retention); the offset is that record's;
    - ``both-sides``: provenance mode, a partition holding records first written on either
      cluster: the first record of either side the group has not read; nothing is lost, and the
      other side's records between the two are read again.
    """

    upstream: int
    downstream: int
    exactness: str


class PartitionMap:
    """The runs of one source partition, in target order."""

    def __init__(self, runs: Iterable[Run] = ()) -> None:
        self.runs: list[Run] = []
        self._upstreams: list[int] = []
        self._monotone = True  # run upstream offsets ascend in target order (no re-copies)
        for run in runs:
            self._append(run)

    def _append(self, run: Run) -> None:
        if self.runs and run.upstream < self.runs[-1].upstream_end:
            self._monotone = False
        self.runs.append(run)
        self._upstreams.append(run.upstream)

    def add(self, runs: Iterable[Run]) -> list[Run]:
        """Add the runs of new copies (target order, after all earlier ones); return the runs
        to store: the last known run, if the first new one continues it, and the new ones."""
        changed: list[Run] = []
        for run in runs:
            if run.count <= 0:
                continue
            last = self.runs[-1] if self.runs else None
            if last is not None and run.downstream < last.downstream_end:
                raise ValueError(
                    f"copies at target offset {run.downstream} come before the end of the known "
                    f"copies ({last.downstream_end}): the target topic went back"
                )
            if last is not None and last.continued_by(run):
                merged = Run(last.upstream, last.downstream, last.count + run.count)
                self.runs[-1] = merged
                if changed and changed[-1].downstream == merged.downstream:
                    changed[-1] = merged
                else:
                    changed.append(merged)
            else:
                self._append(run)
                changed.append(run)
        return changed

    def put(self, run: Run) -> None:
        """Load one stored run (records in any order; a later record of a run replaces it)."""
        if not self.runs or run.downstream > self.runs[-1].downstream:
            self._append(run)
            return
        if run.downstream == self.runs[-1].downstream:
            self.runs[-1], self._upstreams[-1] = run, run.upstream
            if len(self.runs) >= 2 and run.upstream < self.runs[-2].upstream_end:
                self._monotone = False
            return
        index = bisect_left([r.downstream for r in self.runs], run.downstream)
        if index < len(self.runs) and self.runs[index].downstream == run.downstream:
            self.runs[index] = run
        else:
            self.runs.insert(index, run)
        self._reindex()

    def remove(self, downstream: int) -> None:
        """Forget the run that starts at target offset ``downstream`` (a tombstone)."""
        self.runs = [r for r in self.runs if r.downstream != downstream]
        self._reindex()

    def _reindex(self) -> None:
        runs, self.runs, self._upstreams, self._monotone = self.runs, [], [], True
        for run in runs:
            self._append(run)

    def expire(self, log_start: int) -> list[Run]:
        """Drop the oldest runs whose records are all gone from the source (below its log start
        offset), never the last one; return the dropped runs."""
        keep = 0
        while keep < len(self.runs) - 1 and self.runs[keep].upstream_end <= log_start:
            keep += 1
        dropped = self.runs[:keep]
        if dropped:
            self.runs = self.runs[keep:]
            self._reindex()
        return dropped

    def translate(self, upstream: int, position: int | None = None) -> Translation | None:
        """The target offset for a group at source offset ``upstream``; None before any copy.

        ``position`` is the mirror's position in the source partition (the next offset it will
        copy): every source offset below it was copied or holds no record to copy.
        """
        if not self.runs:
            return None
        index = self._last_run_before(upstream)
        if index < 0:
            first = self.runs[0]
            exactness = "exact" if upstream == first.upstream else "before-first-copy"
            return Translation(upstream, first.downstream, exactness)
        run = self.runs[index]
        if upstream <= run.upstream_end:
            return Translation(upstream, run.downstream + (upstream - run.upstream), "exact")
        # The source offsets between the run's end and ``upstream`` have no copy after it: they
        # hold no records to copy (markers, aborted or compacted records) if the mirror has
        # passed them, or are not copied yet.
        copied_past = position is not None and upstream <= position
        last = index == len(self.runs) - 1
        exactness = "exact" if copied_past or not last else "ahead"
        return Translation(upstream, run.downstream_end, exactness)

    def translate_back(self, downstream: int) -> Translation | None:
        """Where a group that consumed the copies below target offset ``downstream`` resumes on
        the source: the first source record whose copy it has not read (failback). None before
        any copy. The result's ``upstream`` is the source offset, ``downstream`` the given one.

        With records copied twice, the earliest source offset among the copies at or after
        ``downstream``: the group re-reads only records the mirror copied twice.
        """
        if not self.runs:
            return None
        first = self.runs[0]
        if downstream <= first.downstream:
            exactness = "exact" if downstream == first.downstream else "before-first-copy"
            return Translation(first.upstream, downstream, exactness)
        if self._monotone:
            index = bisect_left([r.downstream_end for r in self.runs], downstream + 1)
            if index == len(self.runs):
                return Translation(self.runs[-1].upstream_end, downstream, "exact")
            run = self.runs[index]
            upstream = run.upstream + max(0, downstream - run.downstream)
            return Translation(upstream, downstream, "exact")
        candidates = [
            run.upstream + max(0, downstream - run.downstream)
            for run in self.runs
            if run.downstream_end > downstream
        ]
        upstream = min(candidates) if candidates else self.runs[-1].upstream_end
        return Translation(upstream, downstream, "exact")

    def _last_run_before(self, upstream: int) -> int:
        """The index of the last run (target order) that starts before ``upstream``, or -1."""
        if self._monotone:
            return bisect_left(self._upstreams, upstream) - 1
        for index in range(len(self.runs) - 1, -1, -1):
            if self.runs[index].upstream < upstream:
                return index
        return -1


class OffsetMap:
    """The runs of every source partition of one flow."""

    def __init__(self) -> None:
        self.partitions: dict[Partition, PartitionMap] = {}
        self._lock = threading.Lock()  # the mirror's batches add, its checkpoint task reads

    def partition(self, tp: Partition) -> PartitionMap:
        if tp not in self.partitions:
            self.partitions[tp] = PartitionMap()
        return self.partitions[tp]

    def add(self, tp: Partition, runs: Iterable[Run]) -> list[Run]:
        """:meth:`PartitionMap.add` for ``tp``."""
        with self._lock:
            return self.partition(tp).add(runs)

    def last_run(self, tp: Partition) -> Run | None:
        with self._lock:
            part = self.partitions.get(tp)
            return part.runs[-1] if part and part.runs else None

    def translate(
        self, tp: Partition, upstream: int, position: int | None = None
    ) -> Translation | None:
        with self._lock:
            part = self.partitions.get(tp)
            return part.translate(upstream, position) if part else None

    def translate_back(self, tp: Partition, downstream: int) -> Translation | None:
        """:meth:`PartitionMap.translate_back` for ``tp`` (a source partition)."""
        with self._lock:
            part = self.partitions.get(tp)
            return part.translate_back(downstream) if part else None

    def expire(self, tp: Partition, log_start: int) -> list[Run]:
        """:meth:`PartitionMap.expire` for ``tp``."""
        with self._lock:
            part = self.partitions.get(tp)
            return part.expire(log_start) if part else []

    def load(self, key: bytes, value: bytes | None) -> None:
        """Apply one record of the offset-map topic."""
        tp, downstream = decode_key(key)
        with self._lock:
            if value is None:
                if tp in self.partitions:
                    self.partitions[tp].remove(downstream)
                return
            self.partition(tp).put(decode_value(downstream, value))

    def size(self) -> int:
        """How many runs the map holds."""
        return sum(len(p.runs) for p in self.partitions.values())


# -- record format: key (topic, partition, first target offset), value (version, first source
# offset, count); big-endian, strings with a 2-byte length, like MirrorMaker 2's records.


def encode_key(tp: Partition, downstream: int) -> bytes:
    topic = tp[0].encode()
    return struct.pack(f">h{len(topic)}siq", len(topic), topic, tp[1], downstream)


def decode_key(key: bytes) -> tuple[Partition, int]:
    (length,) = struct.unpack_from(">h", key)
    topic = key[2 : 2 + length].decode()
    partition, downstream = struct.unpack_from(">iq", key, 2 + length)
    return (topic, partition), downstream


def encode_value(run: Run) -> bytes:
    return struct.pack(">hqq", RECORD_VERSION, run.upstream, run.count)


def decode_value(downstream: int, value: bytes) -> Run:
    version, upstream, count = struct.unpack_from(">hqq", value)
    if version != RECORD_VERSION:
        raise ValueError(f"offset-map record of version {version}; this mirrorflow reads 0")
    return Run(upstream, downstream, count)


def record_of(tp: Partition, run: Run) -> tuple[bytes, bytes]:
    """The key and value that store ``run`` of ``tp``."""
    return encode_key(tp, run.downstream), encode_value(run)
