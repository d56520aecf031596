"""Faults at random for the fault tests and the soak, and the verification that follows them.

:class:`Supervisor` keeps a mirror job running as Airflow's retries would (a job that died is
started again). :class:`FaultScheduler` injects faults from a seeded RNG for a bounded time and
stops by itself: SIGKILL of the job's driver (its whole process tree), SIGKILL of a Spark Python
worker (the executor side of local mode), broker restarts on either side, cuts of a
:class:`~mirrorflow.devtools.datacenters.Datacenter`'s link. :func:`verify` reads both sides and
counts, per partition, records lost and records repeated, and checks every offset sync.

Records are identified by their value: the producer of :func:`produce_numbered` writes value
``b"%012d" % i`` followed by padding, unique over the topic.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.mm2.formats import OffsetSync
from mirrorflow.runtime import processes

# -- processes -----------------------------------------------------------------------------


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group and every descendant (no clean shutdown)."""
    tree = processes.descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for p in [pid, *tree]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def python_workers(pid: int) -> list[int]:
    """Spark's Python workers (``pyspark.daemon`` and its forks) below a job's process."""
    return [
        p
        for p in processes.descendants(pid)
        if any("pyspark.daemon" in a for a in processes.command_line(p))
    ]


class Supervisor:
    """Keeps one job running: ``start()`` makes a process; a dead one is started again."""

    def __init__(self, start: Callable[[], subprocess.Popen]) -> None:
        self._start = start
        self.job = start()
        self.restarts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self.job.poll() is not None:
                    kill_tree(self.job.pid)  # orphans of the dead launcher
                    time.sleep(2)
                    self.job = self._start()
                    self.restarts += 1

    def kill(self) -> None:
        """SIGKILL the job's driver and everything below it; the watcher restarts it."""
        with self._lock:
            kill_tree(self.job.pid)
            self.job.wait(30)

    def stop(self, graceful: Callable[[subprocess.Popen], object]) -> None:
        """Stop watching, ask the job to stop (``graceful``), kill what is left (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        graceful(self.job)
        kill_tree(self.job.pid)


# -- faults --------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    at: float  # seconds since the scheduler started
    seconds: float  # how long it lasted (the cut, the restart)
    note: str = ""


@dataclass
class FaultScheduler:
    """Faults at random, one at a time, for ``duration`` seconds from :meth:`start`.

    ``actions`` maps a kind to a callable taking the RNG and returning a note; ``gap`` is the
    range of seconds between the end of a fault and the start of the next.
    """

    actions: dict[str, Callable[[random.Random], str]]
    duration: float
    seed: int = 1
    gap: tuple[float, float] = (10.0, 30.0)
    faults: list[Fault] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    last_fault_end: float | None = None  # time.monotonic()

    def start(self) -> None:
        self._rng = random.Random(self.seed)
        self._stop = threading.Event()
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        end = self._began + self.duration
        while not self._stop.wait(self._rng.uniform(*self.gap)):
            if time.monotonic() >= end:
                break
            kind = self._rng.choice(sorted(self.actions))
            began = time.monotonic()
            try:
                note = self.actions[kind](self._rng) or ""
            except Exception as exc:  # a fault that could not be made is reported, not fatal
                self.errors.append(f"{kind}: {exc}")
                continue
            self.last_fault_end = time.monotonic()
            self.faults.append(
                Fault(
                    kind, round(began - self._began, 1), round(self.last_fault_end - began, 1), note
                )
            )

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def counts(self) -> dict[str, int]:
        return dict(Counter(f.kind for f in self.faults))


# -- records -------------------------------------------------------------------------------


def produce_numbered(
    cluster: sandbox_mod.Cluster,
    topic: str,
    partitions: int,
    start: int,
    count: int,
    size: int = 100,
    producer: Producer | None = None,
) -> None:
    """Records ``start .. start+count-1``: value ``b"%012d" % i`` padded to ``size`` bytes,
    round-robin over ``partitions``; idempotent, retried until delivered (links get cut)."""
    own = producer is None
    producer = producer or Producer(
        {
            **cluster.client_config(),
            "enable.idempotence": True,
            "linger.ms": 20,
            "delivery.timeout.ms": 600_000,
            "log_level": 0,
        }
    )
    pad = b"." * max(0, size - 12)
    failed: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failed.append(str(err))

    for i in range(start, start + count):
        while True:
            try:
                producer.produce(
                    topic, value=b"%012d" % i + pad, partition=i % partitions, on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if own:
        while producer.flush(10):
            pass
    assert not failed, f"{len(failed)} records were not delivered: {failed[0]}"


def read_numbers(
    cluster: sandbox_mod.Cluster, topic: str, committed: bool = True, timeout: float = 600.0
) -> dict[int, dict[int, int]]:
    """Per partition, offset -> record number, up to the partition's current end."""
    admin = AdminClient({**cluster.client_config(), "log_level": 0})
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": f"verify-{os.getpid()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "fetch.max.bytes": 8 << 20,
            "log_level": 0,
        }
    )
    result: dict[int, dict[int, int]] = {p: {} for p in partitions}
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 30) for p in partitions}
        pending = {p for p, (low, high) in ends.items() if high > low}
        consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in pending])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                error, partition, offset = msg.error(), msg.partition(), msg.offset()
                assert partition is not None and offset is not None  # set on a consumed one
                if error:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(partition)
                    continue
                value = msg.value()
                if value is not None and value[:12].isdigit():
                    result[partition][offset] = int(value[:12])
        assert not pending, f"could not read {topic} partitions {sorted(pending)} to their end"
    finally:
        consumer.close()
    return result


def read_offset_syncs(cluster: sandbox_mod.Cluster, topic: str) -> list[OffsetSync]:
    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": f"verify-syncs-{os.getpid()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    syncs = []
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), 30)
        if high <= low:
            return []
        consumer.assign([TopicPartition(topic, 0, low)])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error:
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                continue
            syncs.append(OffsetSync.from_record(msg.key(), msg.value()))
    finally:
        consumer.close()
    return syncs


@dataclass
class Verdict:
    records: int  # distinct records on the source
    copies: int  # records on the target
    lost: dict[int, int]  # per partition
    repeated: dict[int, int]  # per partition: copies beyond the first
    syncs: int
    wrong_syncs: int
    # per partition, offset -> record number, on each side (for checkpoint checks)
    upstream: dict[int, dict[int, int]] = field(default_factory=dict, repr=False)
    downstream: dict[int, dict[int, int]] = field(default_factory=dict, repr=False)

    @property
    def total_lost(self) -> int:
        return sum(self.lost.values())

    @property
    def total_repeated(self) -> int:
        return sum(self.repeated.values())


def verify(
    source: sandbox_mod.Cluster,
    topic: str,
    target: sandbox_mod.Cluster,
    remote_topic: str,
    syncs_topic: str,
) -> Verdict:
    """Lost and repeated records per partition (target against source), and every offset sync
    of ``topic`` checked: the target's record at its downstream offset is the source's record
    at its upstream offset."""
    upstream = read_numbers(source, topic)
    downstream = read_numbers(target, remote_topic)
    lost, repeated = {}, {}
    for p, records in upstream.items():
        copies = list(downstream.get(p, {}).values())
        lost[p] = len(set(records.values()) - set(copies))
        repeated[p] = len(copies) - len(set(copies))
    wrong = 0
    syncs = [s for s in read_offset_syncs(source, syncs_topic) if s.topic == topic]
    for sync in syncs:
        up = upstream.get(sync.partition, {}).get(sync.upstream_offset)
        down = downstream.get(sync.partition, {}).get(sync.downstream_offset)
        wrong += up is None or up != down
    return Verdict(
        records=sum(len(r) for r in upstream.values()),
        copies=sum(len(r) for r in downstream.values()),
        lost=lost,
        repeated=repeated,
        syncs=len(syncs),
        wrong_syncs=wrong,
        upstream=upstream,
        downstream=downstream,
    )


def caught_up(
    source: sandbox_mod.Cluster, topic: str, target: sandbox_mod.Cluster, remote_topic: str
) -> bool:
    """True once the target holds at least as many records per partition as the source
    (a cheap check from watermarks, before the full :func:`verify`)."""
    try:
        src = Consumer({**source.client_config(), "group.id": "caught-up", "log_level": 0})
        dst = Consumer({**target.client_config(), "group.id": "caught-up", "log_level": 0})
        try:
            parts = src.list_topics(topic, timeout=10).topics[topic].partitions
            for p in parts:
                low, high = src.get_watermark_offsets(TopicPartition(topic, p), 10)
                dlow, dhigh = dst.get_watermark_offsets(TopicPartition(remote_topic, p), 10)
                if dhigh - dlow < high - low:
                    return False
            return True
        finally:
            src.close()
            dst.close()
    except Exception:
        return False


def settle(
    source: sandbox_mod.Cluster,
    topic: str,
    target: sandbox_mod.Cluster,
    remote_topic: str,
    syncs_topic: str,
    timeout: float,
) -> tuple[Verdict, float]:
    """Wait until nothing is lost (or ``timeout``): the last verdict, and the seconds until the
    target held every record (the verification's own reading left out)."""
    began = time.monotonic()
    while True:
        if caught_up(source, topic, target, remote_topic):
            checked = time.monotonic()  # caught up: what follows is the verification's reading
            verdict = verify(source, topic, target, remote_topic, syncs_topic)
            if verdict.total_lost == 0 or time.monotonic() - began > timeout:
                return verdict, checked - began
        elif time.monotonic() - began > timeout:
            return verify(source, topic, target, remote_topic, syncs_topic), timeout
        time.sleep(2)


# -- checkpoints ---------------------------------------------------------------------------


def commit_group(
    cluster: sandbox_mod.Cluster, topic: str, group: str, offsets: dict[int, int]
) -> None:
    """Commit ``group``'s offsets on ``topic`` (partition -> next offset to read)."""
    consumer = Consumer({**cluster.client_config(), "group.id": group, "log_level": 0})
    try:
        tps = [TopicPartition(topic, p, o) for p, o in offsets.items()]
        for attempt in range(30):  # the coordinator may be moving (a broker restart, a cut)
            try:
                consumer.commit(offsets=tps, asynchronous=False)
                return
            except Exception:
                if attempt == 29:
                    raise
                time.sleep(2)
    finally:
        consumer.close()


def wrong_checkpoints(
    config: Path,
    flow: str,
    group: str,
    committed: dict[int, int],
    upstream: dict[int, dict[int, int]],
    downstream: dict[int, dict[int, int]],
    timeout: float = 120.0,
) -> int:
    """How many partitions' latest checkpoint of ``group`` is not exact, waiting up to
    ``timeout`` for checkpoints of the ``committed`` offsets: exact means the checkpoint's
    upstream offset is the committed one and the target's record at its downstream offset is
    the source's record at that offset (a consumer failing over resumes at the same record)."""
    from mirrorflow.replication.checkpoint_stores import read_checkpoints
    from mirrorflow.replication.spec import spec_for_flow

    spec = spec_for_flow([config], flow)
    deadline = time.monotonic() + timeout
    while True:
        latest = read_checkpoints(spec).latest
        wrong = 0
        for p, offset in committed.items():
            checkpoint = next(
                (c for (g, _t, part), c in latest.items() if g == group and part == p), None
            )
            if checkpoint is None or checkpoint.upstream_offset != offset:
                wrong += 1
                continue
            record = upstream.get(p, {}).get(offset)
            copy = downstream.get(p, {}).get(checkpoint.downstream_offset)
            wrong += record is None or record != copy
        if wrong == 0 or time.monotonic() > deadline:
            return wrong
        time.sleep(2)
