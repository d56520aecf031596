#!/usr/bin/env python
"""Replication benchmark: mirrorflow's Spark mirror job against MirrorMaker 2 and Kafka's own
perf tools, on the same data, between the same two local clusters, on this machine.

    python benchmarks/replicate.py [--records 2000000 --record-size 1024 --partitions 8]
                                   [--small-records N] [--only mm2,mirrorflow,ceiling]

For each case (a large-record and a small-record data set) it loads the data into a source topic
on ``bench-a`` once, then lets each system copy it to a fresh target on ``bench-b`` and reports
wall time, records/s, MiB/s, CPU seconds of the system's whole process tree, peak memory, the
brokers' CPU, and the ratios mirrorflow / MirrorMaker 2. Every run is verified on the target
(every record exactly once, in order, in its partition); a run that lost data says so. See
benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))

from confluent_kafka import (  # noqa: E402
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # noqa: E402

from benchmarks import procstats  # noqa: E402
from mirrorflow.devtools import sandbox as sandbox_mod  # noqa: E402
from mirrorflow.paths import write_private  # noqa: E402
from mirrorflow.runtime import jvm, launch  # noqa: E402

SOURCE, TARGET = "bench-a", "bench-b"
FLOW = f"{SOURCE}->{TARGET}"
SYSTEMS = ("ceiling", "mm2", "mirrorflow")
MIRROR_JOB = REPO / "spark_jobs" / "mirror.py"
RESULTS_DIR = REPO / "benchmarks" / "results"
KEY_WIDTH = 12  # keys are the record's index, zero-padded: b"000000000042"
MIB = 1024 * 1024
TRANSIENT = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TRANSPORT,
}

# JVM options as Kafka's own launch scripts set them (kafka-run-class.sh, and the heap from
# connect-mirror-maker.sh / kafka-*-perf-test.sh), so each tool runs as it would when installed.
KAFKA_JVM_PERFORMANCE_OPTS = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]
MM2_HEAP = ["-Xms256M", "-Xmx2G"]
PERF_TOOL_HEAP = ["-Xmx512M"]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Cases and set-up


@dataclass(frozen=True)
class Case:
    name: str
    records: int
    record_size: int  # value bytes; each record also has a KEY_WIDTH-byte key
    partitions: int
    headers: bool

    @property
    def topic(self) -> str:
        return f"bench-{self.name}-{self.record_size}b"

    @property
    def record_bytes(self) -> int:
        return KEY_WIDTH + self.record_size

    def expected_per_partition(self) -> list[int]:
        base, extra = divmod(self.records, self.partitions)
        return [base + (1 if p < extra else 0) for p in range(self.partitions)]


@dataclass
class Bench:
    args: argparse.Namespace
    workdir: Path
    box: sandbox_mod.Sandbox
    source_topics: set[str] = field(default_factory=set)

    @property
    def source(self) -> sandbox_mod.Cluster:
        return self.box[SOURCE]

    @property
    def target(self) -> sandbox_mod.Cluster:
        return self.box[TARGET]

    def admin(self, cluster: sandbox_mod.Cluster) -> AdminClient:
        return AdminClient({**cluster.client_config(), "log_level": 3})

    def java_client_file(self, cluster: sandbox_mod.Cluster) -> Path:
        path = self.workdir / f"{cluster.name}.client.properties"
        if not path.exists():
            props = cluster.java_client_config()
            write_private(path, "".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    @property
    def logs(self) -> Path:
        path = self.workdir / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path


def create_topic(admin: AdminClient, name: str, partitions: int) -> None:
    futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
    futures[name].result(timeout=60)


def user_topics(admin: AdminClient) -> set[str]:
    return {t for t in admin.list_topics(timeout=20).topics if not t.startswith("__")}


def delete_topics(admin: AdminClient, names: set[str], timeout: float = 60.0) -> None:
    if not names:
        return
    for name, future in admin.delete_topics(sorted(names), operation_timeout=30).items():
        try:
            future.result(timeout=60)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise RuntimeError(f"could not delete topic {name}: {exc}") from None
    deadline = time.monotonic() + timeout
    while user_topics(admin) & names:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics still present {timeout:.0f}s after deletion: {names}")
        time.sleep(0.2)


def reset_clusters(bench: Bench) -> None:
    """Leave only the loaded source topics: every earlier run's output and state goes."""
    source_admin, target_admin = bench.admin(bench.source), bench.admin(bench.target)
    delete_topics(target_admin, user_topics(target_admin))
    delete_topics(source_admin, user_topics(source_admin) - bench.source_topics)


def load_case(bench: Bench, case: Case) -> dict[str, Any]:
    """Write the case's records to its source topic (not measured) and check they all landed.

    Record ``i`` goes to partition ``i % partitions`` with key ``b"%012d" % i`` and a value of
    ``record_size`` bytes that starts with the key followed by random (incompressible) bytes.
    """
    admin = bench.admin(bench.source)
    create_topic(admin, case.topic, case.partitions)
    producer = Producer(
        {
            **bench.source.client_config(),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "none",
        }
    )
    pool = os.urandom(case.record_size + 65536)
    body = case.record_size - KEY_WIDTH
    headers = [("bench", b"1")] if case.headers else None
    started = time.monotonic()
    produce, poll, topic, parts = producer.produce, producer.poll, case.topic, case.partitions
    for i in range(case.records):
        key = b"%012d" % i
        offset = (i * 7919) % 65536
        value = key + pool[offset : offset + body]
        while True:
            try:
                produce(topic, value, key, partition=i % parts, headers=headers)
                break
            except BufferError:
                poll(0.05)
        if not i % 20000:
            poll(0)
    remaining = producer.flush(300)
    seconds = time.monotonic() - started
    if remaining:
        raise RuntimeError(f"loading {case.topic}: {remaining} records not delivered")
    counts = partition_counts(admin, case.topic)
    if counts != case.expected_per_partition():
        raise RuntimeError(
            f"loading {case.topic}: partitions hold {counts}, "
            f"expected {case.expected_per_partition()}"
        )
    bench.source_topics.add(case.topic)
    return {"seconds": round(seconds, 2), "records_per_s": round(case.records / seconds)}


def partition_counts(admin: AdminClient, topic: str) -> list[int] | None:
    """Committed records per partition (end offset minus start offset); None if no topic."""
    meta = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        return None
    parts = sorted(meta.partitions)
    specs: dict[str, Any] = {"latest": OffsetSpec.latest(), "earliest": OffsetSpec.earliest()}
    found: dict[str, dict[int, int]] = {}
    for name, spec in specs.items():
        futures = admin.list_offsets(
            {TopicPartition(topic, p): spec for p in parts},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=10,
        )
        found[name] = {tp.partition: f.result().offset for tp, f in futures.items()}
    return [found["latest"][p] - found["earliest"][p] for p in parts]


# --------------------------------------------------------------------------------------------
# Measuring one run


@dataclass
class Launch:
    """One process tree of a run."""

    name: str
    command: list[str]
    env: dict[str, str] | None = None
    cwd: Path | None = None
    exits: bool = False  # ends by itself when its work is done (else it is stopped)
    exit_ends_work: bool = False  # its work is not visible on the target: wall waits for exit


@dataclass
class Running:
    launch: Launch
    proc: subprocess.Popen
    report: Path
    log: Path
    exit_t: float | None = None


LIVE: list[Running] = []  # so an interrupted benchmark stops what it started


@dataclass
class RunResult:
    case: str
    system: str
    run: int
    records: int
    record_bytes: int
    ok: bool = False
    skipped: str | None = None
    problems: list[str] = field(default_factory=list)
    records_on_target: int | None = None
    wall_s: float | None = None  # launch -> every record on the target (and tools exited)
    startup_s: float | None = None  # launch -> first record on the target
    copy_s: float | None = None  # first record -> last record on the target
    lifetime_s: float | None = None  # launch -> every process of the system exited
    cpu_s: float | None = None  # whole tree, whole lifetime (start-up and shut-down included)
    cpu_user_s: float | None = None
    cpu_system_s: float | None = None
    cpu_exact: bool = True  # False: from /proc samples (a wrapper report was missing)
    copy_cpu_s: float | None = None  # sampled, between first and last record on target
    copy_records: int | None = None
    peak_rss_bytes: int | None = None
    peak_pss_bytes: int | None = None
    peak_processes: int | None = None
    processes: dict[str, int] = field(default_factory=dict)
    broker_cpu_s: dict[str, float] = field(default_factory=dict)
    machine_cpu_s: float | None = None
    other_cpu_s: float | None = None  # machine CPU not spent by the system or the brokers
    bench_cpu_s: float | None = None  # the benchmark's own sampling and polling meanwhile
    other_cpu_share: float | None = None  # other_cpu_s / (lifetime_s * cpus)
    returncodes: dict[str, int | None] = field(default_factory=dict)
    orphans: dict[str, int] = field(default_factory=dict)
    verification: dict[str, Any] = field(default_factory=dict)
    tool_output: dict[str, str] = field(default_factory=dict)
    logs: list[str] = field(default_factory=list)
    timeline: list[list[float]] = field(default_factory=list)  # t, cpu_s, rss_mib, on_target

    def rate(self, what: str) -> float | None:
        """records/s, MiB/s, records per CPU-second, and the copy-window versions.

        None for a run that never had every record on the target."""
        if self.wall_s is None:
            return None
        n, copy_n = self.records, self.copy_records
        value = {
            "records_per_s": (n, self.wall_s),
            "mib_per_s": (n * self.record_bytes / MIB, self.wall_s),
            "records_per_cpu_s": (n, self.cpu_s),
            "copy_records_per_s": (copy_n, self.copy_s),
            "copy_records_per_cpu_s": (copy_n, self.copy_cpu_s),
        }[what]
        num, den = value
        return num / den if num is not None and den else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for what in (
            "records_per_s",
            "mib_per_s",
            "records_per_cpu_s",
            "copy_records_per_s",
            "copy_records_per_cpu_s",
        ):
            value = self.rate(what)
            data[what] = round(value, 2) if value is not None else None
        return data


def broker_cpu(bench: Bench) -> dict[str, float]:
    found = {}
    for name in (SOURCE, TARGET):
        pid = bench.box[name].pid
        value = procstats.process_cpu_seconds(pid) if pid else None
        found[name] = value if value is not None else float("nan")
    return found


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start(bench: Bench, launch: Launch, tag: str) -> Running:
    log_path = bench.logs / f"{tag}-{launch.name}.log"
    report = bench.logs / f"{tag}-{launch.name}.rusage.json"
    report.unlink(missing_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            procstats.wrapped(report, launch.command),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=launch.env,
            cwd=launch.cwd or bench.workdir,
            start_new_session=True,
        )
    running = Running(launch, proc, report, log_path)
    LIVE.append(running)
    return running


def stop(runs: list[Running], timeout: float, on_sample: Any = None) -> list[str]:
    """SIGTERM (forwarded by the wrapper to the command), then SIGKILL the process group."""
    problems = []
    for run in runs:
        if run.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(run.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(r.proc.poll() is None for r in runs) and time.monotonic() < deadline:
        if on_sample:
            on_sample()
        time.sleep(0.25)
    for run in runs:
        if run.proc.poll() is None:
            problems.append(f"{run.launch.name} ignored SIGTERM for {timeout:.0f}s: killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
        if run in LIVE:
            LIVE.remove(run)
    return problems


def measure(
    bench: Bench,
    case: Case,
    system: str,
    run_no: int,
    launches: list[Launch],
    target_topic: str,
) -> RunResult:
    """Start the launches, watch the target topic until every record is there, stop, account."""
    args = bench.args
    result = RunResult(case.name, system, run_no, case.records, case.record_bytes)
    tag = f"{case.name}-{system}-{run_no}"
    target_admin = bench.admin(bench.target)
    expected = case.records

    machine0, brokers0, self0 = procstats.machine_busy_cpu_seconds(), broker_cpu(bench), self_cpu()
    t0 = time.monotonic()
    runs = [start(bench, launch, tag) for launch in launches]
    result.logs = [str(r.log) for r in runs]
    sampler = procstats.TreeSampler([r.proc.pid for r in runs], with_pss=args.pss)

    t_first = t_caught = None
    cpu_first = count_first = None
    count = last_count = 0
    last_progress = t0
    next_report = t0 + 10
    while True:
        sample = sampler.sample()
        now = sample.t
        try:
            counts = partition_counts(target_admin, target_topic)
        except KafkaException as exc:  # e.g. a new topic's leader not known yet: next time
            counts = None
            if exc.args[0].code() not in TRANSIENT:
                log(f"    (end offsets of {target_topic}: {exc})")
        count = sum(counts) if counts else count
        result.timeline.append(
            [round(now - t0, 2), round(sample.cpu_s, 2), round(sample.rss_bytes / MIB), count]
        )
        if count and t_first is None:
            t_first, cpu_first, count_first = now, sample.cpu_s, count
        if count > last_count:
            last_count, last_progress = count, now
        if count >= expected and t_caught is None:
            t_caught = now
            result.copy_cpu_s = sample.cpu_s - cpu_first if now > t_first else None
        for run in runs:
            if run.exit_t is None and run.proc.poll() is not None:
                run.exit_t = now
        failed = [r for r in runs if r.exit_t is not None and r.proc.returncode != 0]
        if failed:
            for r in failed:
                result.problems.append(
                    f"{r.launch.name} exited with code {r.proc.returncode} (log: {r.log})"
                )
            break
        early = [r for r in runs if not r.launch.exits and r.exit_t is not None]
        if early and t_caught is None:
            for r in early:
                result.problems.append(f"{r.launch.name} exited before the end (log: {r.log})")
            break
        exiting = [r for r in runs if r.launch.exits]
        # Everything that was going to finish has finished: late records are not coming.
        if (
            exiting
            and t_caught is None
            and all(r.exit_t is not None for r in exiting)
            and now - max(r.exit_t for r in exiting) > 3
        ):
            result.problems.append(
                f"exited with only {count} of {expected} records on {target_topic}"
            )
            break
        if t_caught is not None:
            enders = [r for r in runs if r.launch.exit_ends_work]
            if all(r.exit_t is not None for r in enders):
                if all(r.exit_t is not None for r in exiting):
                    break  # all done (or nothing exits by itself: stop it now)
                if now - t_caught > args.exit_grace:
                    names = ", ".join(r.launch.name for r in exiting if r.exit_t is None)
                    result.problems.append(
                        f"{names} still running {args.exit_grace:.0f}s after every record "
                        "was on the target: stopped"
                    )
                    break
        if now - t0 > args.run_timeout:
            result.problems.append(f"timed out after {args.run_timeout:.0f}s")
            break
        if t_first is None and now - t0 > args.startup_timeout:
            result.problems.append(f"no record on the target after {args.startup_timeout:.0f}s")
            break
        if t_first is not None and t_caught is None and now - last_progress > args.stall_timeout:
            result.problems.append(f"no progress for {args.stall_timeout:.0f}s at {count}")
            break
        if now >= next_report:
            log(f"    {now - t0:6.1f}s  {count:>10,} / {expected:,} on target")
            next_report = now + 10
        time.sleep(max(0.0, args.sample_interval - (time.monotonic() - now)))

    result.problems += stop(runs, args.stop_timeout, sampler.sample)
    t_end = time.monotonic()
    machine1, brokers1, self1 = procstats.machine_busy_cpu_seconds(), broker_cpu(bench), self_cpu()

    # Times
    if t_caught is not None:
        enders = [r.exit_t for r in runs if r.launch.exit_ends_work and r.exit_t]
        result.wall_s = max([t_caught, *enders]) - t0
    if t_first is not None:
        result.startup_s = t_first - t0
        if t_caught is not None and t_caught > t_first:
            result.copy_s = t_caught - t_first
            result.copy_records = expected - count_first
    result.lifetime_s = t_end - t0

    # CPU: exact from the wrappers' rusage when every wrapper reported
    usages = []
    for run in runs:
        result.returncodes[run.launch.name] = run.proc.returncode
        if run.report.exists():
            usage = procstats.TreeUsage.load(run.report)
            usages.append(usage)
            result.orphans[run.launch.name] = usage.orphans_reaped
    if len(usages) == len(runs):
        result.cpu_user_s = sum(u.user_s for u in usages)
        result.cpu_system_s = sum(u.system_s for u in usages)
        result.cpu_s = result.cpu_user_s + result.cpu_system_s
        wrappers_s = sum(u.wrapper_self_s for u in usages)
    else:
        result.cpu_exact = False
        result.cpu_s = sampler.samples[-1].cpu_s
        wrappers_s = 0.0
        result.problems.append("a wrapper report is missing: CPU is from /proc samples")
    result.peak_rss_bytes = sampler.peak_rss_bytes
    result.peak_pss_bytes = sampler.peak_pss_bytes if args.pss else None
    result.peak_processes = sampler.peak_processes
    result.processes = sampler.commands
    result.broker_cpu_s = {k: round(brokers1[k] - brokers0[k], 2) for k in brokers0}
    result.machine_cpu_s = machine1 - machine0
    result.bench_cpu_s = self1 - self0 + wrappers_s
    result.other_cpu_s = (
        result.machine_cpu_s
        - result.cpu_s
        - sum(result.broker_cpu_s.values())
        - (self1 - self0)
        - wrappers_s
    )
    result.other_cpu_share = result.other_cpu_s / (result.lifetime_s * (os.cpu_count() or 1))
    return result


# --------------------------------------------------------------------------------------------
# Verification


def verify_full(bench: Bench, case: Case, topic: str) -> dict[str, Any]:
    """Read the target topic: every record exactly once, in its source partition, in order."""
    admin = bench.admin(bench.target)
    counts = partition_counts(admin, topic)
    if counts is None:
        return {"mode": "full", "ok": False, "status": f"DATA LOST: no topic {topic}"}
    meta = admin.list_topics(topic=topic, timeout=10).topics[topic]
    parts = sorted(meta.partitions)
    futures = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in parts},
        isolation_level=IsolationLevel.READ_COMMITTED,
    )
    end = {tp.partition: f.result().offset for tp, f in futures.items()}
    consumer = Consumer(
        {
            **bench.target.client_config(),
            "group.id": f"bench-verify-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.max.bytes": 64 * MIB,
            "max.partition.fetch.bytes": 8 * MIB,
            "queued.max.messages.kbytes": 256 * 1024,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    n, size, nparts = case.records, case.record_size, case.partitions
    seen = bytearray(n)
    last = dict.fromkeys(parts, -1)
    position = dict.fromkeys(parts, -1)
    read = distinct = duplicates = out_of_order = wrong_partition = bad = 0
    want_headers = [("bench", b"1")] if case.headers else None
    pending = {p for p in parts if end[p] > 0}
    deadline = time.monotonic() + max(120.0, n / 20000)
    try:
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(10000, timeout=1.0):
                p = msg.partition()
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(msg.error())
                    if msg.offset() >= end[p]:  # the end, past any transaction marker
                        pending.discard(p)
                    continue
                position[p] = msg.offset()
                if position[p] + 1 >= end[p]:
                    pending.discard(p)
                read += 1
                key, value = msg.key(), msg.value()
                try:
                    i = int(key)
                except (TypeError, ValueError):
                    bad += 1
                    continue
                if not 0 <= i < n:
                    bad += 1
                    continue
                if i % nparts != p:
                    wrong_partition += 1
                if seen[i]:
                    duplicates += 1
                    continue
                seen[i] = 1
                distinct += 1
                if i < last[p]:
                    out_of_order += 1
                last[p] = i
                bad += (
                    len(value) != size
                    or value[:KEY_WIDTH] != key
                    or (want_headers is not None and msg.headers() != want_headers)
                )
    finally:
        consumer.close()
    missing = n - distinct
    report = {
        "mode": "full",
        "records_read": read,
        "distinct": distinct,
        "missing": missing,
        "duplicates": duplicates,
        "out_of_order": out_of_order,
        "wrong_partition": wrong_partition,
        "bad_records": bad,
        "per_partition": counts,
    }
    if pending:
        report["unread_partitions"] = sorted(pending)
    return judge(report)


def verify_counts(
    bench: Bench, case: Case, topic: str, per_partition: bool = True
) -> dict[str, Any]:
    """End offsets only: each partition (or, if not ``per_partition``, the topic) holds as many
    records as the source."""
    counts = partition_counts(bench.admin(bench.target), topic)
    if counts is None:
        return {"mode": "offsets", "ok": False, "status": f"DATA LOST: no topic {topic}"}
    expected = case.expected_per_partition()
    if per_partition and len(counts) == len(expected):
        missing = sum(max(0, e - c) for c, e in zip(counts, expected, strict=True))
        extra = sum(max(0, c - e) for c, e in zip(counts, expected, strict=True))
    else:  # a different partition layout: compare totals only
        missing, extra = max(0, case.records - sum(counts)), max(0, sum(counts) - case.records)
    report = {
        "mode": "offsets",
        "records_read": sum(counts),
        "missing": missing,
        "duplicates": extra,
        "per_partition": counts,
    }
    if per_partition and len(counts) != len(expected):
        report["wrong_partition"] = f"{len(counts)} partitions, source has {len(expected)}"
    return judge(report)


def judge(report: dict[str, Any]) -> dict[str, Any]:
    faults = []
    if report.get("missing"):
        faults.append(f"DATA LOST: {report['missing']:,} records missing")
    for key, label in (
        ("wrong_partition", "in the wrong partition"),
        ("out_of_order", "out of order"),
        ("bad_records", "corrupt"),
    ):
        if report.get(key):
            faults.append(f"{report[key]} records {label}")
    if report.get("unread_partitions"):
        faults.append(f"partitions {report['unread_partitions']} could not be read to the end")
    if report.get("duplicates"):
        faults.append(f"{report['duplicates']:,} duplicates")
    report["ok"] = not faults
    report["status"] = "; ".join(faults) if faults else "exact"
    return report


# --------------------------------------------------------------------------------------------
# The systems


# Replication factors of 1 for MM2's (and mirrorflow's) own topics: the clusters have one broker.
# plugin.discovery: MirrorMaker 2 logs this advice at start-up: it skips a ~7 s classpath scan.
SINGLE_BROKER_PROPERTIES = (
    "plugin.discovery = service_load",
    "replication.factor = 1",
    "checkpoints.topic.replication.factor = 1",
    "heartbeats.topic.replication.factor = 1",
    "offset-syncs.topic.replication.factor = 1",
    "offset.storage.replication.factor = 1",
    "status.storage.replication.factor = 1",
    "config.storage.replication.factor = 1",
)


def mm2_properties(
    clusters: list[sandbox_mod.Cluster],
    flows: dict[str, str],
    disabled: list[str],
    tasks: int,
    extra: list[tuple[str, str]],
) -> list[str]:
    """The lines of an mm2.properties: the clusters' connection settings, the enabled ``flows``
    (flow -> topics pattern), the ``disabled`` ones, ``tasks.max``, replication factors of 1,
    then the ``extra`` (key, value) lines."""
    lines = [f"clusters = {', '.join(c.name for c in clusters)}"]
    for cluster in clusters:
        lines += [f"{cluster.name}.{k} = {v}" for k, v in cluster.java_client_config().items()]
    for flow, topics in flows.items():
        lines += [f"{flow}.enabled = true", f"{flow}.topics = {topics}"]
    lines += [f"{flow}.enabled = false" for flow in disabled]
    lines += [f"tasks.max = {tasks}", *SINGLE_BROKER_PROPERTIES]
    return lines + [f"{k.strip()} = {v.strip()}" for k, v in extra]


def flow_file(bench: Bench, case: Case) -> Path:
    """One mm2.properties per case, given unchanged to MirrorMaker 2 and to mirrorflow."""
    lines = [
        "# Written by benchmarks/replicate.py; read by MirrorMaker 2 and by mirrorflow alike.",
        *mm2_properties(
            [bench.source, bench.target],
            {FLOW: case.topic},
            [f"{TARGET}->{SOURCE}"],
            bench.args.tasks,
            bench.args.flow_prop,
        ),
    ]
    path = bench.workdir / f"{case.name}.mm2.properties"
    write_private(path, "\n".join(lines) + "\n")
    return path


def java() -> str:
    return jvm.require_tool("java", "to run MirrorMaker 2 and Kafka's perf tools")


def mm2_launches(bench: Bench, case: Case) -> list[Launch]:
    return [mm2_launch(bench, flow_file(bench, case), TARGET)]


def mm2_launch(bench: Bench, config: Path, clusters: str | None) -> Launch:
    """MirrorMaker 2 in dedicated mode on ``config``: the herders of the target ``clusters``,
    or (None) every herder of the file, all in this one JVM."""
    command = jvm.mirrormaker_command(
        config,
        clusters or "",
        bench.workdir,
        log_level=bench.args.mm2_log_level,
        jvm_options=(*MM2_HEAP, *KAFKA_JVM_PERFORMANCE_OPTS),
    )
    if clusters is None:  # no --clusters: MirrorMaker 2 runs every herder of the file
        command = command[: command.index("--clusters")]
    return Launch("mm2", command)


def mirrorflow_launches(bench: Bench, case: Case, run_no: int) -> list[Launch]:
    # A fresh state directory per run: no checkpoint of an earlier run to resume from.
    state = bench.workdir / "state" / f"{case.name}-mirrorflow-{run_no}"
    return [mirrorflow_launch(bench, [flow_file(bench, case)], FLOW, state, once=True)]


def mirrorflow_launch(
    bench: Bench,
    configs: list[Path],
    flow: str | list[str],
    state: Path,
    name: str = "mirrorflow",
    **job_options: Any,
) -> Launch:
    """One mirror job (Spark application) of ``flow`` (or several flows) with a fresh ``state``
    directory, launched by the same command ``mirrorflow mirror`` and the generated DAGs run;
    ``job_options`` go to :func:`mirrorflow.runtime.launch.mirror_command` (``once``, ...)."""
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    command = launch.mirror_command(
        configs, flow, master=bench.args.spark_master, state_dir=state, **job_options
    )
    job = command.index(str(launch.MIRROR_JOB))
    for conf in bench.args.spark_conf:  # after the launcher's own --conf: the last one wins
        command[job:job] = ["--conf", conf]
        job += 2
    env = {**launch.job_environment(), "MIRRORFLOW_STATE": str(state)}
    return Launch(name, command, env=env, cwd=state, exits=bool(job_options.get("once")))


def ceiling_launches(bench: Bench, case: Case, target_topic: str) -> list[Launch]:
    """Kafka's consumer perf tool on the source and producer perf tool on the target, together."""
    create_topic(bench.admin(bench.target), target_topic, case.partitions)
    tools = [java(), *PERF_TOOL_HEAP, *KAFKA_JVM_PERFORMANCE_OPTS, "-cp", jvm.classpath("kafka")]
    consume = [
        *tools,
        "org.apache.kafka.tools.ConsumerPerformance",
        "--bootstrap-server",
        bench.source.bootstrap_servers,
        "--command-config",
        str(bench.java_client_file(bench.source)),
        "--topic",
        case.topic,
        "--num-records",
        str(case.records),
        "--group",
        f"bench-ceiling-{uuid.uuid4().hex[:8]}",
        "--timeout",
        "60000",
    ]
    produce = [
        *tools,
        "org.apache.kafka.tools.ProducerPerformance",
        "--bootstrap-server",
        bench.target.bootstrap_servers,
        "--command-config",
        str(bench.java_client_file(bench.target)),
        "--topic",
        target_topic,
        "--num-records",
        str(case.records),
        "--record-size",
        str(case.record_bytes),  # no key: the value carries the key's bytes too
        "--throughput",
        "-1",
    ]
    return [
        Launch("consumer-perf", consume, exits=True, exit_ends_work=True),
        Launch("producer-perf", produce, exits=True),
    ]


def run_system(bench: Bench, case: Case, system: str, run_no: int) -> RunResult:
    if system == "mirrorflow" and not MIRROR_JOB.exists():
        result = RunResult(case.name, system, run_no, case.records, case.record_bytes)
        result.skipped = f"{MIRROR_JOB.relative_to(REPO)} does not exist yet"
        return result
    reset_clusters(bench)
    time.sleep(bench.args.settle)
    if system == "ceiling":
        target_topic = f"ceiling.{case.topic}"
        launches = ceiling_launches(bench, case, target_topic)
    else:
        target_topic = f"{SOURCE}.{case.topic}"  # MirrorMaker 2's DefaultReplicationPolicy
        if system == "mm2":
            launches = mm2_launches(bench, case)
        else:
            launches = mirrorflow_launches(bench, case, run_no)
    result = measure(bench, case, system, run_no, launches, target_topic)
    verify_started = time.monotonic()
    if system == "ceiling":
        # The producer perf tool spreads records over partitions its own way: totals only.
        result.verification = verify_counts(bench, case, target_topic, per_partition=False)
        result.verification["consumer_perf_records"] = consumer_perf_records(result)
        for run_log in result.logs:
            tail = Path(run_log).read_text(errors="replace").strip().splitlines()[-2:]
            result.tool_output[Path(run_log).stem] = "\n".join(tail)
        consumed = result.verification["consumer_perf_records"]
        if consumed is None or consumed < case.records:
            result.verification["ok"] = False
            result.verification["status"] += f"; consumer-perf read only {consumed}"
    elif bench.args.verify == "full":
        result.verification = verify_full(bench, case, target_topic)
    else:
        result.verification = verify_counts(bench, case, target_topic)
    result.verification["seconds"] = round(time.monotonic() - verify_started, 1)
    result.records_on_target = result.verification.get("records_read")
    result.ok = not result.problems and result.verification.get("ok", False)
    return result


def consumer_perf_records(result: RunResult) -> int | None:
    """``data.consumed.in.nMsg`` from ConsumerPerformance's summary line."""
    path = next((p for p in result.logs if p.endswith("consumer-perf.log")), None)
    if path is None:
        return None
    lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln.count(",") > 4]
    header = next((ln for ln in lines if "nMsg" in ln), None)
    if header is None:
        return None
    names = [c.strip() for c in header.split(",")]
    rows = [ln for ln in lines if ln is not header and ln.split(",")[0].strip()[:1].isdigit()]
    if not rows or "data.consumed.in.nMsg" not in names:
        return None
    return int(rows[-1].split(",")[names.index("data.consumed.in.nMsg")].strip())


# --------------------------------------------------------------------------------------------
# Reporting


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def table(results: list[RunResult]) -> str:
    columns = [
        ("case", 6, lambda r: r.case),
        ("system", 10, lambda r: r.system),
        ("records", 10, lambda r: fmt(r.records)),
        ("wall s", 7, lambda r: fmt(r.wall_s, 1)),
        ("rec/s", 9, lambda r: fmt(r.rate("records_per_s"))),
        ("MiB/s", 7, lambda r: fmt(r.rate("mib_per_s"), 1)),
        ("CPU s", 7, lambda r: fmt(r.cpu_s, 1) + ("" if r.cpu_exact else "~")),
        ("rec/CPU-s", 10, lambda r: fmt(r.rate("records_per_cpu_s"))),
        ("copy rec/s", 10, lambda r: fmt(r.rate("copy_records_per_s"))),
        ("copy rec/CPU-s", 14, lambda r: fmt(r.rate("copy_records_per_cpu_s"))),
        ("peak RSS MiB", 12, lambda r: fmt(r.peak_rss_bytes / MIB if r.peak_rss_bytes else None)),
        ("broker CPU s", 12, lambda r: fmt(sum(r.broker_cpu_s.values()), 1)),
        ("other CPU s", 11, lambda r: fmt(r.other_cpu_s, 1)),
        ("check", 0, check_text),
    ]
    lines = ["  ".join(f"{name:>{width}}" for name, width, _ in columns)]
    for result in results:
        if result.skipped:
            lines.append(f"{result.case:>6}  {result.system:>10}  skipped: {result.skipped}")
            continue
        lines.append("  ".join(f"{get(result):>{width}}" for _, width, get in columns))
    return "\n".join(lines)


def check_text(result: RunResult) -> str:
    status = result.verification.get("status", "not verified")
    if result.problems:
        status += " | " + "; ".join(result.problems)
    return ("ok: " if result.ok else "FAILED: ") + status


def contention_text(results: list[RunResult], threshold: float = 0.1) -> str:
    noisy = [
        f"{r.case}/{r.system} (run {r.run}): {r.other_cpu_s:.0f} CPU-s, "
        f"{r.other_cpu_share:.0%} of the machine"
        for r in results
        if r.other_cpu_share is not None and r.other_cpu_share > threshold
    ]
    if not noisy:
        return ""
    return (
        "WARNING: other processes used the CPU during these runs; their wall times and rates "
        "are pessimistic and CPU figures less reliable:\n  " + "\n  ".join(noisy)
    )


def median_rate(results: list[RunResult], case: str, system: str, what: str) -> float | None:
    values = [
        r.rate(what)
        for r in results
        if r.case == case and r.system == system and r.ok and r.rate(what) is not None
    ]
    return statistics.median(values) if values else None


def ratios(results: list[RunResult], cases: list[Case]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for case in cases:
        entry: dict[str, Any] = {}
        for what in (
            "records_per_s",
            "records_per_cpu_s",
            "copy_records_per_s",
            "copy_records_per_cpu_s",
        ):
            mf = median_rate(results, case.name, "mirrorflow", what)
            mm2 = median_rate(results, case.name, "mm2", what)
            ceiling = median_rate(results, case.name, "ceiling", what)
            entry[f"mirrorflow/mm2 {what}"] = round(mf / mm2, 3) if mf and mm2 else None
            entry[f"mm2/ceiling {what}"] = round(mm2 / ceiling, 3) if mm2 and ceiling else None
            entry[f"mirrorflow/ceiling {what}"] = round(mf / ceiling, 3) if mf and ceiling else None
        found[case.name] = entry
    return found


def ratio_text(found: dict[str, dict[str, Any]]) -> str:
    lines = []
    for case, entry in found.items():
        for who in ("mirrorflow/mm2", "mm2/ceiling", "mirrorflow/ceiling"):
            rps, rpc = entry[f"{who} records_per_s"], entry[f"{who} records_per_cpu_s"]
            crps, crpc = entry[f"{who} copy_records_per_s"], entry[f"{who} copy_records_per_cpu_s"]
            if rps is None and rpc is None:
                continue
            line = (
                f"{case:>6}  {who:<18}  records/s {fmt(rps, 2)}x   "
                f"records/CPU-s {fmt(rpc, 2)}x   (copy window: {fmt(crps, 2)}x, {fmt(crpc, 2)}x)"
            )
            if who == "mirrorflow/mm2" and rpc is not None:
                line += "   goal >= 1.5x records/CPU-s: " + ("met" if rpc >= 1.5 else "NOT met")
            lines.append(line)
    if not lines:
        return "no ratios: a system was skipped or failed (ratios use verified runs only)"
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    def run(*cmd: str) -> str:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=30)
            return (done.stdout + done.stderr).strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    meminfo = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu_model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if "model name" in ln), "")
    job_sha = hashlib.sha256(MIRROR_JOB.read_bytes()).hexdigest() if MIRROR_JOB.exists() else None
    import pyspark

    kafka_jars = Path(jvm.classpath("kafka").rstrip("*")).glob("kafka-clients-*.jar")
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_kib": int(meminfo[1]),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": run("java", "-version").splitlines()[0:1],
        "pyspark": pyspark.__version__,
        "kafka_clients": [p.name for p in kafka_jars],
        "git_commit": run("git", "rev-parse", "HEAD"),
        "git_dirty": run("git", "status", "--porcelain", "--", "spark_jobs", "mirrorflow"),
        "mirror_job_sha256": job_sha,
        "load_average_start": os.getloadavg(),
    }


# --------------------------------------------------------------------------------------------
# Main


def add_system_arguments(
    parser: argparse.ArgumentParser, group: Any, *, tasks: int, tasks_help: str
) -> None:
    """How MirrorMaker 2 and mirrorflow run: options every benchmark shares."""
    group.add_argument("--tasks", type=int, default=tasks, help=tasks_help)
    group.add_argument(
        "--flow-prop",
        action="append",
        default=[],
        type=lambda s: tuple(s.split("=", 1)) if "=" in s else parser.error(f"not k=v: {s}"),
        metavar="KEY=VALUE",
        help="extra line for the mm2.properties both systems read (repeatable)",
    )
    group.add_argument("--spark-master", default="local[*]")
    group.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    group.add_argument("--mm2-log-level", default="INFO")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    data = parser.add_argument_group("data set")
    data.add_argument("--records", type=int, default=2_000_000, help="large case (0: skip it)")
    data.add_argument("--record-size", type=int, default=1024, help="large case, value bytes")
    data.add_argument("--partitions", type=int, default=8)
    data.add_argument(
        "--small-records", type=int, default=5_000_000, help="small case (0: skip it)"
    )
    data.add_argument("--small-record-size", type=int, default=100, help="small case, value bytes")
    data.add_argument("--headers", action="store_true", help="give every record one header")
    runs = parser.add_argument_group("runs")
    runs.add_argument(
        "--only",
        default=",".join(SYSTEMS),
        help=f"systems to run, in this order (default {','.join(SYSTEMS)})",
    )
    runs.add_argument("--repeat", type=int, default=1, help="runs per system (ratios: medians)")
    add_system_arguments(parser, runs, tasks=os.cpu_count() or 2, tasks_help="tasks.max")
    runs.add_argument("--verify", choices=("full", "offsets"), default="full")
    limits = parser.add_argument_group("limits and sampling")
    limits.add_argument("--sample-interval", type=float, default=0.25, help="seconds")
    limits.add_argument("--settle", type=float, default=3.0, help="idle seconds before a run")
    limits.add_argument("--startup-timeout", type=float, default=300.0)
    limits.add_argument("--stall-timeout", type=float, default=120.0)
    limits.add_argument("--run-timeout", type=float, default=3600.0)
    limits.add_argument("--exit-grace", type=float, default=120.0)
    limits.add_argument("--stop-timeout", type=float, default=60.0)
    limits.add_argument("--no-pss", dest="pss", action="store_false", help="skip PSS sampling")
    where = parser.add_argument_group("where")
    where.add_argument("--broker-heap", default=sandbox_mod.DEFAULT_HEAP)
    where.add_argument("--workdir", type=Path, help="default: a new temporary directory")
    where.add_argument("--keep", action="store_true", help="keep the clusters' data and logs")
    where.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    for name, size in (
        ("--record-size", args.record_size),
        ("--small-record-size", args.small_record_size),
    ):
        if size < KEY_WIDTH:
            parser.error(f"{name} must be at least {KEY_WIDTH} (the value starts with the key)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [
        Case("large", args.records, args.record_size, args.partitions, args.headers),
        Case("small", args.small_records, args.small_record_size, args.partitions, args.headers),
    ]
    cases = [c for c in cases if c.records > 0]
    load1 = os.getloadavg()[0]
    if load1 > 1.5:
        log(f"WARNING: load average is {load1:.2f}: other work on this machine will skew figures")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mirrorflow-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    sandbox_dir = workdir / "sandbox"
    started = dt.datetime.now(dt.UTC)
    env = environment()
    results: list[RunResult] = []
    loads: dict[str, Any] = {}
    failed = False
    try:
        log(f"starting clusters {SOURCE}, {TARGET} in {sandbox_dir}")
        base_port = sandbox_mod.free_port_block(2 * sandbox_mod.PORTS_PER_CLUSTER)
        box = sandbox_mod.up([SOURCE, TARGET], sandbox_dir, base_port, heap=args.broker_heap)
        bench = Bench(args, workdir, box)
        for case in cases:
            reset_clusters(bench)
            log(
                f"[{case.name}] loading {case.records:,} records of {case.record_bytes} bytes "
                f"into {SOURCE}/{case.topic} ({case.partitions} partitions)"
            )
            loads[case.name] = load_case(bench, case)
            log(f"[{case.name}] loaded in {loads[case.name]['seconds']}s")
            for run_no in range(1, args.repeat + 1):
                for system in args.systems:
                    log(f"[{case.name}] {system} (run {run_no})")
                    result = run_system(bench, case, system, run_no)
                    results.append(result)
                    failed |= not result.ok and not result.skipped
                    log(table([result]).splitlines()[1])
                    if not result.ok and not result.skipped:
                        log(f"!!! [{case.name}] {system}: {check_text(result)}")
    except KeyboardInterrupt:
        failed = True
        log("interrupted")
    finally:
        for run in list(LIVE):
            stop([run], 10.0)
        with contextlib.suppress(Exception):
            sandbox_mod.down(sandbox_dir)
        if not args.keep:
            shutil.rmtree(sandbox_dir, ignore_errors=True)

    found = ratios(results, cases)
    env["load_average_end"] = os.getloadavg()
    report = {
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "arguments": {k: v for k, v in vars(args).items() if k not in ("workdir", "results_dir")},
        "cases": [asdict(c) | {"topic": c.topic, "record_bytes": c.record_bytes} for c in cases],
        "environment": env,
        "loads": loads,
        "results": [r.to_json() for r in results],
        "ratios": found,
        "all_verified": not failed,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")

    print()
    print(table(results))
    print()
    print(ratio_text(found))
    print()
    if noise := contention_text(results):
        print(noise)
        print()
    print(f"results: {out}")
    if failed or args.keep:
        print(f"logs: {workdir / 'logs'}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if failed:
        print("\n!!! AT LEAST ONE RUN FAILED OR LOST DATA: see 'check' above !!!")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
