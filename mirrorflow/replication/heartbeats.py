"""Heartbeats in MirrorMaker 2's wire format, emitted by a running flow.

For a flow ``S->T`` the job writes ``Heartbeat(S, T, now)`` every
``emit.heartbeats.interval.seconds`` to partition 0 of the ``heartbeats`` topic on **T**, as
MirrorMaker 2's ``S->T`` heartbeat connector does, and nowhere else: the job needs no WRITE on
its source. Heartbeat topics are always replicated, so where a flow ``T->S`` runs too, its
heartbeats come back as ``T.heartbeats`` on S, and further hops give ``S.T.heartbeats`` and so on.
"""

from __future__ import annotations

import time

from mirrorflow.errors import ClusterUnreachable
from mirrorflow.mm2.formats import Heartbeat


class HeartbeatEmitter:
    """Writes a flow's heartbeats; :meth:`beat` is run by the flow's scheduler, which counts
    and logs a heartbeat that failed."""

    def __init__(
        self,
        source_alias: str,
        target_alias: str,
        producers: dict[str, object],
        topic: str,
    ) -> None:
        self.source_alias, self.target_alias = source_alias, target_alias
        self.producers = producers  # cluster alias -> confluent_kafka.Producer
        self.topic = topic

    def beat(self, timeout_s: float = 10.0) -> None:
        """Emit one heartbeat to each producer's cluster and wait for the acknowledgements;
        :class:`~mirrorflow.errors.ClusterUnreachable` if one was not acknowledged."""
        heartbeat = Heartbeat(self.source_alias, self.target_alias, int(time.time() * 1000))
        failed: list[str] = []
        for alias, producer in self.producers.items():
            producer.produce(
                self.topic,
                heartbeat.value(),
                heartbeat.key(),
                partition=0,
                timestamp=heartbeat.timestamp,
                on_delivery=lambda err, _msg, alias=alias: err and failed.append(f"{alias}: {err}"),
            )
        unsent = sum(producer.flush(timeout_s) for producer in self.producers.values())
        if failed or unsent:
            cause = failed[0] if failed else f"not acknowledged within {timeout_s:.0f}s"
            raise ClusterUnreachable(f"heartbeat to {self.topic} failed: {cause}")
