"""Heartbeats in MirrorMaker 2's wire format, emitted by a running flow.

For a flow ``S->T`` the job writes ``Heartbeat(S, T, now)`` every
``emit.heartbeats.interval.seconds`` to partition 0 of the ``heartbeats`` topic on **T** (what
MirrorMaker 2's ``S->T`` heartbeat connector does) and on **S**. The copy on S is replicated by
the flow itself (heartbeat topics are always replicated), so ``S.heartbeats`` on T keeps
receiving fresh heartbeats exactly while the flow moves data, and the age of each on arrival is
the flow's end-to-end latency. Further hops give ``T.S.heartbeats`` and so on.
"""

from __future__ import annotations

import logging
import threading
import time

from mirrorflow.mm2.formats import Heartbeat

log = logging.getLogger(__name__)


class HeartbeatEmitter(threading.Thread):
    """A daemon thread producing heartbeats until :meth:`stop`."""

    def __init__(
        self,
        source_alias: str,
        target_alias: str,
        producers: dict[str, object],
        topic: str,
        interval_s: float,
    ) -> None:
        super().__init__(name=f"heartbeats-{source_alias}->{target_alias}", daemon=True)
        self.source_alias, self.target_alias = source_alias, target_alias
        self.producers = producers  # cluster alias -> confluent_kafka.Producer
        self.topic, self.interval_s = topic, interval_s
        self._stopped = threading.Event()
        self.failures = 0

    def beat(self) -> None:
        """Emit one heartbeat to every cluster and wait for the acknowledgements."""
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
            producer.flush(max(self.interval_s, 5.0))

    def _delivered(self, alias: str, err) -> None:
        if err is not None:
            self.failures += 1
            log.warning("heartbeat to %s on %s failed: %s", self.topic, alias, err)

    def run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self.beat()
            except Exception as exc:  # a heartbeat must never take the flow down
                self.failures += 1
                log.warning(
                    "heartbeat %s->%s failed: %s", self.source_alias, self.target_alias, exc
                )

    def stop(self) -> None:
        self._stopped.set()
