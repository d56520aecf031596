"""The JVM copier from the driver's side: its results decoded, and its continuous streams.

The copier (``jvm/mirror-copier``, class :data:`mirrorflow.runtime.jvm.COPIER_CLASS`) copies
offset ranges of source partitions with Kafka's Java clients, as a Spark job or in the driver's
JVM, and answers in one encoded block (``MirrorCopier.Copied.encode``): :class:`CopierResult`.

A :class:`CopyStream` is the copier run continuously in the driver's JVM: one task per source
partition, reading from the flow's position with no end, copying records as they arrive and
writing offset syncs, until it is ended. The driver only supervises it: every
:data:`~mirrorflow.runtime.driver.STREAM_COMMIT_S` it harvests what was acknowledged since the
last harvest (a :class:`CopierResult` whose ``reached`` offsets are the positions to write, and
whose runs all lie below them) and writes it, as it does after a batch.
"""

from __future__ import annotations

import builtins  # the type bytes, which a field of CopierResult hides in its class
import struct
from dataclasses import dataclass, field

from mirrorflow.replication.offset_map import Run
from mirrorflow.runtime.metrics import Copied, Stats

Partition = tuple[str, int]

_HEAD = struct.Struct(">qqq")  # records, bytes, ranges
_RANGE = struct.Struct(">13q")  # see MirrorCopier.Copied.encode
_RUN = struct.Struct(">qqqq")  # range index, first source offset, first target offset, count


@dataclass
class CopierResult:
    """What the copier copied of its ranges (in their order): records and bytes in all, per
    partition its figures and runs of copies, the offset each range reached, the ranges the
    source left unfinished (``stalled``: partition, offset), and, for a stream's ranges, when
    each was last caught up (epoch ms, -1 never) and the end its consumer last saw (-1
    unknown)."""

    records: int = 0
    bytes: int = 0
    copied: dict[Partition, Copied] = field(default_factory=dict)
    runs: dict[Partition, list[Run]] = field(default_factory=dict)
    reached: list[int] = field(default_factory=list)
    stalled: list[tuple[Partition, int]] = field(default_factory=list)
    caught_up_ms: list[int] = field(default_factory=list)
    ends_seen: list[int] = field(default_factory=list)

    @classmethod
    def decode(cls, data: builtins.bytes, partitions: list[Partition]) -> CopierResult:
        """``MirrorCopier.Copied.encode``'s block for ranges of ``partitions`` (in order)."""
        records, size, count = _HEAD.unpack_from(data)
        result = cls(records, size)
        ranges_end = _HEAD.size + _RANGE.size * count
        for index, (nbytes, *stats, until, stall, caught_up, end) in enumerate(
            _RANGE.iter_unpack(data[_HEAD.size : ranges_end])
        ):
            tp = partitions[index]
            figures = Copied(0, nbytes, Stats.of(*stats[:4]), Stats.of(*stats[4:]))
            known = result.copied.get(tp)
            result.copied[tp] = known.merge(figures) if known else figures
            result.reached.append(until)
            result.caught_up_ms.append(caught_up)
            result.ends_seen.append(end)
            if stall:
                result.stalled.append((tp, until))
        for index, up, down, n in _RUN.iter_unpack(memoryview(data)[ranges_end:]):
            result.runs.setdefault(partitions[index], []).append(Run(up, down, n))
        for tp, partition_runs in result.runs.items():
            figures = result.copied.setdefault(tp, Copied())
            figures.records += sum(run.count for run in partition_runs)
        return result


class CopyStream:
    """A continuous copy of ``partitions`` from ``starts`` (their positions) in the driver's
    JVM, named ``batch`` (so that ``MirrorCopier.cancel`` ends it, as a batch's); ``settings``
    is the copier's Java map of settings (its ``batch`` set here)."""

    def __init__(
        self, copier, batch: str, partitions: list[Partition], starts: list[int], settings
    ) -> None:
        self.copier, self.batch, self.partitions = copier, batch, partitions
        settings.put("batch", batch)
        lines = [f"{t}\t{p}\t{start}" for (t, p), start in zip(partitions, starts, strict=True)]
        copier.stream(lines, settings)

    def harvest(self) -> CopierResult:
        """What was acknowledged since the last harvest; raises (py4j's error, holding the
        copier's message) when a partition's task failed: then :meth:`end` it."""
        return CopierResult.decode(bytes(self.copier.harvest(self.batch)), self.partitions)

    def end(self) -> tuple[CopierResult, str | None]:
        """Stop every task (at its next poll, its copies acknowledged) and return what was
        acknowledged since the last harvest, and the first task's error (its Java classes and
        messages, one cause a line), or None."""
        result = CopierResult.decode(bytes(self.copier.endStream(self.batch)), self.partitions)
        return result, self.copier.streamError(self.batch)
