"""Consumer-group offsets read and committed on one cluster: what MirrorMaker 2's
``MirrorCheckpointTask`` does with its admin clients (``listConsumerGroupOffsets`` on the source,
``alterConsumerGroupOffsets`` on the target for ``sync.group.offsets``), done here through a
consumer of the group (:class:`GroupOffsetsClient` says why).

The checkpoint task (:mod:`~mirrorflow.replication.checkpoint_task`) reads the source's groups
with it; the group offset sync (:mod:`~mirrorflow.replication.group_offset_sync`) and the
failover, failback and drill tools read and commit the target's.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from mirrorflow.replication import clients
from mirrorflow.replication.offset_map import Partition
from mirrorflow.replication.topics import (
    ClusterAdmin,
    client_principal,
    cluster_error,
    unauthorized,
)

COORDINATOR_MOVING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
)
COORDINATOR_WAIT_S = 30.0  # how long a group's coordinator may take to be found or loaded
COMMITTED_WAIT_S = 2.0  # one offset fetch; a refused coordinator look-up is checked between them


class GroupOffsetsClient:
    """Reads and commits one cluster's consumer-group offsets through a consumer of the group.

    Not through the admin API: librdkafka's admin ``ListConsumerGroupOffsets`` crashes the whole
    process when a broker answers NOT_COORDINATOR, as a new or restarted cluster does
    (confluentinc/librdkafka#5040, open); a consumer's own offset fetch handles that answer.
    A consumer that never subscribes does not join the group: its commit is the admin commit
    (no member, no generation) that the broker accepts only while the group has no members.
    """

    def __init__(self, admin: ClusterAdmin, config: dict[str, str]) -> None:
        self.admin, self.config = admin, config
        self.principal = client_principal(config)

    def _consumer(self, group: str):
        config = {**self.config, "group.id": group, "enable.auto.commit": False}
        return clients.consumer(self.admin.alias, config)

    def committed(
        self, group: str, partitions: list[Partition]
    ) -> dict[Partition, tuple[int, str]]:
        """``group``'s committed offset and metadata of each of ``partitions`` that has one."""
        if not partitions:
            return {}
        consumer = self._consumer(group)
        wanted = [TopicPartition(t, p) for t, p in partitions]
        action, needs = f"reading the offsets of group {group}", f"DESCRIBE on group {group}"
        deadline = time.monotonic() + COORDINATOR_WAIT_S
        try:
            while True:
                try:
                    listed = consumer.committed(wanted, timeout=COMMITTED_WAIT_S)
                    break
                except KafkaException as caught:
                    # A refused look-up of the group's coordinator never answers the offset
                    # fetch: it comes as the consumer's error event instead.
                    refused = _refusal_event(consumer)
                    exc = KafkaException(refused) if refused is not None else caught
                    code = exc.args[0].code()
                    waiting = code in COORDINATOR_MOVING or code == KafkaError._TIMED_OUT
                    if refused is not None or not waiting or time.monotonic() > deadline:
                        raise cluster_error(
                            self.admin, action, exc, needs, self.principal
                        ) from None
                    time.sleep(0.5)  # the group's coordinator is being found or loaded
        finally:
            consumer.close()
        return {
            (tp.topic, tp.partition): (tp.offset, tp.metadata or "")
            for tp in listed
            if tp.offset >= 0 and tp.error is None
        }

    def commit(self, group: str, offsets: list[TopicPartition]) -> None:
        """Commit ``offsets`` for ``group`` (refused while the group has members). A missing
        ACL fails with the one line naming it; other errors raise the client's exception."""
        consumer = self._consumer(group)
        error: KafkaException | None
        try:
            result = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc
        else:
            failed = [tp for tp in result or [] if tp.error is not None]
            error = KafkaException(failed[0].error) if failed else None
        finally:
            consumer.close()
        if error is None:
            return
        code = error.args[0].code()
        if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            needs = "READ on topic(s) " + ", ".join(sorted({tp.topic for tp in offsets}))
        else:
            needs = f"READ on group {group}"
        action = f"committing offsets of group {group}"
        if unauthorized(error.args[0]):
            raise cluster_error(self.admin, action, error, needs, self.principal) from None
        raise error


def _refusal_event(consumer) -> KafkaError | None:
    """An authorisation error among the consumer's error events (e.g. its group's coordinator
    look-up refused without DESCRIBE on the group), if any."""
    while (message := consumer.poll(0)) is not None:
        if unauthorized(message.error()):
            return message.error()
    return None
