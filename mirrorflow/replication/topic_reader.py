"""Reading one of mirrorflow's internal topics from its beginning to its end, incrementally.

Positions, the offset map and checkpoints are each kept in a topic; a reader loads what is
there and, called again, only what was added since. A reader's consumer never joins nor commits
its group, so the principal needs READ on the topic only, no ACL on the group. Between two reads
its consumer has no partition assigned: an idle reader sends the broker nothing (a job keeps
several for its life, and a consumer left assigned long-polls its broker twice a second). A read
assigns the partitions it needs at the positions the last read reached. (Not paused and resumed:
librdkafka fetches a resumed partition only at its broker thread's next wake-up, 0.5-1 s later,
which every read, and every exactly-once task's lease confirmation, paid.)

A reader read only at a flow's start (its positions, its offset map) is released after the
read (:meth:`TopicReader.release`): its two clients end, and its next read starts others and
reads on from where the last one stopped. An idle client still wakes its threads a few times a
second: a flow kept 14, and an idle mesh of 3 in one application spent a fifth of its CPU in
librdkafka's threads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.topics import client_principal, refusal, unauthorized


@dataclass
class _Clients:
    """A reader's consumer and admin client; ``connected``: the admin's first look-up done."""

    consumer: Consumer
    admin: AdminClient
    connected: bool = False


class TopicReader:
    """Reads every partition of ``topic`` up to its end; :meth:`apply` gets each record.

    "The end" is each partition's last stable offset (what a ``read_committed`` reader can
    reach), asked of the cluster on every call: a transaction that a fault left open does not
    hold the reader back, and its records, aborted once its producer is fenced, never count.
    """

    def __init__(
        self,
        consumer_config: dict[str, str],
        admin_config: dict[str, str],
        topic: str,
        group: str,
        missing_ok: bool = False,
        cluster: str = "",
    ) -> None:
        """``cluster``: the alias of the cluster that holds ``topic``, for messages."""
        self.topic, self.missing_ok = topic, missing_ok
        self.cluster = cluster or "(the cluster of " + topic + ")"
        self.principal = client_principal(consumer_config)
        self._consumer_config: dict[str, object] = {
            **consumer_config,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
        self._admin_config = admin_config
        self._clients: _Clients | None = None
        self._open()
        self._partitions: list[TopicPartition] = []
        # partition -> the offset the next read starts at (its beginning until read once)
        self._next: dict[int, int] = {}

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Take one record of the topic (subclasses keep what they need)."""
        raise NotImplementedError

    def apply_message(self, msg) -> None:
        """Take one message (the default hands its key and value to :meth:`apply`)."""
        self.apply(msg.key(), msg.value())

    def _stable_ends(self, admin: AdminClient, timeout_s: float) -> dict[int, int]:
        """The partitions' last stable offsets; asked again while the answer is a retriable
        error or a leader moving (a topic just created, a broker restarting), up to
        ``timeout_s`` (:func:`~mirrorflow.replication.clients.list_offsets`)."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import OffsetSpec

        answers = clients.list_offsets(
            admin,
            {tp: OffsetSpec.latest() for tp in self._partitions},
            IsolationLevel.READ_COMMITTED,
            request_timeout=timeout_s,
            settle_s=timeout_s,
            retriable=True,
        )
        return {tp.partition: offset for tp, offset in answers.items()}

    def _connect_admin(self, client: _Clients, timeout_s: float) -> None:
        """The admin client connected before its first look-up (:func:`clients.connect`)."""
        if client.connected:
            return
        try:
            clients.connect(client.admin, self.topic, min(timeout_s, 10.0))
        except KafkaException as exc:
            raise ClusterUnreachable(
                f"reading {self.topic}: {exc.args[0].str()}",
                "check the target cluster; the batch is retried",
            ) from None
        client.connected = True

    def _open(self) -> _Clients:
        """The reader's clients: started again after :meth:`release`."""
        if self._clients is None:
            self._clients = _Clients(
                clients.consumer(self.cluster, self._consumer_config),
                clients.admin(self.cluster, self._admin_config),
            )
        return self._clients

    def release(self) -> None:
        """End the reader's clients until its next read, which starts others and goes on from
        where this one stopped (for a reader read only now and then)."""
        if self._clients is not None:
            # An admin client has no close: librdkafka ends it with its last reference.
            self._clients.consumer.close()
            self._clients = None

    def read_to_end(self, timeout_s: float = 60.0) -> object:
        """Apply every record up to the end of the topic not applied yet. Returns nothing here
        (None); a reader may return what it read (hence ``object``)."""
        client = self._open()
        consumer = client.consumer
        if not self._partitions:
            metadata = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            if metadata.error is not None:
                if self.missing_ok and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    return None  # not created yet: nothing to read
                self._raise_if_refused(metadata.error)
                raise MirrorflowError(f"cannot read {self.topic}: {metadata.error.str()}")
            self._partitions = [TopicPartition(self.topic, p) for p in metadata.partitions]
            self._next = {p: OFFSET_BEGINNING for p in metadata.partitions}
        self._connect_admin(client, timeout_s)
        deadline = time.monotonic() + timeout_s
        try:
            ends = self._stable_ends(client.admin, timeout_s)
        except KafkaException as exc:
            self._raise_if_refused(exc.args[0])
            raise ClusterUnreachable(
                f"reading {self.topic}: {exc.args[0].str()}",
                "check the target cluster; the batch is retried",
            ) from None
        remaining = {
            p
            for p, end in ends.items()
            if end > 0 and (self._next[p] == OFFSET_BEGINNING or self._next[p] < end)
        }
        if not remaining:
            clients.answered(self.cluster)
            return None
        fetched = [TopicPartition(self.topic, p, self._next[p]) for p in sorted(remaining)]
        consumer.assign(fetched)
        try:
            while remaining:
                if time.monotonic() > deadline:
                    raise ClusterUnreachable(
                        f"reading {self.topic} did not reach its end within {timeout_s:.0f}s",
                        "check the target cluster; the batch is retried",
                    )
                # A short wait: a partition's position passes a transaction's closing marker,
                # which no message shows, as soon as its fetch is in.
                for msg in consumer.consume(_BATCH, 0.02):
                    error = msg.error()
                    if error is None:
                        self.apply_message(msg)
                    elif error.code() not in _IGNORED:
                        self._raise_if_refused(error)
                        raise MirrorflowError(f"reading {self.topic} failed: {error.str()}")
                self._reached(consumer, remaining, ends)
        finally:
            for tp in consumer.position(fetched):
                if tp.offset >= 0:
                    self._next[tp.partition] = tp.offset
            consumer.unassign()
        clients.answered(self.cluster)
        return None

    def _reached(self, consumer: Consumer, remaining: set[int], ends: dict[int, int]) -> None:
        """Drop from ``remaining`` the partitions read up to their end. The position moves past
        transaction markers too, which no message shows; a partition not fetched yet has none."""
        for tp in consumer.position([TopicPartition(self.topic, p) for p in remaining]):
            if tp.offset >= ends[tp.partition]:
                remaining.discard(tp.partition)

    def _raise_if_refused(self, error: KafkaError) -> None:
        if unauthorized(error):
            raise refusal(
                self.cluster,
                self.principal,
                f"reading {self.topic}",
                error.str(),
                f"READ on topic {self.topic}",
            )

    def close(self) -> None:
        self.release()


# The end of a partition, and librdkafka's look-up of the coordinator of a group the reader never
# joins nor commits (refused without DESCRIBE on the group, which it does not need).
_IGNORED = (KafkaError._PARTITION_EOF, KafkaError.GROUP_AUTHORIZATION_FAILED)
_BATCH = 1000  # records taken from the consumer at once
