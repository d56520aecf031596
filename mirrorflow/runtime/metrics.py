"""The mirror job's metrics, exposed for Prometheus by ``prometheus_client``.

One registry per application (every flow it runs), served over HTTP on 127.0.0.1 only, at the
port given by ``--metrics-port`` or ``MIRRORFLOW_METRICS_PORT`` (0 or unset: no endpoint).
Figures are computed on the driver from what it knows after each batch; names follow
MirrorMaker 2's meanings (``record-count`` is ``mirrorflow_record_count_total``) with labels
``source``, ``target``, ``topic`` (the remote topic) and ``partition``:

- ``mirrorflow_record_count_total``: records copied per remote topic-partition (MM2's
  ``record-count``).
- ``mirrorflow_byte_count_total``: bytes (keys, values, headers) copied per remote
  topic-partition (MM2's ``byte-count``).
- ``mirrorflow_record_age_ms`` and ``mirrorflow_replication_latency_ms`` with
  ``stat="min|max|avg"`` per remote topic-partition (MM2's ``record-age-ms`` and
  ``replication-latency-ms``): now minus the record's timestamp when the copier read it, and when
  the target acknowledged (at-least-once) or committed (exactly-once) its copy, over the copies of
  the last :data:`WINDOW_S` seconds (MM2's default window; in buckets of :data:`BUCKET_S`, those
  begun in it), else of the partition's last batch.
  The copiers (JVM and Python) return min, max, sum and count per partition with each batch.
- ``mirrorflow_checkpoint_latency_ms`` with ``stat`` per group and remote topic-partition (MM2's
  ``checkpoint-latency-ms``): from a checkpoint's creation (the group's offsets read and
  translated) to its acknowledgement by the target, over the same window.
- ``mirrorflow_checkpoint_timestamp_seconds`` per flow: when its checkpoint task last checked
  every group and wrote the checkpoints that moved (the page's "last checkpoint").
- ``mirrorflow_lag_records``: per partition, the source's end offset minus the flow's position,
  at the last plan or the last measurement (every 10 s, busy, idle or paused:
  :mod:`mirrorflow.replication.lag`), whichever is newer (what MirrorMaker 2 does not report).
- ``mirrorflow_lag_seconds``: per partition, 0 when it had nothing to copy at the last plan or
  measurement, else the age of its oldest record not copied (now minus that record's source
  timestamp, read by the last measurement; computed at scrape), else, until a measurement has
  read it, the time since the partition was last seen caught up (an upper bound); absent while
  neither is known.
- ``mirrorflow_batches_total`` and ``mirrorflow_last_batch_timestamp_seconds`` per flow.
- ``mirrorflow_heartbeat_timestamp_seconds`` per flow: when the target last acknowledged the
  flow's heartbeat (its age is ``time() - mirrorflow_heartbeat_timestamp_seconds``).
- ``mirrorflow_flow_state``: the flow's state (STARTING, RUNNING, IDLE, PAUSED, STOPPED, FAILED),
  1 for the current one.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mirrorflow.errors import MirrorflowError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from mirrorflow.replication.lag import Lag

Partition = tuple[str, int]

PORT_ENV = "MIRRORFLOW_METRICS_PORT"
HOST = "127.0.0.1"  # never all interfaces: the endpoint has no authentication
STATES = ["STARTING", "RUNNING", "IDLE", "PAUSED", "STOPPED", "FAILED"]
FLOW = ["source", "target"]
PARTITION = [*FLOW, "topic", "partition"]
WINDOW_S = 60.0  # MirrorMaker 2's: metrics.sample.window.ms (30 s) times metrics.num.samples (2)
# A window keeps its copies' figures in buckets of this many seconds (MirrorMaker 2's are 30 s
# long). A stream reports every partition each second: a sample a second for each of the some
# 3,900 windows of an idle mesh of 6 kept 238,000 samples, 505,000 objects that each of Python's
# full garbage collections went through (121 ms; 36 ms with these buckets).
BUCKET_S = 5.0
NO_TIMESTAMP_MIN = (1 << 63) - 1  # the JVM copier's min of no values (Long.MAX_VALUE)


@dataclass(slots=True)
class Stats:
    """Milliseconds of some records: min, max, sum and count (what the copiers return)."""

    low: int = 0
    high: int = 0
    total: int = 0
    count: int = 0

    @classmethod
    def of(cls, low: int, high: int, total: int, count: int) -> Stats:
        return cls(low, high, total, count) if count > 0 else cls()

    def merge(self, other: Stats) -> Stats:
        if not other.count:
            return self
        if not self.count:
            return other
        merged = Stats(self.low, self.high, self.total, self.count)
        merged.absorb(other)
        return merged

    def absorb(self, other: Stats) -> None:
        """Merge ``other`` into these stats, in place (only into stats no one else holds)."""
        if not other.count:
            return
        if not self.count:
            self.low, self.high = other.low, other.high
        else:
            if other.low < self.low:
                self.low = other.low
            if other.high > self.high:
                self.high = other.high
        self.total += other.total
        self.count += other.count

    def copy(self) -> Stats:
        return Stats(self.low, self.high, self.total, self.count)

    def values(self) -> dict[str, float]:
        """``min``, ``max``, ``avg`` (empty without values)."""
        if not self.count:
            return {}
        return {"min": self.low, "max": self.high, "avg": self.total / self.count}


@dataclass(slots=True)
class Copied:
    """What a batch copied from one source partition."""

    records: int = 0
    bytes: int = 0
    age: Stats = field(default_factory=Stats)  # record-age-ms: at read
    latency: Stats = field(default_factory=Stats)  # replication-latency-ms: at acknowledgement

    def merge(self, other: Copied) -> Copied:
        return Copied(
            self.records + other.records,
            self.bytes + other.bytes,
            self.age.merge(other.age),
            self.latency.merge(other.latency),
        )


class _Window:
    """Stats recorded over the last :data:`WINDOW_S` seconds, in buckets of :data:`BUCKET_S`
    (those begun in the window); the last bucket when older."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: deque[tuple[float, Stats]] = deque()  # (bucket's start, its stats)

    def add(self, stats: Stats, at: float) -> None:
        if not stats.count:
            return
        samples = self.samples
        start = at - at % BUCKET_S
        if samples and samples[-1][0] == start:
            samples[-1][1].absorb(stats)
            return
        samples.append((start, stats.copy()))  # the bucket's own: the next ones go into it
        while len(samples) > 1 and samples[0][0] < at - WINDOW_S:
            samples.popleft()

    def stats(self, now: float) -> Stats:
        recent = [s for at, s in self.samples if at >= now - WINDOW_S] or [
            s for _at, s in list(self.samples)[-1:]
        ]
        merged = Stats()
        for stats in recent:
            merged = merged.merge(stats)
        return merged


class _Live(Collector):
    """The figures computed at scrape: windowed latencies and lag in seconds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # (name, labels) -> window; labels end before ``stat``
        self.windows: dict[tuple[str, tuple[str, ...]], _Window] = {}
        # partition -> (when it was last seen caught up, whether it had nothing to copy at the
        # last plan)
        self.caught_up: dict[tuple[str, ...], tuple[float, bool]] = {}
        # partition -> when its oldest record not copied was written (the last measurement)
        self.oldest: dict[tuple[str, ...], float] = {}

    def record(self, name: str, labels: tuple[str, ...], stats: Stats, at: float) -> None:
        self.record_all([(name, labels, stats)], at)

    def record_all(self, figures: list[tuple[str, tuple[str, ...], Stats]], at: float) -> None:
        """Several figures (name, labels, stats) at ``at``, under one acquisition of the lock."""
        with self.lock:
            self.add_all(figures, at)

    def add_all(self, figures: list[tuple[str, tuple[str, ...], Stats]], at: float) -> None:
        """:meth:`record_all` for a caller that holds the lock."""
        windows = self.windows
        for name, labels, stats in figures:
            window = windows.get((name, labels))
            if window is None:
                window = windows[(name, labels)] = _Window()
            window.add(stats, at)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.time()
        families = {
            name: GaugeMetricFamily(name, help_, labels=[*labels, "stat"])
            for name, (help_, labels) in LIVE.items()
        }
        lag = GaugeMetricFamily(
            "mirrorflow_lag_seconds",
            "0 when the partition had nothing to copy at the last plan or measurement, else the "
            "age of its oldest record not copied (its source timestamp, as last measured), else "
            "the time since it was last seen caught up (an upper bound)",
            labels=PARTITION,
        )
        with self.lock:
            windows = [(key, w.stats(now)) for key, w in self.windows.items()]
            caught_up, oldest = dict(self.caught_up), dict(self.oldest)
        for (name, labels), stats in sorted(windows):
            for stat, value in stats.values().items():
                families[name].add_metric([*labels, stat], value)
        for labels in sorted(set(caught_up) | set(oldest)):
            at, current = caught_up.get(labels, (None, False))
            if current:
                lag.add_metric(list(labels), 0.0)
            elif labels in oldest:
                lag.add_metric(list(labels), max(0.0, now - oldest[labels]))
            elif at is not None:
                lag.add_metric(list(labels), max(0.0, now - at))
        yield from families.values()
        yield lag

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


LIVE = {
    "mirrorflow_record_age_ms": (
        "Now minus the record's timestamp when the copier read it (MirrorMaker 2's "
        "record-age-ms), over the last minute's copies",
        PARTITION,
    ),
    "mirrorflow_replication_latency_ms": (
        "Now minus the record's timestamp when the target acknowledged its copy (MirrorMaker "
        "2's replication-latency-ms), over the last minute's copies",
        PARTITION,
    ),
    "mirrorflow_checkpoint_latency_ms": (
        "From a checkpoint's creation to its acknowledgement by the target (MirrorMaker 2's "
        "checkpoint-latency-ms), over the last minute's checkpoints",
        [*FLOW, "group", "topic", "partition"],
    ),
}


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
            "mirrorflow_byte_count",
            "Bytes (keys, values, headers) copied to the remote topic-partition (MirrorMaker 2's "
            "byte-count)",
            PARTITION,
            registry=r,
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
        self.checkpointed = Gauge(
            "mirrorflow_checkpoint_timestamp_seconds",
            "When the flow's checkpoint task last checked every group and wrote the checkpoints "
            "that moved (Unix time; its age: time() minus this)",
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
        self.live = _Live()
        r.register(self.live)
        self._server: WSGIServer | None = None

    def flow(self, source: str, target: str) -> FlowMetrics:
        return FlowMetrics(self, source, target)

    def serve(self, port: int) -> int:
        """Serve the registry at ``http://127.0.0.1:<port>/metrics``; returns the port."""
        try:
            server, _thread = start_http_server(port, addr=HOST, registry=self.registry)
        except OSError as exc:
            raise MirrorflowError(
                f"the metrics endpoint cannot listen on {HOST}:{port}: {exc.strerror or exc}",
                f"choose another port with --metrics-port or {PORT_ENV}",
            ) from None
        self._server = server
        return server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class FlowMetrics:
    """One flow's metrics: what its job reports after each batch and state change."""

    def __init__(self, metrics: Metrics, source: str, target: str) -> None:
        self.metrics, self.labels = metrics, (source, target)
        # Each partition's labels and each metric's child for them, made once: a stream reports
        # every second for each of its partitions (some 65 in a mesh of 6, every heartbeat
        # chain), and prometheus_client's labels() checks and looks them up at every call.
        self._labels: dict[tuple[str, int], tuple[str, ...]] = {}
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}
        self._lags: dict[tuple[str, ...], int] = {}  # each partition's lag gauge, as last set
        # The replication latencies acknowledged since the trend last took them, per remote
        # topic (take_latency).
        self._latency: dict[str, Stats] = {}

    def _partition(self, remote: str, partition: int) -> tuple[str, ...]:
        labels = self._labels.get((remote, partition))
        if labels is None:
            labels = self._labels[(remote, partition)] = (*self.labels, remote, str(partition))
        return labels

    def _child(self, metric: Any, labels: tuple[str, ...]) -> Any:
        """``metric.labels(*labels)``, looked up once."""
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[(metric, labels)] = metric.labels(*labels)
        return child

    def _set_lag(self, labels: tuple[str, ...], lag: int) -> None:
        """The partition's lag gauge, set only when it changes (a lock each time)."""
        if self._lags.get(labels) != lag:
            self._child(self.metrics.lag, labels).set(lag)
            self._lags[labels] = lag

    def batch(
        self,
        copied: Mapping[Partition, Copied],
        positions: Mapping[Partition, int],
        ends: Mapping[Partition, int],
        remote_topics: Mapping[str, str],
        planned_at: float,
    ) -> None:
        """A batch's figures: what it ``copied`` per source partition, the flow's positions
        after it and the source's ends at its plan (made at ``planned_at``)."""
        m, now = self.metrics, time.time()
        windows: list[tuple[str, tuple[str, ...], Stats]] = []
        latencies: list[tuple[str, Stats]] = []
        for (topic, partition), figures in copied.items():
            remote = remote_topics.get(topic)
            if remote is None:
                continue
            labels = self._partition(remote, partition)
            if figures.records:
                self._child(m.records, labels).inc(figures.records)
            self._child(m.bytes, labels).inc(figures.bytes)
            windows.append(("mirrorflow_record_age_ms", labels, figures.age))
            windows.append(("mirrorflow_replication_latency_ms", labels, figures.latency))
            if figures.latency.count:
                latencies.append((remote, figures.latency))
        with m.live.lock:  # once per harvest: the windows and the trend's latencies
            m.live.add_all(windows, now)
            since = self._latency
            for remote, latency in latencies:
                known = since.get(remote)
                if known is None:
                    since[remote] = latency.copy()
                else:
                    known.absorb(latency)
        m.batches.labels(*self.labels).inc()
        m.last_batch.labels(*self.labels).set(now)
        self.lag(positions, ends, remote_topics, planned_at)

    def lag(
        self,
        positions: Mapping[Partition, int],
        ends: Mapping[Partition, int],
        remote_topics: Mapping[str, str],
        at: float,
    ) -> None:
        """Each partition's lag: its end at the last plan (made at ``at``) minus its position
        (never below 0); a partition without lag was caught up at ``at``."""
        live = self.metrics.live
        with live.lock:
            for (topic, partition), position in positions.items():
                if topic in remote_topics and (topic, partition) in ends:
                    labels = self._partition(remote_topics[topic], partition)
                    lag = max(0, ends[(topic, partition)] - position)
                    self._set_lag(labels, lag)
                    known = live.caught_up.get(labels)
                    if not lag:
                        live.caught_up[labels] = (max(at, known[0]) if known else at, True)
                        live.oldest.pop(labels, None)
                    elif known is not None:
                        live.caught_up[labels] = (known[0], False)

    def measured(self, lag: Lag, remote_topics: Mapping[str, str]) -> None:
        """A measurement of the flow's lag (:mod:`mirrorflow.replication.lag`): records
        behind per partition and, where it read it, when the oldest of them was written."""
        live, behind = self.metrics.live, lag.behind()
        for topic, partition in lag.ends:
            if topic not in remote_topics:
                continue
            labels = self._partition(remote_topics[topic], partition)
            with live.lock:
                self._set_lag(labels, behind.get((topic, partition), 0))
                if (topic, partition) not in behind:
                    known = live.caught_up.get(labels)
                    at = max(lag.measured_at, known[0]) if known else lag.measured_at
                    live.caught_up[labels] = (at, True)
                    live.oldest.pop(labels, None)
                    continue
                if labels in live.caught_up:
                    live.caught_up[labels] = (live.caught_up[labels][0], False)
                if (topic, partition) in lag.oldest_ms:
                    live.oldest[labels] = lag.oldest_ms[(topic, partition)] / 1000
                else:
                    live.oldest.pop(labels, None)

    def caught_up(
        self, positions: Mapping[Partition, int], remote_topics: Mapping[str, str], at: float
    ) -> None:
        """No partition had a record past its position at ``at`` (the idle wait's answer)."""
        live = self.metrics.live
        with live.lock:
            for topic, partition in positions:
                if topic in remote_topics:
                    labels = self._partition(remote_topics[topic], partition)
                    live.caught_up[labels] = (at, True)
                    live.oldest.pop(labels, None)

    def checkpoints(self, latencies: Mapping[tuple[str, str, int], float]) -> None:
        """The checkpoint task's run ended now, its checkpoints acknowledged: each (group,
        remote topic, partition)'s latency, ms (none when no checkpoint moved)."""
        now = time.time()
        self.metrics.checkpointed.labels(*self.labels).set(now)
        for (group, topic, partition), ms in latencies.items():
            labels = (*self.labels, group, topic, str(partition))
            value = max(0, round(ms))
            self.metrics.live.record(
                "mirrorflow_checkpoint_latency_ms", labels, Stats(value, value, value, 1), now
            )

    def take_latency(self, leave_out: Callable[[str], bool] = lambda remote: False) -> Stats:
        """The replication latencies of the flow's copies acknowledged since the last take,
        over all its partitions but those of remote topics ``leave_out`` names (what the flow's
        trend samples: :mod:`mirrorflow.runtime.trend`)."""
        with self.metrics.live.lock:
            taken, self._latency = self._latency, {}
        merged = Stats()
        for remote, stats in taken.items():
            if not leave_out(remote):
                merged = merged.merge(stats)
        return merged

    def heartbeat(self) -> None:
        """A heartbeat was acknowledged by the target now."""
        self.metrics.heartbeat.labels(*self.labels).set(time.time())

    def state(self, state: str) -> None:
        if state in STATES:
            self.metrics.state.labels(*self.labels).state(state)
