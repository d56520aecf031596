"""What a DR drill verifies, and how it counts (:mod:`mirrorflow.dr.drill`): the failed-over
group reading on the target until it has everything the flow copied; the **RPO** (records
acknowledged by the source and not on the target at the cut), the **RTO** (from the trigger to
the group's first read on the target) and, per group, the records **lost** and **repeated**;
each record of the run found on the target's copy once; and the real groups' committed offsets,
compared before and after a non-destructive drill."""

from __future__ import annotations

import time
from dataclasses import dataclass

from mirrorflow.dr.clusters import replicated_groups, replicated_partitions
from mirrorflow.dr.drill_request import DrillRequest
from mirrorflow.dr.drill_traffic import DRILL_PARTITIONS, GroupReader, client_config, end_offsets
from mirrorflow.dr.offsets import partition_key
from mirrorflow.replication import clients
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin


def real_group_offsets(
    spec: MirrorSpec, admin: ClusterAdmin, config: dict[str, str], request: DrillRequest
) -> dict[str, dict[str, int]]:
    """The committed offsets of the groups the flow checkpoints (not the drill's) on one of its
    clusters, on the replicated topics (the source's names, or their copies' on the target):
    group -> ``topic-partition`` -> offset. Read by consumers of the groups (the admin API's
    offset listing can crash the process: see GroupOffsetsClient)."""
    from mirrorflow.replication.group_offsets_client import GroupOffsetsClient

    source = ClusterAdmin(spec.source, spec.source_admin)
    partitions = list(replicated_partitions(spec, source))
    if admin.alias == spec.target:
        partitions = [(spec.remote_topic(t), p) for t, p in partitions]
    groups = replicated_groups(spec, admin, "(?s).*")  # every group the flow checkpoints
    client = GroupOffsetsClient(admin, config)
    offsets: dict[str, dict[str, int]] = {}
    for group in groups:
        if not group.startswith(request.group_prefix):
            found = client.committed(group, partitions)
            offsets[group] = {partition_key(tp): o for tp, (o, _m) in sorted(found.items())}
    return offsets


def read_on_target(
    cluster: str, config: dict[str, str], group: str, tag: str, topic: str, timeout_s: float
) -> GroupReader:
    """The group reading ``topic`` on the target, as an application restarted there would:
    until its first read, then until it reaches the topic's end offsets of then (both within
    ``timeout_s``). Returns its reader, closed: what it read (committed) and when first."""
    reader = GroupReader(cluster, config, group, tag, topic)
    deadline = time.monotonic() + timeout_s
    try:
        while reader.first_read is None and time.monotonic() < deadline:
            reader.poll(0.5)
        ends = end_offsets(cluster, config, topic, DRILL_PARTITIONS)
        while time.monotonic() < deadline and not _at_ends(reader, topic, ends):
            reader.poll(0.5)
    finally:
        reader.close()
    return reader


def _at_ends(reader: GroupReader, topic: str, ends: dict[int, int]) -> bool:
    from confluent_kafka import TopicPartition

    positions = reader.consumer.position([TopicPartition(topic, p) for p in ends])
    return all(tp.offset >= ends[tp.partition] for tp in positions if ends[tp.partition] > 0)


@dataclass(frozen=True)
class Counts:
    """A drill's figures, counted from the records' sequence numbers (``seq`` strings)."""

    copied: set[str]  # acknowledged and copied by the flow at the cut
    expected: set[str]  # of those, what the group had not read on the source
    lost: list[str]  # expected and not read on the target, in order
    repeated: int  # read twice on the target, or on both clusters
    rpo: int  # acknowledged, not copied at the cut


def count(
    acked: dict[str, list[int]],
    positions: dict[int, int],
    read_on_source: set[str],
    read: list[str],
) -> Counts:
    """Count a drill's RPO, lost and repeated: ``acked`` (seq -> [partition, offset]) the
    records the source acknowledged, ``positions`` (partition -> offset) the flow's at the cut,
    ``read_on_source`` what the group read before, ``read`` what it read on the target."""
    copied = {s for s, (p, o) in acked.items() if o < positions.get(p, 0)}
    expected = copied - read_on_source
    return Counts(
        copied=copied,
        expected=expected,
        lost=sorted(expected - set(read), key=int),
        repeated=len(read) - len(set(read)) + len(set(read) & read_on_source),
        rpo=len(acked) - len(copied),
    )


def rto(first_read: float | None, trigger: float) -> float | None:
    """The RTO: from the trigger to the group's first read on the target (epoch seconds both),
    None when it read nothing."""
    return None if first_read is None else round(first_read - trigger, 3)


def records_on_target(spec: MirrorSpec, remote: str, acked: dict[str, list[int]], tag: str) -> dict:
    """Each acknowledged record of this run (``acked``, value ``<tag>:<seq>``) found on the
    target's copy ``remote``: once, missing, more."""
    from confluent_kafka import TopicPartition

    consumer = clients.consumer(
        spec.target,
        client_config(
            spec.target_admin,
            **{
                "group.id": "mirrorflow-drill-probe",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            },
        ),
    )
    ends = end_offsets(spec.target, spec.target_admin, remote, DRILL_PARTITIONS)
    counts: dict[str, int] = {}
    try:
        consumer.assign([TopicPartition(remote, p, 0) for p in ends])  # 0: from the start
        deadline = time.monotonic() + 60
        done: set[int] = {p for p, e in ends.items() if e == 0}
        while len(done) < len(ends) and time.monotonic() < deadline:
            for m in consumer.consume(1000, 1.0):
                if m.error() is not None:
                    continue
                t, _, seq = (m.value() or b"").decode().rpartition(":")
                if t == tag:
                    counts[seq] = counts.get(seq, 0) + 1
            # positions, not offsets read: an exactly-once copy ends with a commit marker
            for tp in consumer.position([TopicPartition(remote, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
    finally:
        consumer.close()
    return {
        "once": sum(1 for s in acked if counts.get(s) == 1),
        "missing": sum(1 for s in acked if s not in counts),
        "duplicated": sum(1 for n in counts.values() if n > 1),
    }
