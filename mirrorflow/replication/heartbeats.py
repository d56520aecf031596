"""Heartbeats in MirrorMaker 2's wire format, emitted by a running flow.

For a flow ``S->T`` the job writes ``Heartbeat(S, T, now)`` every
``emit.heartbeats.interval.seconds`` to partition 0 of the ``heartbeats`` topic on **T**, as
MirrorMaker 2's ``S->T`` heartbeat connector does, and nowhere else: the job needs no WRITE on
its source. Heartbeat topics are always replicated, so where a flow ``T->S`` runs too, its
heartbeats come back as ``T.heartbeats`` on S, and further hops give ``S.T.heartbeats`` and so on.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from mirrorflow.errors import ClusterUnreachable
from mirrorflow.mm2.formats import Heartbeat
from mirrorflow.replication.scheduler import TaskFailed
from mirrorflow.replication.topics import refusal, unauthorized


class HeartbeatEmitter:
    """Writes a flow's heartbeats; :meth:`beat` is run by the flow's scheduler, which counts
    and logs a heartbeat that failed."""

    def __init__(
        self,
        source_alias: str,
        target_alias: str,
        producers: dict[str, Producer],
        topic: str,
        principals: dict[str, str] | None = None,
    ) -> None:
        """``principals``: who each producer logs in as (cluster alias -> principal), named
        when a cluster refuses a heartbeat."""
        self.source_alias, self.target_alias = source_alias, target_alias
        self.producers = producers  # cluster alias -> confluent_kafka.Producer
        self.topic = topic
        self.principals = principals or {}

    def beat(self, timeout_s: float = 10.0) -> None:
        """Emit one heartbeat to each producer's cluster and wait for the acknowledgements;
        :class:`~mirrorflow.errors.ClusterUnreachable` if one was not acknowledged,
        :class:`~mirrorflow.replication.scheduler.TaskFailed` naming the missing ACL if a
        cluster refused it."""
        heartbeat = Heartbeat(self.source_alias, self.target_alias, int(time.time() * 1000))
        failed: list[tuple[str, KafkaError]] = []
        for alias, producer in self.producers.items():

            def delivered(err: KafkaError | None, _msg: Message, alias: str = alias) -> None:
                if err:
                    failed.append((alias, err))

            try:
                producer.produce(
                    self.topic,
                    heartbeat.value(),
                    heartbeat.key(),
                    partition=0,
                    timestamp=heartbeat.timestamp,
                    on_delivery=delivered,
                )
            except KafkaException as exc:  # refused at once: the topic failed before
                failed.append((alias, exc.args[0]))
        unsent = [alias for alias, producer in self.producers.items() if producer.flush(timeout_s)]
        for alias, err in failed:
            if unauthorized(err):
                principal = self.principals.get(alias, "(unknown principal)")
                action = f"writing heartbeats to {self.topic}"
                error = refusal(alias, principal, action, err.str(), f"WRITE on topic {self.topic}")
                raise TaskFailed(str(error))
        if failed or unsent:
            alias = failed[0][0] if failed else unsent[0]
            cause = str(failed[0][1]) if failed else f"not acknowledged within {timeout_s:.0f}s"
            raise ClusterUnreachable(
                f"cluster {alias} did not take a heartbeat to {self.topic}: {cause}",
                f"check {alias}.bootstrap.servers and that the cluster is up",
            )
