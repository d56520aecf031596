"""The mirror job's metrics, exposed for Prometheus by ``prometheus_client``.

One registry per application (every flow it runs), served over HTTP on 127.0.0.1 only, at the
port given by ``--metrics-port`` or ``MIRRORFLOW_METRICS_PORT`` (0 or unset: no endpoint).
Figures are computed on the driver from what it knows after each batch; names follow
MirrorMaker 2's meanings (``record-count`` is ``mirrorflow_record_count_total``) with labels
``source``, ``target``, ``topic`` (the remote topic) and ``partition``:

- ``mirrorflow_record_count_total``: records copied per remote topic-partition (MM2's
  ``record-count``).
- ``mirrorflow_byte_count_total``: bytes copied per flow (the at-least-once copier reports bytes
  per batch, not per partition).
- ``mirrorflow_lag_records``: per partition, the source's end offset at the last plan minus the
  flow's position (what MirrorMaker 2 does not report).
- ``mirrorflow_batches_total`` and ``mirrorflow_last_batch_timestamp_seconds`` per flow.
- ``mirrorflow_heartbeat_timestamp_seconds`` per flow: when the target last acknowledged the
  flow's heartbeat (its age is ``time() - mirrorflow_heartbeat_timestamp_seconds``).
- ``mirrorflow_flow_state``: the flow's state (STARTING, RUNNING, IDLE, PAUSED, STOPPED, FAILED),
  1 for the current one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, start_http_server

from mirrorflow.errors import MirrorflowError

Partition = tuple[str, int]

PORT_ENV = "MIRRORFLOW_METRICS_PORT"
HOST = "127.0.0.1"  # never all interfaces: the endpoint has no authentication
STATES = ["STARTING", "RUNNING", "IDLE", "PAUSED", "STOPPED", "FAILED"]
FLOW = ["source", "target"]
PARTITION = [*FLOW, "topic", "partition"]


def port_from(option: int | None) -> int:
    """The metrics port: the option when given, else ``MIRRORFLOW_METRICS_PORT``, else 0 (off)."""
    if option is not None:
        return option
    value = os.environ.get(PORT_ENV, "").strip()
    if not value:
        return 0
    if not value.isdigit():
        raise MirrorflowError(f"{PORT_ENV}={value!r} is not a port number")
    return int(value)


class Metrics:
    """The application's registry and its metrics; :meth:`flow` gives one flow's view."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.records = Counter(
            "mirrorflow_record_count",
            "Records copied to the remote topic-partition (MirrorMaker 2's record-count)",
            PARTITION,
            registry=r,
        )
        self.bytes = Counter(
            "mirrorflow_byte_count", "Bytes of records copied by the flow", FLOW, registry=r
        )
        self.lag = Gauge(
            "mirrorflow_lag_records",
            "Records of the source partition not yet copied: its end offset at the last plan "
            "minus the flow's position",
            PARTITION,
            registry=r,
        )
        self.batches = Counter(
            "mirrorflow_batches", "Batches the flow has copied", FLOW, registry=r
        )
        self.last_batch = Gauge(
            "mirrorflow_last_batch_timestamp_seconds",
            "When the flow's last batch ended (Unix time)",
            FLOW,
            registry=r,
        )
        self.heartbeat = Gauge(
            "mirrorflow_heartbeat_timestamp_seconds",
            "When the target last acknowledged the flow's heartbeat (Unix time; its age: "
            "time() minus this)",
            FLOW,
            registry=r,
        )
        self.state = Enum(
            "mirrorflow_flow_state", "The flow's state", FLOW, states=STATES, registry=r
        )
        self._server = None

    def flow(self, source: str, target: str) -> FlowMetrics:
        return FlowMetrics(self, source, target)

    def serve(self, port: int) -> int:
        """Serve the registry at ``http://127.0.0.1:<port>/metrics``; returns the port."""
        try:
            self._server, _thread = start_http_server(port, addr=HOST, registry=self.registry)
        except OSError as exc:
            raise MirrorflowError(
                f"the metrics endpoint cannot listen on {HOST}:{port}: {exc.strerror or exc}",
                f"choose another port with --metrics-port or {PORT_ENV}",
            ) from None
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class FlowMetrics:
    """One flow's metrics: what its job reports after each batch and state change."""

    def __init__(self, metrics: Metrics, source: str, target: str) -> None:
        self.metrics, self.labels = metrics, (source, target)

    def _partition(self, remote: str, partition: int) -> tuple[str, ...]:
        return (*self.labels, remote, str(partition))

    def batch(
        self,
        records: Mapping[Partition, int],
        size: int,
        positions: Mapping[Partition, int],
        ends: Mapping[Partition, int],
        remote_topics: Mapping[str, str],
    ) -> None:
        """A batch's figures: ``records`` copied per source partition, ``size`` bytes, the
        flow's positions after it and the source's ends at its plan."""
        m = self.metrics
        for (topic, partition), count in records.items():
            if count and topic in remote_topics:
                m.records.labels(*self._partition(remote_topics[topic], partition)).inc(count)
        m.bytes.labels(*self.labels).inc(size)
        m.batches.labels(*self.labels).inc()
        m.last_batch.labels(*self.labels).set(time.time())
        self.lag(positions, ends, remote_topics)

    def lag(
        self,
        positions: Mapping[Partition, int],
        ends: Mapping[Partition, int],
        remote_topics: Mapping[str, str],
    ) -> None:
        """Each partition's lag: its end at the last plan minus its position (never below 0)."""
        for (topic, partition), position in positions.items():
            if topic in remote_topics and (topic, partition) in ends:
                lag = max(0, ends[(topic, partition)] - position)
                self.metrics.lag.labels(*self._partition(remote_topics[topic], partition)).set(lag)

    def heartbeat(self) -> None:
        """A heartbeat was acknowledged by the target now."""
        self.metrics.heartbeat.labels(*self.labels).set(time.time())

    def state(self, state: str) -> None:
        if state in STATES:
            self.metrics.state.labels(*self.labels).state(state)
