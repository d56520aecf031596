"""Helpers for tests that run the real mirror job with spark-submit against sandbox clusters."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
    ResourceType,
)

from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.mm2.formats import OffsetSync
from mirrorflow.paths import write_private
from mirrorflow.runtime import guard, jobs, launch
from tests.conftest import create_topics

ROOT = Path(__file__).resolve().parent.parent


def write_flow_file(
    path: Path,
    box: sandbox_mod.Sandbox,
    aliases: Iterable[str],
    lines: Iterable[str],
    clients: dict[str, dict[str, str]] | None = None,
) -> Path:
    """An mm2.properties for sandbox clusters: connection settings (``clients[alias]``, else
    the admin's over SASL_PLAINTEXT), single-broker RFs, ``lines``."""
    text = [*box.mm2_lines(aliases, clients), "emit.heartbeats.interval.seconds = 1", *lines]
    return write_private(path, "\n".join(text) + "\n")  # it holds passwords


def flow_file(
    directory: Path,
    box: sandbox_mod.Sandbox,
    topics: str,
    *lines: str,
    source: str = "primary",
    target: str = "secondary",
) -> Path:
    """``directory/mm2.properties`` with one enabled flow ``source->target`` of ``topics``."""
    flow = f"{source}->{target}"
    return write_flow_file(
        directory / "mm2.properties",
        box,
        [source, target],
        [f"{flow}.enabled = true", f"{flow}.topics = {topics}", *lines],
    )


def site_flow_file(
    directory: Path,
    box: sandbox_mod.Sandbox,
    topics: dict[str, str],
    records: int,
    extra: Iterable[str] = (),
) -> Path:
    """Flows of one application: ``topics`` maps each flow ``S->T`` to a topic created on
    ``S`` (2 partitions, ``records`` records); returns ``directory/mm2.properties`` enabling
    them, with the ``extra`` lines."""
    lines, aliases = [], []
    for flow, topic in topics.items():
        source, _, target = flow.partition("->")
        create_topics(box[source], topic, partitions=2)
        produce(box[source], topic, 2, records)
        aliases += [a for a in (source, target) if a not in aliases]
        lines += [f"{flow}.enabled = true", f"{flow}.topics = {topic}"]
    return write_flow_file(directory / "mm2.properties", box, sorted(aliases), [*lines, *extra])


def produce(cluster, topic: str, partitions: int, count: int, start: int = 0) -> list:
    """Keyed, headered, timestamped records spread over explicit partitions."""
    producer = Producer({**cluster.client_config(), "enable.idempotence": True})
    # Distinct timestamps from an hour ago: old enough to tell a copied timestamp from the
    # time of copying, recent enough that retention (7 days) leaves the records alone.
    base_ms = int(time.time() * 1000) - 3_600_000
    sent = []
    for i in range(start, start + count):
        record = dict(
            topic=topic,
            partition=i % partitions,
            key=None if i % 11 == 0 else f"key-{i}".encode(),
            value=None if i % 13 == 0 else f"value-{i}-".encode() * (1 + i % 5),
            headers=[("trace", f"t{i}".encode()), ("empty", b"")] if i % 3 else None,
            timestamp=base_ms + i,
        )
        producer.produce(**record)
        sent.append(record)
    assert producer.flush(30) == 0
    return sent


def produce_fresh(
    cluster, topic: str, partitions: int, count: int, start: int, seconds: float = 0.0
) -> list:
    """Records stamped now (``produce`` stamps them an hour ago), spread evenly over
    ``seconds`` (0: at once)."""
    producer = Producer({**cluster.client_config(), "enable.idempotence": True})
    sent, began = [], time.monotonic()
    for n, i in enumerate(range(start, start + count)):
        record = dict(
            topic=topic,
            partition=i % partitions,
            key=f"key-{i}".encode(),
            value=f"fresh-{i}".encode(),
            headers=[("trace", f"t{i}".encode())],
        )
        producer.produce(**record)
        sent.append(record)
        if seconds and n % 200 == 199:
            producer.poll(0)
            time.sleep(max(0.0, began + seconds * (n + 1) / count - time.monotonic()))
    assert producer.flush(30) == 0
    return sent


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def copied(records: dict[int, list]) -> dict[int, list]:
    """Records without their offsets: what a faithful copy must reproduce per partition."""
    return {p: [r[1:] for r in rs] for p, rs in records.items()}


def distinct(records: list) -> set:
    """A partition's records as a set (offsets left out), to check that none is missing."""
    return {(key, value, tuple(headers), ts) for _offset, key, value, headers, ts in records}


def stop_job(job: subprocess.Popen, timeout: float = 90) -> int:
    """Ask a running mirror job to stop (SIGTERM: after its batch); kill it if it does not."""
    if job.poll() is None:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    return job.returncode


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """``mirrorflow ARGS`` in a fresh Python from the checkout, its output captured; ``env`` is
    the command's whole environment (default: this process's)."""
    return subprocess.run(
        [sys.executable, "-m", "mirrorflow.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def fake_job(files: jobs.JobFiles, obeys_stop_file: bool) -> subprocess.Popen:
    """A process like the mirror job: its own group, the stop file on its command line."""
    loop = (
        "import pathlib, sys, time\n"
        "stop = pathlib.Path(sys.argv[2])\n"
        f"while not ({obeys_stop_file} and stop.exists()): time.sleep(0.1)\n"
        "time.sleep(1)  # finishing its batch\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", loop, "--stop-file", str(files.stop_file)],
        start_new_session=True,
    )


def mirror_command(
    config: Path, flow: str | list[str], state: Path, *extra: str, conf: dict | None = None
) -> list[str]:
    """The command that runs ``flow`` (or several flows in one application): the same one
    ``mirrorflow mirror`` and the DAGs use; ``conf`` adds Spark settings."""

    def option(name: str):
        return extra[extra.index(name) + 1] if name in extra else None

    return launch.mirror_command(
        [config],
        flow,
        master="local[2]",
        driver_memory="768m",
        conf=conf,
        state_dir=state,
        once="--once" in extra,
        stop_file=option("--stop-file"),
        max_records_per_batch=option("--max-records-per-batch"),
        local_batch_max_records=option("--local-batch-max-records"),
        metrics_port=option("--metrics-port"),
        continuous=False if "--no-continuous" in extra else None,  # None: the default
    )


def run_mirror_once(config: Path, flow: str, state: Path, timeout: float = 240) -> str:
    """Run a flow until it has copied everything available; return its output."""
    result = subprocess.run(
        guard.guarded(mirror_command(config, flow, state, "--once")),  # ends if pytest dies
        capture_output=True,
        text=True,
        timeout=timeout,
        env=launch.job_environment(),
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout + result.stderr


def start_mirror(
    config: Path,
    flow: str | list[str],
    state: Path,
    log: Path,
    *extra: str,
    conf: dict | None = None,
) -> subprocess.Popen:
    """Start a long-running flow (or flows) in the background (its output goes to ``log``),
    under the job's guard: the job ends if this test process dies."""
    handle = open(log, "ab")  # noqa: SIM115 (closed when the process is waited for)
    return subprocess.Popen(
        guard.guarded(mirror_command(config, flow, state, *extra, conf=conf)),
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=launch.job_environment(),
        cwd=ROOT,
        start_new_session=True,
    )


_LEADER_MOVING = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
)


def _watermarks(consumer: Consumer, tp: TopicPartition, timeout: float = 30.0) -> tuple[int, int]:
    """A partition's watermarks, waiting while its leader moves (a broker just restarted)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=10)
        except KafkaException as exc:
            moving = exc.args[0].retriable() or exc.args[0].code() in _LEADER_MOVING
            if not moving or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def read_topic(cluster: sandbox_mod.Cluster, topic: str, timeout: float = 60.0) -> dict[int, list]:
    """Every record of ``topic`` up to its current end, per partition in offset order.

    Each record is ``(offset, key, value, headers, timestamp)``.
    """
    admin = AdminClient(cluster.client_config())
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": "read-topic",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,  # the end: transaction markers are never delivered
        }
    )
    result: dict[int, list] = {p: [] for p in partitions}
    try:
        ends = {p: _watermarks(consumer, TopicPartition(topic, p)) for p in partitions}
        pending = {p for p, (low, high) in ends.items() if high > low}
        consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in pending])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.partition() not in pending:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                continue
            result[msg.partition()].append(
                (msg.offset(), msg.key(), msg.value(), msg.headers() or [], msg.timestamp()[1])
            )
        assert not pending, f"could not read {topic} partitions {sorted(pending)} to their end"
    finally:
        consumer.close()
    return result


def watermarks(
    cluster: sandbox_mod.Cluster, topic: str, partitions: list[int], timeout: float = 30.0
) -> dict[int, tuple]:
    """(log start offset, end offset) of each partition, from the partition leader; asked again
    while a broker that just restarted answers with a retriable error (UNKNOWN_LEADER_EPOCH)."""
    admin = AdminClient(cluster.client_config())
    deadline = time.monotonic() + timeout
    while True:
        try:
            bounds = {}
            for spec, index in ((OffsetSpec.earliest(), 0), (OffsetSpec.latest(), 1)):
                futures = admin.list_offsets({TopicPartition(topic, p): spec for p in partitions})
                for tp, future in futures.items():
                    offset = future.result(timeout=30).offset
                    bounds.setdefault(tp.partition, [0, 0])[index] = offset
            return {p: tuple(b) for p, b in bounds.items()}
        except KafkaException as exc:
            error = exc.args[0]
            moving = error.code() in (*_LEADER_MOVING, KafkaError.UNKNOWN_LEADER_EPOCH)
            if not (error.retriable() or moving) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def end_offsets(cluster: sandbox_mod.Cluster, topic: str, partitions: int) -> dict[int, int]:
    """The end offset of each of ``topic``'s partitions ``0..partitions-1`` (see
    :func:`watermarks`)."""
    bounds = watermarks(cluster, topic, list(range(partitions)))
    return {p: end for p, (_start, end) in bounds.items()}


def alter_topic(cluster: sandbox_mod.Cluster, topic: str, config: dict[str, str]) -> None:
    """Set ``config`` on ``topic`` of ``cluster`` (an incremental alter, as an admin would)."""
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()
    ]
    admin = AdminClient(cluster.client_config())
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def record_batches(
    cluster: sandbox_mod.Cluster, topic: str, partition: int
) -> list[tuple[int, int]]:
    """The record batches of a partition as its broker stored them (first and last offset of
    each), read from its log segments with Kafka's own ``DumpLogSegments``: how the records were
    produced, one request's worth to a batch."""
    from mirrorflow.devtools.broker import LOG_DIR
    from mirrorflow.runtime import jvm

    segments = sorted((Path(cluster.directory) / LOG_DIR / f"{topic}-{partition}").glob("*.log"))
    dumped = subprocess.run(
        [
            "java",
            "-cp",
            jvm.classpath("kafka"),
            "org.apache.kafka.tools.DumpLogSegments",
            "--files",
            ",".join(map(str, segments)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return [
        (int(m[1]), int(m[2])) for m in re.finditer(r"baseOffset: (\d+) lastOffset: (\d+)", dumped)
    ]


def topic_names(cluster: sandbox_mod.Cluster) -> set[str]:
    return set(AdminClient(cluster.client_config()).list_topics(timeout=10).topics)


def wait_for(condition, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def offset_syncs(cluster: sandbox_mod.Cluster, topic: str) -> list[OffsetSync]:
    return [
        OffsetSync.from_record(key, value)
        for _o, key, value, _h, _t in read_topic(cluster, topic).get(0, [])
    ]


def progress(state: Path, flow_dir: str = "primary-secondary") -> dict:
    """A flow's ``progress.json`` under the state directory (empty until the job writes it)."""
    return jobs.read_progress(state / flow_dir)
