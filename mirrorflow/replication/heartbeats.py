"""Heartbeats in MirrorMaker 2's wire format, emitted by a running flow.

For a flow ``S->T`` the job writes ``Heartbeat(S, T, now)`` every
``emit.heartbeats.interval.seconds`` to partition 0 of the ``heartbeats`` topic on **T**, as
MirrorMaker 2's ``S->T`` heartbeat connector does, and nowhere else: the job needs no WRITE on
its source. Heartbeat topics are always replicated, so where a flow ``T->S`` runs too, its
heartbeats come back as ``T.heartbeats`` on S, and further hops give ``S.T.heartbeats`` and so on.
"""

from __future__ import annotations

import logging
import time

from mirrorflow.mm2.formats import Heartbeat

log = logging.getLogger(__name__)


class HeartbeatEmitter:
    """Writes a flow's heartbeats; :meth:`beat` is run by the flow's scheduler."""

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
        self.failures = 0

    def beat(self, timeout_s: float = 10.0) -> None:
        """Emit one heartbeat to each producer's cluster and wait for the acknowledgements."""
        heartbeat = Heartbeat(self.source_alias, self.target_alias, int(time.time() * 1000))
        for alias, producer in self.producers.items():
            producer.produce(
                self.topic,
                heartbeat.value(),
                heartbeat.key(),
                partition=0,
                timestamp=heartbeat.timestamp,
                on_delivery=lambda err, _msg, alias=alias: self._delivered(alias, err),
            )
        for producer in self.producers.values():
            producer.flush(timeout_s)

    def _delivered(self, alias: str, err) -> None:
        if err is not None:
            self.failures += 1
            log.warning("heartbeat to %s on %s failed: %s", self.topic, alias, err)
