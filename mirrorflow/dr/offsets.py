"""Offsets as DR run records keep them: a partition ``(topic, partition)`` keyed ``"topic-p"``,
and offset maps flat (``{(topic, partition): offset}``, as the code works with them) or nested
(``{topic: {"partition": offset}}``, as ``progress.json`` and the run records keep them)."""

from __future__ import annotations

from mirrorflow.dr.steps import Partition


def partition_key(tp: Partition) -> str:
    """A partition as the run records name it: ``"topic-p"``."""
    return f"{tp[0]}-{tp[1]}"


def key_partition(key: str) -> Partition:
    """The partition a run record's ``"topic-p"`` names (the topic may hold dashes)."""
    topic, partition = key.rsplit("-", 1)
    return topic, int(partition)


def flat_offsets(nested: dict[str, dict[str, int]] | None) -> dict[Partition, int]:
    """Nested offsets (topic -> partition -> offset, as JSON keeps them) as a flat map."""
    return {(t, int(p)): int(v) for t, parts in (nested or {}).items() for p, v in parts.items()}


def nested_offsets(offsets: dict[Partition, int]) -> dict[str, dict[str, int]]:
    """Offsets as JSON: topic -> partition -> offset (as ``progress.json`` keeps them)."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return nested
