"""The doorbell: a consumer on a flow's driver that waits for the next source record, so an
idle flow runs no Spark job and costs nothing until one arrives (:class:`Doorbell`)."""

from __future__ import annotations

import logging
import time

from mirrorflow.replication import clients
from mirrorflow.runtime import jobs

log = logging.getLogger("mirrorflow.mirror")

Partition = tuple[str, int]


class Doorbell:
    """Waits, on the driver, for the next record of any of a flow's source partitions.

    A consumer assigned to the flow's positions long-polls the source: :meth:`wait` returns as
    soon as a record arrives, and costs nothing while none does. Once it rang it fetches nothing
    until the next wait, at the flow's new positions, where it rings at once for records
    already there. Transaction markers and aborted
    records (``read_committed``) never ring. It never joins its group nor commits (confluent-
    kafka needs a ``group.id`` all the same, and librdkafka looks up its coordinator: a principal
    without DESCRIBE on that group gets an error it ignores, and records arrive all the same).
    Should the client fail otherwise, :attr:`error` says so and the flow lists its partitions'
    ends at each wait instead.
    """

    def __init__(self, consumer_config: dict[str, str], flow: str) -> None:
        """``consumer_config``: librdkafka settings of the source of ``flow`` (``S->T``)."""
        self._consumer = clients.assigned_consumer(
            jobs.split_flow(flow)[0],
            consumer_config,
            f"mirrorflow-doorbell-{flow}",
            {
                "auto.offset.reset": "latest",
                "max.partition.fetch.bytes": 65536,
                "queued.max.messages.kbytes": 1024,
                # A full local queue puts off a partition's next fetch by this much (1 s by
                # default: under a steady stream every later wait heard nothing for that
                # second, though records were waiting; issue 28's 1.0-s stalls).
                "fetch.queue.backoff.ms": 20,
            },
        )
        self._assigned: dict[Partition, int] = {}
        self.flow = flow
        self.error: str | None = None  # the last wait failed: the caller plans again itself
        self._told_group = False

    def wait(self, positions: dict[Partition, int], timeout_s: float) -> bool:
        """Whether a record at or past ``positions`` arrived within ``timeout_s``."""
        from confluent_kafka import KafkaError, TopicPartition

        if positions != self._assigned:
            self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
            self._assigned = dict(positions)
        if not positions:
            time.sleep(timeout_s)
            return False
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            message = self._consumer.poll(remaining)
            if message is None:
                return False
            error = message.error()
            if error is None:
                break
            if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                # librdkafka looks up the group it never joins; records come all the same.
                if not self._told_group:
                    self._told_group = True
                    log.info("%s: waiting for records without its group: %s", self.flow, error)
                continue
            # e.g. a broker away: the caller lists the partitions' ends itself meanwhile
            if self.error is None:
                log.warning(
                    "%s: waiting for records with a consumer failed (%s): the flow lists its "
                    "partitions' ends every %.1f s instead while idle",
                    self.flow,
                    error.str(),
                    timeout_s,
                )
            self.error = error.str()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return False
        else:
            return False
        self.error = None
        # Seen, not consumed: it stops fetching while the flow copies (what it would fetch
        # meanwhile the flow reads itself; it would be fetched twice and dropped), and is
        # assigned again at the flow's new positions at the next wait.
        self._consumer.unassign()
        self._assigned = {}
        return True

    def close(self) -> None:
        self._consumer.close()
