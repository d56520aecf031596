"""Where a flow's source partitions start and end: their earliest and latest offsets, the
offsets at a time, and a consumer group's committed offsets (MirrorMaker 1's, when a flow takes
over from it), as the mirror job plans its batches and places new partitions.

An answer that is not an offset (librdkafka's -1001 after a timed-out request, a leader moving)
is reported as an unreachable source, retried by the job, never read as a truncated partition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mirrorflow.errors import ClusterUnreachable
from mirrorflow.mm2 import configdefs
from mirrorflow.replication import clients
from mirrorflow.replication.group_offsets_client import GroupOffsetsClient
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin, cluster_error, refused

log = logging.getLogger("mirrorflow.mirror")

Partition = tuple[str, int]


class SourceOffsets:
    """The offsets of a flow's source partitions, asked of the source's admin client."""

    def __init__(self, spec: MirrorSpec, admin: ClusterAdmin) -> None:
        self.spec, self.admin = spec, admin

    def offsets(
        self,
        partitions: list[Partition],
        spec_of: Callable[[str, int], Any],
        by_time: bool = False,
    ) -> dict[Partition, int]:
        """The source's offsets of ``partitions`` as ``spec_of`` asks. An earliest or latest
        offset is never negative: librdkafka answers -1001 (unknown) without an error when the
        request times out (a cut link), and that must not read as a truncated partition, so it
        is retried like an unreachable cluster. ``by_time``: -1 (no record that late) is kept.
        """
        from confluent_kafka import IsolationLevel, TopicPartition

        if not partitions:
            return {}
        admin = self.admin
        committed = self.spec.source_consumer.get("isolation.level") == "read_committed"
        isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        try:
            answers = clients.list_offsets(
                admin.client,
                {TopicPartition(t, p): spec_of(t, p) for t, p in partitions},
                isolation,
                request_timeout=30,
            )
        except clients.OffsetsError as exc:
            topic = exc.partition.topic
            needs = f"DESCRIBE on topic {topic}"
            error = cluster_error(admin, f"listing offsets of {topic}", exc, needs)
            if isinstance(error, ClusterUnreachable) or refused(exc):
                raise error from None
            # Leaders move while a broker restarts: retried like an unreachable cluster.
            raise ClusterUnreachable(
                error.message, f"check that {self.spec.source} is up; retrying"
            ) from None
        result = {}
        for tp, offset in answers.items():
            if offset < 0 and not (by_time and offset == -1):
                raise ClusterUnreachable(
                    f"cluster {self.spec.source} gave no offset for {tp.topic}-{tp.partition} "
                    f"(answer {offset}: the request timed out or its leader is moving)",
                    f"check that {self.spec.source} is up; retrying",
                )
            result[(tp.topic, tp.partition)] = offset
        return result

    def ends(self, partitions: list[Partition]) -> dict[Partition, int]:
        from confluent_kafka.admin import OffsetSpec

        return self.offsets(partitions, lambda t, p: OffsetSpec.latest())

    def starts(self, partitions: list[Partition], start: str | None = None) -> dict[Partition, int]:
        """Where partitions without a position start: ``start`` (earliest, latest or epoch
        milliseconds), by default ``auto.offset.reset`` or ``--starting-offsets``."""
        from confluent_kafka.admin import OffsetSpec

        group = self.spec.starting_offsets_group if start is None else ""
        start = start or self.spec.starting_offsets
        if group:
            at_group = self.group_starts(partitions, group)
            rest = [tp for tp in partitions if tp not in at_group]
            return {**(self.starts(rest, start) if rest else {}), **at_group}
        if start.isdigit():
            at = self.offsets(
                partitions, lambda t, p: OffsetSpec.for_timestamp(int(start)), by_time=True
            )
            ends = self.ends([tp for tp, o in at.items() if o < 0])
            return {tp: (o if o >= 0 else ends[tp]) for tp, o in at.items()}
        spec = OffsetSpec.latest() if start == "latest" else OffsetSpec.earliest()
        return self.offsets(partitions, lambda t, p: spec)

    def group_starts(self, partitions: list[Partition], group: str) -> dict[Partition, int]:
        """The offsets ``group`` committed on the source for ``partitions`` (MirrorMaker 1's
        group, when the flow takes over from it), those within their partition's records: a
        partition without one starts as ``auto.offset.reset`` says, as the group's own consumer
        would have."""
        from confluent_kafka.admin import OffsetSpec

        spec = self.spec
        client = GroupOffsetsClient(self.admin, spec.source_consumer_client)
        committed = {tp: o for tp, (o, _meta) in client.committed(group, partitions).items()}
        firsts = self.offsets(list(committed), lambda t, p: OffsetSpec.earliest())
        ends = self.ends(list(committed))
        starts = {tp: o for tp, o in committed.items() if firsts[tp] <= o <= ends[tp]}
        log.info(
            "%s: %d of %d partitions start at group %s's committed offsets (%s); the others as "
            "auto.offset.reset=%s says",
            spec.flow,
            len(starts),
            len(partitions),
            group,
            configdefs.STARTING_OFFSETS_GROUP,
            spec.starting_offsets,
        )
        return starts
