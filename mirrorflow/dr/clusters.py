"""The clusters as a DR run sees them: whether one answers, the partitions and consumer groups a
flow replicates from it, and where its partitions' logs start and end."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from mirrorflow.dr.steps import Partition
from mirrorflow.replication import clients
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ADMIN_TIMEOUT_S, ClusterAdmin, cluster_error


def reachable(alias: str, config: dict[str, str], timeout_s: float) -> str | None:
    """None when the cluster answers a metadata request within ``timeout_s``, else why not."""
    admin = ClusterAdmin(alias, config)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.client.list_topics(timeout=min(2.0, timeout_s))
            return None
        except Exception as exc:  # KafkaException: transport, timeout, authentication
            admin.client.poll(0.1)
            if admin.auth_error is not None:
                return f"it refused {admin.principal}: {admin.auth_error.str()}"
            if time.monotonic() > deadline:
                return f"no answer within {timeout_s:g}s ({exc})"


def replicated_partitions(spec: MirrorSpec, admin: ClusterAdmin) -> dict[Partition, None]:
    """The partitions of ``admin``'s cluster whose topics the flow replicates, in order (an
    ordered set)."""
    metadata = admin.metadata()
    chosen: dict[Partition, None] = {}
    for name, topic in sorted(metadata.topics.items()):
        if topic.error is None and spec.should_replicate(name):
            for partition in sorted(topic.partitions):
                chosen[(name, partition)] = None
    return chosen


def replicated_groups(spec: MirrorSpec, admin: ClusterAdmin, pattern: str) -> list[str]:
    """The consumer groups on ``admin``'s cluster that the flow checkpoints and ``pattern`` (a
    regex) matches in full, sorted."""
    try:
        listed = admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result()
    except Exception as exc:
        raise cluster_error(
            admin, "listing consumer groups", exc, "DESCRIBE on the groups"
        ) from None
    return sorted(
        g.group_id
        for g in listed.valid
        if spec.should_replicate_group(g.group_id) and re.fullmatch(pattern, g.group_id)
    )


def log_bounds(
    admin: ClusterAdmin, partitions: Sequence[Partition], committed: bool = False
) -> dict[Partition, tuple[int, int]]:
    """(log start, end) offsets of ``partitions`` on ``admin``'s cluster (``committed``: the end
    a ``read_committed`` reader reaches, the last stable offset)."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    bounds: dict[Partition, list[int]] = {tp: [0, 0] for tp in partitions}
    for which, offset_spec in ((0, OffsetSpec.earliest()), (1, OffsetSpec.latest())):
        if not partitions:
            break
        try:
            answers = clients.list_offsets(
                admin.client,
                {TopicPartition(t, p): offset_spec for t, p in partitions},
                isolation,
                request_timeout=ADMIN_TIMEOUT_S,
            )
            for tp, offset in answers.items():
                bounds[(tp.topic, tp.partition)][which] = offset
        except Exception as exc:
            raise cluster_error(
                admin, "listing end offsets", exc, "DESCRIBE on the topics"
            ) from None
    return {tp: (b[0], b[1]) for tp, b in bounds.items()}


def end_offsets(admin: ClusterAdmin, partitions: Sequence[Partition]) -> dict[Partition, int]:
    """The end offsets of ``partitions`` on ``admin``'s cluster (see :func:`log_bounds`)."""
    return {tp: end for tp, (_s, end) in log_bounds(admin, partitions).items()}
