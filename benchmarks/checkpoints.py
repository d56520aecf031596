#!/usr/bin/env python
"""Checkpoint benchmark: how soon a consumer group's commit on the source is checkpointed on the
target, and how large the offset map (exact translation's state) grows per partition.

    python benchmarks/checkpoints.py [--interval 5 --duration 180 --rate 200]
                                     [--records 1000000 --txn-size 100] [--exactly-once]
                                     [--only latency,state]

Two parts, each on a fresh flow ``bench-a->bench-b`` between two sandbox clusters the script
starts, with the real mirror job (``mirrorflow.runtime.launch.mirror_command``):

``latency``: a paced producer writes ``--rate`` records/s to a 2-partition source topic; a member
of a consumer group on the source reads them and commits synchronously every
``--commit-interval`` seconds; the mirror job emits checkpoints every ``--interval`` seconds.
A reader tails ``bench-a.checkpoints.internal`` on the target. A commit's latency is the append
time of the first checkpoint of its partition whose upstream offset is at or past the committed
offset, minus the wall-clock time the synchronous commit returned (also reported with the reader's
receive time instead of the append time).

``state``: ``--records`` records go to a 1-partition source topic in transactions of
``--txn-size`` records, every 10th transaction aborted; the mirror job copies them with
``read_committed`` (``--exactly-once`` adds exactly-once delivery). Then the offset-map topic
``mirrorflow-offset-map.bench-a.internal`` is read to its end: its live keys (runs) for the
partition, their bytes, the records written in all, and the topic's size in the broker's log
directory. See benchmarks/README.md ("Checkpoints").
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))

from confluent_kafka import (  # noqa: E402
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import NewTopic  # noqa: E402

from benchmarks import replicate, steady  # noqa: E402
from benchmarks.replicate import FLOW, SOURCE, TARGET, Bench, fmt, log  # noqa: E402
from mirrorflow.mm2.formats import Checkpoint  # noqa: E402
from mirrorflow.paths import write_private  # noqa: E402
from mirrorflow.replication import offset_map  # noqa: E402

PARTS = ("latency", "state")
CHECKPOINTS_TOPIC = f"{SOURCE}.checkpoints.internal"  # MirrorMaker 2's DefaultReplicationPolicy
MAP_TOPIC = offset_map.map_topic(SOURCE)
LATENCY_TOPIC = "bench-checkpoints"
STATE_TOPIC = "bench-txn"
ABORT_EVERY = 10  # every 10th transaction is aborted


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class LatencyResult:
    part: str = "latency"
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    interval_s: float = 0.0
    startup_s: float | None = None
    produced: int = 0
    commits: int = 0  # synchronous commits that moved a partition, in the measured window
    commits_not_moved: int = 0  # commits of a partition that had not advanced (not measured)
    unmatched: int = 0  # measured commits no checkpoint covered before the drain ended
    commit_call_ms_p50: float | None = None  # how long a synchronous commit() took
    checkpoints: int = 0  # checkpoints of the group read on the target
    checkpoint_gap_s_p50: float | None = None  # between successive checkpoints of a partition
    checkpoint_gap_s_max: float | None = None
    timestamp_type: str | None = None  # of the checkpoint records (LogAppendTime expected)
    # latency, append time of the checkpoint record - return of the commit
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    min_ms: float | None = None
    mean_ms: float | None = None
    # the same with the time the benchmark's reader received the checkpoint
    recv_p50_ms: float | None = None
    recv_p90_ms: float | None = None
    recv_p99_ms: float | None = None
    recv_max_ms: float | None = None
    cores: float | None = None  # the mirror job's tree, over the measured window
    broker_cores: dict[str, float] = field(default_factory=dict)
    load_average: list[float] = field(default_factory=list)  # at the end of the window
    cpu_s: float | None = None  # the mirror job's tree, whole life

    def row(self) -> list[str]:
        return [
            f"{self.interval_s:g}",
            fmt(self.commits),
            fmt(self.p50_ms),
            fmt(self.p90_ms),
            fmt(self.p99_ms),
            fmt(self.max_ms),
            fmt(self.recv_p50_ms),
            fmt(self.recv_p99_ms),
            fmt(self.checkpoint_gap_s_p50, 2),
            fmt(self.cores, 2),
            ", ".join(f"{x:.2f}" for x in self.load_average),
            ("ok" if self.ok else "FAILED: ") + "; ".join(self.problems),
        ]


LATENCY_HEADER = [
    "interval s",
    "commits",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "max ms",
    "recv p50 ms",
    "recv p99 ms",
    "ckpt gap s",
    "job cores",
    "load avg",
    "check",
]


@dataclass
class StateResult:
    part: str = "state"
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    mode: str = "at-least-once"
    mirrored: str = "after"  # the job copied the records "after" or "while" they were produced
    records: int = 0  # written to the source, aborted ones included
    committed_records: int = 0
    transactions: int = 0
    aborted_transactions: int = 0
    source_end_offset: int | None = None  # records + one marker per transaction
    produce_s: float | None = None
    copy_s: float | None = None  # job launch -> the map covers every committed record
    runs: int = 0  # live keys of the map for the source partition
    run_records_count: int = 0  # sum of the runs' counts: records copied
    live_bytes: int = 0  # key + value bytes of the live records
    key_bytes: int = 0
    value_bytes: int = 0
    map_end_offset: int | None = None  # offsets used in all: records written (+ markers)
    map_records_present: int = 0  # records still in the topic when read (before compaction)
    map_log_bytes: int | None = None  # *.log files of the topic's partition directory
    map_disk_bytes: int | None = None  # blocks allocated to the directory's files
    map_segments: int | None = None
    source_log_bytes: int | None = None  # for scale: the source partition's *.log files
    target_log_bytes: int | None = None  # the remote topic's
    cpu_s: float | None = None  # the mirror job's tree, whole life
    load_average: list[float] = field(default_factory=list)  # when the copy was done

    def row(self) -> list[str]:
        return [
            f"{self.mode}, {self.mirrored}",
            fmt(self.records),
            fmt(self.committed_records),
            fmt(self.runs),
            fmt(self.live_bytes),
            fmt(self.live_bytes / self.runs if self.runs else None, 1),
            fmt(self.map_end_offset),
            fmt(self.map_log_bytes),
            fmt(self.map_disk_bytes),
            fmt(self.copy_s, 1),
            ", ".join(f"{x:.2f}" for x in self.load_average),
            ("ok" if self.ok else "FAILED: ") + "; ".join(self.problems),
        ]


STATE_HEADER = [
    "mode, mirrored",
    "records",
    "committed",
    "runs",
    "live bytes",
    "bytes/run",
    "map records written",
    "map log bytes",
    "map disk bytes",
    "copy s",
    "load avg",
    "check",
]


# --------------------------------------------------------------------------------------------
# Shared set-up


def flow_file(bench: Bench, name: str, topic: str, *lines: str) -> Path:
    """An mm2.properties with the flow of ``topic`` and the extra ``lines`` (then --flow-prop)."""
    extra = [*lines, *(f"{k.strip()} = {v.strip()}" for k, v in bench.args.flow_prop)]
    text = [
        "# Written by benchmarks/checkpoints.py.",
        *replicate.mm2_properties(
            [bench.source, bench.target],
            {FLOW: topic},
            [f"{TARGET}->{SOURCE}"],
            bench.args.tasks,
            [],
        ),
        *extra,
    ]
    path = bench.workdir / f"{name}.mm2.properties"
    write_private(path, "\n".join(text) + "\n")
    return path


def launch_mirror(bench: Bench, name: str, config: Path) -> steady.System:
    state = bench.workdir / "state" / name
    stop = state / "stop"
    launch = replicate.mirrorflow_launch(bench, [config], FLOW, state, stop_file=stop)
    return steady.System.launch(bench, "mirrorflow", [launch], name, [stop])


def partition_dir(cluster: Any, topic: str, partition: int) -> Path:
    """The broker's log directory of one partition (the sandbox's ``log.dirs``)."""
    return Path(cluster.directory) / "kraft-logs" / f"{topic}-{partition}"


def log_sizes(directory: Path) -> tuple[int | None, int | None, int | None]:
    """Bytes of the ``*.log`` segment files, blocks allocated to all files (the index files of
    the active segment are preallocated sparse files), and the number of segments."""
    if not directory.is_dir():
        return None, None, None
    files = [p for p in directory.iterdir() if p.is_file()]
    logs = [p for p in files if p.suffix == ".log"]
    allocated = sum(p.stat().st_blocks * 512 for p in files)
    return sum(p.stat().st_size for p in logs), allocated, len(logs)


def percentiles(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    found = {f"p{q}": steady.percentile(ordered, q) for q in (50, 90, 99)}
    found["max"] = ordered[-1] if ordered else None
    found["min"] = ordered[0] if ordered else None
    found["mean"] = sum(ordered) / len(ordered) if ordered else None
    return found


# --------------------------------------------------------------------------------------------
# Part 1: checkpoint latency


@dataclass
class Commit:
    wall_ms: float  # when the synchronous commit returned
    call_ms: float  # how long it took
    partition: int
    offset: int  # the committed offset: the next record the group reads


class Committer(threading.Thread):
    """A member of ``group`` (subscribed) that consumes ``topic`` and commits what it read,
    synchronously, every ``every`` seconds, until ``stop`` is set."""

    def __init__(self, bench: Bench, topic: str, group: str, every: float) -> None:
        super().__init__(name="committer", daemon=True)
        self.every = every
        self.consumer = Consumer(
            {
                **bench.source.client_config(),
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.topic = topic
        self.commits: list[Commit] = []
        self.not_moved = 0
        self.consumed = 0
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported by the benchmark, not lost in a thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.consumer.close()

    def _run(self) -> None:
        self.consumer.subscribe([self.topic])
        read: dict[int, int] = {}  # partition -> next offset
        committed: dict[int, int] = {}
        next_commit = time.monotonic() + self.every
        while not self.stop.is_set():
            for msg in self.consumer.consume(1000, timeout=0.05):
                if msg.error() is None:
                    read[msg.partition()] = msg.offset() + 1
                    self.consumed += 1
                elif msg.error().fatal():
                    raise KafkaException(msg.error())
            if time.monotonic() < next_commit:
                continue
            next_commit += self.every
            moved = {p: o for p, o in read.items() if committed.get(p) != o}
            self.not_moved += len(read) - len(moved)
            if not moved:
                continue
            offsets = [TopicPartition(self.topic, p, o) for p, o in sorted(moved.items())]
            t0 = time.time()
            result = self.consumer.commit(offsets=offsets, asynchronous=False)
            t1 = time.time()
            for tp in result or []:
                if tp.error is not None:
                    raise KafkaException(tp.error)
            for p, o in moved.items():
                self.commits.append(Commit(t1 * 1000, (t1 - t0) * 1000, p, o))
                committed[p] = o


@dataclass
class SeenCheckpoint:
    upstream: int
    downstream: int
    append_ms: int  # the record's timestamp (LogAppendTime: the broker's append)
    recv_ms: float  # when the benchmark's reader got it


class CheckpointTail:
    """Reads ``bench-a.checkpoints.internal`` on the target from the beginning, keeping the
    checkpoints of one group and topic per partition, in order."""

    def __init__(self, bench: Bench, group: str, topic: str) -> None:
        self.group, self.topic = group, topic
        self.consumer = Consumer(
            {
                **bench.target.client_config(),
                "group.id": f"bench-checkpoint-tail-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                "fetch.min.bytes": 1,
            }
        )
        self.consumer.assign([TopicPartition(CHECKPOINTS_TOPIC, 0, OFFSET_BEGINNING)])
        self.seen: dict[int, list[SeenCheckpoint]] = {}
        self.timestamp_types: set[int] = set()
        self.skipped = 0

    def poll(self, timeout: float) -> None:
        messages = self.consumer.consume(1000, timeout=0) or [self.consumer.poll(timeout)]
        recv_ms = time.time() * 1000
        for msg in messages:
            if msg is None:
                continue
            if msg.error():
                code = msg.error().code()
                if code not in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                    log(f"    (checkpoint reader: {msg.error()})")
                continue
            try:
                checkpoint = Checkpoint.from_record(msg.key(), msg.value())
            except ValueError:
                self.skipped += 1
                continue
            if checkpoint.group != self.group or checkpoint.topic != self.topic:
                continue
            kind, ts = msg.timestamp()
            self.timestamp_types.add(kind)
            self.seen.setdefault(checkpoint.partition, []).append(
                SeenCheckpoint(
                    checkpoint.upstream_offset, checkpoint.downstream_offset, ts, recv_ms
                )
            )

    def covering(self, commit: Commit) -> SeenCheckpoint | None:
        """The first checkpoint of the commit's partition at or past its offset."""
        seen = self.seen.get(commit.partition, [])
        # Upstream offsets only grow here (the group never rewinds), so bisect.
        index = bisect_left([c.upstream for c in seen], commit.offset)
        return seen[index] if index < len(seen) else None

    def close(self) -> None:
        self.consumer.close()


def create_checkpoints_topic(bench: Bench) -> None:
    """The checkpoints topic as the mirror job would create it (one partition, compacted), but
    with LogAppendTime, so a checkpoint's timestamp is when the broker appended it. The job
    finds the topic there and leaves it as it is."""
    topic = NewTopic(
        CHECKPOINTS_TOPIC,
        1,
        1,
        config={"cleanup.policy": "compact", "message.timestamp.type": "LogAppendTime"},
    )
    admin = bench.admin(bench.target)  # kept until the future is done
    admin.create_topics([topic])[CHECKPOINTS_TOPIC].result(timeout=60)


def run_latency(bench: Bench) -> LatencyResult:
    args = bench.args
    result = LatencyResult(interval_s=args.interval)
    steady.reset_topics(bench, [bench.source, bench.target])
    replicate.create_topic(bench.admin(bench.source), LATENCY_TOPIC, 2)
    create_checkpoints_topic(bench)
    remote = f"{SOURCE}.{LATENCY_TOPIC}"
    group = f"bench-group-{uuid.uuid4().hex[:8]}"
    # The group exists (offsets 0) before the job starts: the job lists the groups at its
    # first checkpoint and then only every refresh.groups.interval.seconds (600 by default).
    creator = Consumer({**bench.source.client_config(), "group.id": group})
    creator.commit(
        offsets=[TopicPartition(LATENCY_TOPIC, p, 0) for p in (0, 1)], asynchronous=False
    )
    creator.close()
    config = flow_file(
        bench,
        "latency",
        LATENCY_TOPIC,
        f"{FLOW}.groups = {group}",
        f"emit.checkpoints.interval.seconds = {args.interval:g}",
    )
    time.sleep(args.settle)
    system = launch_mirror(bench, "checkpoints-latency", config)
    tail = committer = None
    try:
        probe = steady.Probe(bench.source, LATENCY_TOPIC, 2, bench.target, remote)
        try:
            steady.wait_ready(bench, system, [probe], args.startup_timeout, 0.5)
        except steady.NotReady as exc:
            result.problems.append(f"not ready: {exc}")
            return result
        result.startup_s = round(time.monotonic() - system.t0, 1)
        log(
            f"    ready after {result.startup_s}s; {args.rate:g} records/s, commits every "
            f"{args.commit_interval:g}s, checkpoints every {args.interval:g}s, "
            f"for {args.duration:.0f}s"
        )
        tail = CheckpointTail(bench, group, remote)
        committer = Committer(bench, LATENCY_TOPIC, group, args.commit_interval)
        sink = steady.Sink(bench.source, LATENCY_TOPIC, 2)
        body = os.urandom(args.record_size)
        load = steady.PacedLoad([sink], args.rate, args.duration, lambda _i, _ms: body)
        load.start()
        committer.start()
        t_start = time.monotonic()
        measure_from_ms = (time.time() + args.warmup) * 1000
        first = brokers0 = None
        while time.monotonic() < t_start + args.duration:
            tail.poll(0.05)
            if first is None and time.monotonic() >= t_start + args.warmup:
                first, brokers0 = system.sample(), replicate.broker_cpu(bench)
            if exited := system.exited():
                result.problems += exited
                return result
            if committer.error or not committer.is_alive():
                result.problems.append(f"committer: {committer.error or 'stopped'}")
                return result
        committer.stop.set()
        last, brokers1 = system.sample(), replicate.broker_cpu(bench)
        result.load_average = [round(x, 2) for x in os.getloadavg()]
        if first is not None and last.t > first.t:
            span = last.t - first.t
            result.cores = round((last.cpu_s - first.cpu_s) / span, 3)
            result.broker_cores = {
                k: round((brokers1[k] - brokers0[k]) / span, 3) for k in brokers0
            }
        committer.join(30)
        load.join(60)
        measured = [c for c in committer.commits if c.wall_ms >= measure_from_ms]
        drain = args.interval * 3 + 30
        log(f"    load done; waiting up to {drain:.0f}s for the last commits' checkpoints")
        deadline = time.monotonic() + drain
        while time.monotonic() < deadline and any(tail.covering(c) is None for c in measured):
            tail.poll(0.1)
            if exited := system.exited():
                result.problems += exited
                break
        summarize_latency(result, tail, committer, measured)
        result.produced = sink.delivered
        if load.error or load.undelivered or sink.failed:
            result.problems.append(f"load: {load.error or 'records not delivered to the source'}")
    finally:
        if committer is not None and committer.is_alive():
            committer.stop.set()
            committer.join(30)
        if tail is not None:
            tail.close()
        result.problems += system.end(args.stop_timeout)
        result.cpu_s = system.cpu_s()
    result.ok = not result.problems
    return result


def summarize_latency(
    result: LatencyResult, tail: CheckpointTail, committer: Committer, measured: list[Commit]
) -> None:
    by_append, by_recv = [], []
    for commit in measured:
        checkpoint = tail.covering(commit)
        if checkpoint is None:
            result.unmatched += 1
            continue
        by_append.append(checkpoint.append_ms - commit.wall_ms)
        by_recv.append(checkpoint.recv_ms - commit.wall_ms)
    result.commits, result.commits_not_moved = len(measured), committer.not_moved
    result.commit_call_ms_p50 = steady.percentile(sorted(c.call_ms for c in measured), 50)
    figures = percentiles(by_append)
    for name in ("p50", "p90", "p99", "max", "min", "mean"):
        value = figures[name]
        setattr(result, f"{name}_ms", round(value, 1) if value is not None else None)
    recv = percentiles(by_recv)
    for name in ("p50", "p90", "p99", "max"):
        value = recv[name]
        setattr(result, f"recv_{name}_ms", round(value, 1) if value is not None else None)
    gaps = []
    for seen in tail.seen.values():
        gaps += [(b.append_ms - a.append_ms) / 1000 for a, b in itertools.pairwise(seen)]
    result.checkpoints = sum(len(s) for s in tail.seen.values())
    gap = percentiles(gaps)
    result.checkpoint_gap_s_p50, result.checkpoint_gap_s_max = gap["p50"], gap["max"]
    kinds = {TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime"}
    result.timestamp_type = ",".join(
        sorted(kinds.get(k, f"type {k}") for k in tail.timestamp_types)
    )
    if result.timestamp_type != "LogAppendTime":
        result.problems.append(f"checkpoint timestamps are {result.timestamp_type or 'absent'}")
    if not measured:
        result.problems.append("no commit in the measured window")
    if result.unmatched:
        result.problems.append(f"{result.unmatched} of {len(measured)} commits never checkpointed")
    if result.min_ms is not None and result.min_ms < 0:
        result.problems.append(f"a checkpoint came {-result.min_ms:.0f} ms before its commit")


# --------------------------------------------------------------------------------------------
# Part 2: the offset map's size after transactions


@dataclass
class Transactions:
    """What the transactional producer wrote."""

    records: int = 0
    committed: int = 0
    transactions: int = 0
    aborted: int = 0
    last_committed_offset: int = -1
    seconds: float = 0.0


def produce_transactions(bench: Bench, topic: str, records: int, size: int, value_bytes: int):
    """``records`` records in transactions of ``size``, every ``ABORT_EVERY``-th aborted."""
    producer = Producer(
        {
            **bench.source.client_config(),
            "transactional.id": f"bench-txn-{uuid.uuid4().hex[:8]}",
            "linger.ms": 5,
            "compression.type": "none",
        }
    )
    producer.init_transactions(60)
    done = Transactions()
    offsets: list[int] = []
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            offsets.append(msg.offset())

    pool = os.urandom(value_bytes + 4096)
    t0 = time.monotonic()
    index = 0
    while index < records:
        count = min(size, records - index)
        abort = done.transactions % ABORT_EVERY == ABORT_EVERY - 1
        offsets.clear()
        producer.begin_transaction()
        for i in range(index, index + count):
            key = b"%012d" % i
            value = pool[i % 4096 : i % 4096 + value_bytes]
            while True:
                try:
                    producer.produce(topic, value, key, partition=0, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.01)
        if abort:
            producer.flush(60)  # so the aborted records are on the log, leaving their gap
            producer.abort_transaction(60)
            done.aborted += 1
        else:
            producer.commit_transaction(60)
            producer.poll(0)  # the delivery reports, if the commit did not serve them
            done.committed += count
            done.last_committed_offset = max(offsets, default=done.last_committed_offset)
        if failed:
            raise KafkaException(failed[0])
        done.transactions += 1
        index += count
        if done.transactions % 1000 == 0:
            log(f"    {done.transactions:,} transactions, {index:,} records")
    done.records = index
    done.seconds = time.monotonic() - t0
    return done


class MapReader:
    """Reads the offset-map topic on the target: the live record per key, and counts."""

    def __init__(self, bench: Bench) -> None:
        self.consumer = Consumer(
            {
                **bench.target.client_config(),
                "group.id": f"bench-map-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
        self.consumer.assign([TopicPartition(MAP_TOPIC, 0, OFFSET_BEGINNING)])
        self.live: dict[bytes, bytes] = {}
        self.present = 0  # records read (not compacted away)
        self.at_end = False

    def read(self, seconds: float) -> None:
        """Read what there is, for up to ``seconds``."""
        deadline = time.monotonic() + seconds
        self.at_end = False
        while time.monotonic() < deadline:
            messages = self.consumer.consume(10_000, timeout=0.2)
            for msg in messages:
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        self.at_end = True
                    continue
                self.at_end = False
                self.present += 1
                if msg.value() is None:
                    self.live.pop(msg.key(), None)
                else:
                    self.live[msg.key()] = msg.value()
            if self.at_end and not messages:
                return

    def partition_map(self, topic: str, partition: int) -> offset_map.PartitionMap:
        runs = offset_map.OffsetMap()
        for key, value in self.live.items():
            runs.load(key, value)
        return runs.partitions.get((topic, partition), offset_map.PartitionMap())

    def close(self) -> None:
        self.consumer.close()


def run_state(bench: Bench) -> StateResult:
    args = bench.args
    mode = "exactly-once" if args.exactly_once else "at-least-once"
    result = StateResult(mode=mode)
    result.mirrored = "while" if args.mirror_while_producing else "after"
    steady.reset_topics(bench, [bench.source, bench.target])
    replicate.create_topic(bench.admin(bench.source), STATE_TOPIC, 1)
    lines = [f"{SOURCE}.consumer.isolation.level = read_committed"]
    if args.exactly_once:
        lines.append(f"{TARGET}.exactly.once.source.support = enabled")
    config = flow_file(bench, "state", STATE_TOPIC, *lines)
    system = reader = None
    if args.mirror_while_producing:
        time.sleep(args.settle)
        system = launch_mirror(bench, "checkpoints-state", config)
    try:
        log(
            f"    {args.records:,} records in transactions of {args.txn_size} "
            f"(every {ABORT_EVERY}th aborted) to {STATE_TOPIC}"
            + (f", mirrored meanwhile ({mode})" if system else "")
        )
        txns = produce_transactions(
            bench, STATE_TOPIC, args.records, args.txn_size, args.record_size
        )
        result.records, result.committed_records = txns.records, txns.committed
        result.transactions, result.aborted_transactions = txns.transactions, txns.aborted
        result.produce_s = round(txns.seconds, 1)
        admin = bench.admin(bench.source)
        result.source_end_offset = replicate.partition_counts(admin, STATE_TOPIC)[0]
        log(f"    produced in {txns.seconds:.0f}s (end offset {result.source_end_offset:,})")
        if system is None:
            log(f"    mirroring ({mode})")
            time.sleep(args.settle)
            system = launch_mirror(bench, "checkpoints-state", config)
        deadline = time.monotonic() + args.copy_timeout
        while True:
            if exited := system.exited():
                result.problems += exited
                return result
            if time.monotonic() > deadline:
                result.problems.append(f"not copied after {args.copy_timeout:.0f}s")
                return result
            if reader is None:
                if MAP_TOPIC not in bench.admin(bench.target).list_topics(timeout=10).topics:
                    time.sleep(2.0)
                    continue
                reader = MapReader(bench)
            reader.read(5.0)
            runs = reader.partition_map(STATE_TOPIC, 0).runs
            copied = sum(r.count for r in runs)
            covered = runs and runs[-1].upstream_end >= txns.last_committed_offset + 1
            if covered and copied >= txns.committed:
                break
            time.sleep(2.0)
        result.copy_s = round(time.monotonic() - system.t0, 1)
        result.load_average = [round(x, 2) for x in os.getloadavg()]
        log(f"    copied {result.copy_s}s after the job's launch; stopping it, reading the map")
    finally:
        if system is not None:
            result.problems += system.end(args.stop_timeout)
            result.cpu_s = system.cpu_s()
        if reader is not None:
            reader.close()
    summarize_state(bench, result, txns)
    result.ok = not result.problems
    return result


def summarize_state(bench: Bench, result: StateResult, txns: Transactions) -> None:
    reader = MapReader(bench)
    try:
        reader.read(120.0)
        if not reader.at_end:
            result.problems.append(f"could not read {MAP_TOPIC} to its end")
    finally:
        reader.close()
    topic_keys = {
        k: v for k, v in reader.live.items() if offset_map.decode_key(k)[0] == (STATE_TOPIC, 0)
    }
    result.runs = len(topic_keys)
    result.key_bytes = sum(len(k) for k in topic_keys)
    result.value_bytes = sum(len(v) for v in topic_keys.values())
    result.live_bytes = result.key_bytes + result.value_bytes
    result.map_records_present = reader.present
    runs = reader.partition_map(STATE_TOPIC, 0).runs
    result.run_records_count = sum(r.count for r in runs)
    result.map_end_offset = replicate.partition_counts(bench.admin(bench.target), MAP_TOPIC)[0]
    result.map_log_bytes, result.map_disk_bytes, result.map_segments = log_sizes(
        partition_dir(bench.target, MAP_TOPIC, 0)
    )
    result.source_log_bytes = log_sizes(partition_dir(bench.source, STATE_TOPIC, 0))[0]
    result.target_log_bytes = log_sizes(partition_dir(bench.target, f"{SOURCE}.{STATE_TOPIC}", 0))[
        0
    ]
    if result.run_records_count != txns.committed:
        result.problems.append(
            f"the runs count {result.run_records_count:,} copies of {txns.committed:,} "
            "committed records"
        )
    if len(reader.live) != result.runs:
        result.problems.append(f"{len(reader.live) - result.runs} map keys of other partitions")


# --------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    lat = parser.add_argument_group("latency")
    lat.add_argument(
        "--interval", type=float, default=5.0, help="emit.checkpoints.interval.seconds (5)"
    )
    lat.add_argument("--duration", type=float, default=180.0, help="seconds of load (180)")
    lat.add_argument("--warmup", type=float, default=10.0, help="first seconds not measured (10)")
    lat.add_argument("--rate", type=float, default=200.0, help="records/s produced (200)")
    lat.add_argument(
        "--commit-interval", type=float, default=0.5, help="seconds between commits (0.5)"
    )
    st = parser.add_argument_group("state")
    st.add_argument("--records", type=int, default=1_000_000, help="records, aborted included")
    st.add_argument("--txn-size", type=int, default=100, help="records per transaction (100)")
    st.add_argument(
        "--exactly-once", action="store_true", help="target.exactly.once.source.support = enabled"
    )
    st.add_argument(
        "--mirror-while-producing",
        action="store_true",
        help="start the job before the transactions (default: after them)",
    )
    st.add_argument("--copy-timeout", type=float, default=1800.0)
    parser.add_argument("--record-size", type=int, default=100, help="value bytes (100)")
    parser.add_argument(
        "--only", default=",".join(PARTS), help=f"parts, in order (default {','.join(PARTS)})"
    )
    steady.add_common_arguments(parser, broker_heap=replicate.sandbox_mod.DEFAULT_HEAP)
    args = parser.parse_args(argv)
    args.parts = steady.systems_option(parser, args.only, PARTS)
    if args.warmup >= args.duration:
        parser.error("--warmup must be shorter than --duration")
    return args


def finish(
    args: argparse.Namespace,
    started: dt.datetime,
    workdir: Path,
    environment: dict[str, Any],
    results: list[Any],
    failed: bool,
) -> int:
    """Write the JSON report, print one table per part; the exit status."""
    environment["load_average_end"] = os.getloadavg()
    report = {
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "arguments": {k: v for k, v in vars(args).items() if k not in ("workdir", "results_dir")},
        "flow": FLOW,
        "environment": environment,
        "results": [asdict(r) for r in results],
        "all_verified": not failed,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"checkpoints-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    for header, kind in ((LATENCY_HEADER, LatencyResult), (STATE_HEADER, StateResult)):
        rows = [r.row() for r in results if isinstance(r, kind)]
        if rows:
            print()
            print(steady.markdown_table(header, rows))
    print()
    print(f"results: {out}")
    if failed or args.keep:
        print(f"logs: {workdir / 'logs'}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if failed:
        print("\n!!! AT LEAST ONE PART FAILED: see 'check' above !!!")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steady.busy_warning()
    started = dt.datetime.now(dt.UTC)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mirrorflow-checkpoints-"))
    workdir.mkdir(parents=True, exist_ok=True)
    environment = replicate.environment()
    results: list[Any] = []
    failed = False
    runners = {"latency": (run_latency, LatencyResult), "state": (run_state, StateResult)}
    try:
        directory = workdir / "sandbox"
        with steady.sandbox([SOURCE, TARGET], directory, args.broker_heap, args.keep) as box:
            bench = Bench(args, workdir, box)
            for part in args.parts:
                run, kind = runners[part]
                log(f"[checkpoints] {part}: {FLOW}")
                try:
                    result = run(bench)
                except Exception as exc:  # the other part's figures still count
                    log(traceback.format_exc())
                    result = kind(problems=[f"{type(exc).__name__}: {exc}"])
                results.append(result)
                failed |= not result.ok
                log("    " + " | ".join(result.row()))
    except KeyboardInterrupt:
        failed = True
        log("interrupted")
    return finish(args, started, workdir, environment, results, failed)


if __name__ == "__main__":
    sys.exit(main())
