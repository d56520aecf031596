#!/usr/bin/env python
"""Latency benchmark: how long a record takes from its source to a consumer of its copy, under a
steady load, for MirrorMaker 2 and mirrorflow (at-least-once, default settings).

    python benchmarks/latency.py [--rate-mb 10 --record-size 1024 --seconds 60 --warmup 10]
                                 [--only mm2,mirrorflow]

On one flow ``bench-a->bench-b`` (two sandbox clusters) each system in turn is started and waits
until it copies a probe record; then a paced producer writes ``--rate-mb`` MiB/s of records to
``bench-a`` for ``--seconds`` while a consumer on ``bench-b`` reads the copies. A record's latency
is the wall-clock time the consumer reads it minus its source CreateTime; records created in the
first ``--warmup`` seconds are left out. Reported: p50/p99/max, the CPU cores the system used
during the measured window, and whether every record arrived. See benchmarks/README.md
("Latency").
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition  # noqa: E402

from benchmarks import replicate, steady  # noqa: E402
from benchmarks.replicate import FLOW, MIB, SOURCE, TARGET, Bench, Case, fmt, log  # noqa: E402

# mirrorflow with its defaults (continuous copying once caught up), with ``--no-continuous``,
# and exactly once (the target's ``exactly.once.source.support = enabled``; its copies read
# with ``isolation.level = read_committed``, as they become visible)
SYSTEMS = ("mm2", "mirrorflow", "mirrorflow-batches", "mirrorflow-eos")
EXACTLY_ONCE_LINES = [
    f"{TARGET}.exactly.once.source.support = enabled",
    f"{SOURCE}.consumer.isolation.level = read_committed",
]
# Each value starts with the record's index and its CreateTime (ms), then random bytes.
RECORD_HEAD = struct.Struct(">qq")


@dataclass
class LatencyResult:
    system: str
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    startup_s: float | None = None
    target_rate: float | None = None  # records/s asked for
    produced: int = 0
    produced_rate: float | None = None  # records/s actually produced
    pacing_dropped: int = 0  # records the producer fell behind on (token bucket overflow)
    received: int = 0  # distinct records read on the target
    duplicates: int = 0
    missing: int = 0
    timestamp_changed: int = 0  # copies whose timestamp is not the source's CreateTime
    measured: int = 0  # records after the warm-up
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    max_ms: float | None = None
    mean_ms: float | None = None
    cores: float | None = None  # the system's tree, during the measured window
    window_s: float | None = None
    broker_cores: dict[str, float] = field(default_factory=dict)
    rss_bytes: int | None = None  # at the end of the load
    cpu_s: float | None = None  # whole tree, whole life
    record_bytes: int = 0  # value bytes

    def row(self) -> list[str]:
        mib_s = self.produced_rate * self.record_bytes / MIB if self.produced_rate else None
        return [
            self.system,
            fmt(self.produced_rate),
            fmt(mib_s, 1),
            fmt(self.measured),
            fmt(self.p50_ms, 1),
            fmt(self.p99_ms, 1),
            fmt(self.max_ms, 1),
            fmt(self.cores, 2),
            fmt(sum(self.broker_cores.values()) or None, 2),
            steady.mib(self.rss_bytes),
            ("ok" if self.ok else "FAILED: ") + "; ".join(self.problems),
        ]


HEADER = [
    "system",
    "rec/s",
    "MiB/s",
    "measured",
    "p50 ms",
    "p99 ms",
    "max ms",
    "CPU cores",
    "broker cores",
    "RSS MiB",
    "check",
]


@dataclass
class Latencies:
    """What the target's consumer saw: first arrivals only, latency of the measured ones."""

    measure_from_ms: int  # records created earlier are the warm-up
    seen: bytearray = field(default_factory=bytearray)
    received: int = 0
    duplicates: int = 0
    timestamp_changed: int = 0
    values_ms: list[float] = field(default_factory=list)

    def add(self, value: bytes, timestamp_ms: int, read_ms: float) -> None:
        if len(value) < RECORD_HEAD.size:  # a readiness probe
            return
        index, created_ms = RECORD_HEAD.unpack_from(value)
        if index >= len(self.seen):
            self.seen.extend(bytes(index - len(self.seen) + 65536))
        if self.seen[index]:
            self.duplicates += 1
            return
        self.seen[index] = 1
        self.received += 1
        self.timestamp_changed += timestamp_ms != created_ms
        if created_ms >= self.measure_from_ms:
            self.values_ms.append(read_ms - created_ms)

    def summary(self, result: LatencyResult) -> None:
        values = sorted(self.values_ms)
        result.received, result.duplicates = self.received, self.duplicates
        result.timestamp_changed, result.measured = self.timestamp_changed, len(values)
        for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
            setattr(result, f"{name}_ms", steady.percentile(values, q))
        result.max_ms = values[-1] if values else None
        result.mean_ms = sum(values) / len(values) if values else None


def target_consumer(bench: Bench, topic: str, committed: bool = False) -> Consumer:
    """A consumer of every partition of ``topic`` on the target, from the beginning, tuned to
    return records as soon as they are there (``committed``: once their transaction is)."""
    consumer = Consumer(
        {
            **bench.target.client_config(),
            "group.id": f"bench-latency-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
            "fetch.min.bytes": 1,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    meta = bench.admin(bench.target).list_topics(topic=topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)])
    return consumer


def system_launches(
    bench: Bench, case: Case, system: str
) -> tuple[list[replicate.Launch], list[Path]]:
    if system == "mm2":
        return replicate.mm2_launches(bench, case), []
    state = bench.workdir / "state" / f"latency-{system}"
    stop = state / "stop"
    config = replicate.flow_file(bench, case)
    if system == "mirrorflow-eos":
        with config.open("a") as lines:
            lines.write("".join(f"{line}\n" for line in EXACTLY_ONCE_LINES))
    options = {"continuous": False} if system == "mirrorflow-batches" else {}
    launch = replicate.mirrorflow_launch(
        bench, [config], FLOW, state, name=system, stop_file=stop, **options
    )
    return [launch], [stop]


def run_system(bench: Bench, case: Case, system: str) -> LatencyResult:
    args = bench.args
    rate = args.rate_mb * MIB / case.record_size
    result = LatencyResult(system, target_rate=round(rate), record_bytes=case.record_size)
    steady.reset_topics(bench, [bench.source, bench.target])
    replicate.create_topic(bench.admin(bench.source), case.topic, case.partitions)
    time.sleep(args.settle)
    launches, stop_files = system_launches(bench, case, system)
    system_run = steady.System.launch(bench, system, launches, f"latency-{system}", stop_files)
    remote = f"{SOURCE}.{case.topic}"  # MirrorMaker 2's DefaultReplicationPolicy
    probe = steady.Probe(bench.source, case.topic, case.partitions, bench.target, remote)
    consumer = None
    try:
        try:
            steady.wait_ready(bench, system_run, [probe], args.startup_timeout, 0.5)
        except steady.NotReady as exc:
            result.problems.append(f"not ready: {exc}")
            return result
        result.startup_s = round(time.monotonic() - system_run.t0, 1)
        log(f"    ready after {result.startup_s}s; {rate:,.0f} records/s for {args.seconds:.0f}s")
        consumer = target_consumer(bench, remote, committed=system == "mirrorflow-eos")
        pool = os.urandom(case.record_size + 4096)
        body = case.record_size - RECORD_HEAD.size

        def make_value(index: int, create_ms: int) -> bytes:
            offset = index % 4096
            return RECORD_HEAD.pack(index, create_ms) + pool[offset : offset + body]

        sink = steady.Sink(bench.source, case.topic, case.partitions)
        load = steady.PacedLoad([sink], rate, args.seconds, make_value)
        load.start()
        while load.started_wall is None and load.is_alive():
            time.sleep(0.001)
        seen = Latencies(int(((load.started_wall or time.time()) + args.warmup) * 1000))
        consume(bench, system_run, consumer, load, seen, result)
        seen.summary(result)
        result.produced, result.pacing_dropped = sink.delivered, int(load.bucket.dropped)
        result.produced_rate = sink.sent / load.produced_s if load.produced_s else None
        result.missing = max(0, sink.delivered - result.received)
        if result.missing:
            result.problems.append(
                f"{result.missing} of {sink.delivered} records not on the target "
                f"{args.drain_timeout:.0f}s after the load"
            )
        if load.error or load.undelivered or sink.failed:
            result.problems.append(f"load: {load.error or 'records not delivered to the source'}")
        if result.timestamp_changed:
            result.problems.append(f"{result.timestamp_changed} copies lost their CreateTime")
    finally:
        if consumer is not None:
            consumer.close()
        result.problems += system_run.end(args.stop_timeout)
        result.cpu_s = system_run.cpu_s()
    result.ok = not result.problems
    return result


def consume(
    bench: Bench,
    system_run: steady.System,
    consumer: Consumer,
    load: steady.PacedLoad,
    seen: Latencies,
    result: LatencyResult,
) -> None:
    """Read the copies until every produced record is there (or ``--drain-timeout`` after the
    load); sample the system's CPU when the warm-up ends and when the load ends."""
    args = bench.args
    t_measure = (load.started_t or time.monotonic()) + args.warmup
    first = last = None
    brokers0: dict[str, float] = {}
    drain_until = None
    while True:
        # What is already fetched, without waiting; else wait for the next record. (A blocking
        # consume(n, timeout) would wait for n records or the whole timeout, adding latency.)
        messages = consumer.consume(1000, timeout=0) or [consumer.poll(0.05)]
        read_ms = time.time() * 1000
        for msg in messages:
            if msg is None:
                continue
            if msg.error():
                if msg.error().fatal():
                    raise KafkaException(msg.error())
                log(f"    (consumer: {msg.error()})")
                continue
            seen.add(msg.value(), msg.timestamp()[1], read_ms)
        now = time.monotonic()
        if first is None and now >= t_measure:
            first, brokers0 = system_run.sample(), replicate.broker_cpu(bench)
        if drain_until is None and load.done_producing.is_set():
            last = system_run.sample()
            brokers1 = replicate.broker_cpu(bench)
            result.rss_bytes = last.rss_bytes
            if first is not None and last.t > first.t:
                result.window_s = round(last.t - first.t, 1)
                result.cores = (last.cpu_s - first.cpu_s) / (last.t - first.t)
                result.broker_cores = {
                    k: round((brokers1[k] - brokers0[k]) / (last.t - first.t), 3) for k in brokers0
                }
            drain_until = now + args.drain_timeout
            log(f"    load done; draining (up to {args.drain_timeout:.0f}s)")
        everything = seen.received >= load.sinks[0].delivered
        if drain_until is not None and not load.is_alive() and (everything or now > drain_until):
            return
        if exited := system_run.exited():
            result.problems += exited
            return


# --------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    what = parser.add_argument_group("load")
    what.add_argument("--rate-mb", type=float, default=10.0, help="MiB/s of records (values)")
    what.add_argument("--record-size", type=int, default=1024, help="value bytes")
    what.add_argument("--partitions", type=int, default=4)
    what.add_argument("--seconds", type=float, default=60.0, help="load duration, warm-up included")
    what.add_argument("--warmup", type=float, default=10.0, help="first seconds not measured")
    what.add_argument(
        "--drain-timeout", type=float, default=60.0, help="seconds to wait for late copies"
    )
    what.add_argument(
        "--only",
        default="mm2,mirrorflow",
        help=f"systems, in order (default mm2,mirrorflow; of {', '.join(SYSTEMS)})",
    )
    steady.add_common_arguments(parser, broker_heap=replicate.sandbox_mod.DEFAULT_HEAP)
    args = parser.parse_args(argv)
    args.systems = steady.systems_option(parser, args.only, SYSTEMS)
    if args.record_size < RECORD_HEAD.size:
        parser.error(f"--record-size must be at least {RECORD_HEAD.size}")
    if args.warmup >= args.seconds:
        parser.error("--warmup must be shorter than --seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.setswitchinterval(0.0005)  # the producer thread must not hold the consumer up for 5 ms
    session = steady.Session.begin("latency", args)
    case = Case("latency", 0, args.record_size, args.partitions, headers=False)
    results: list[LatencyResult] = []
    failed = False
    try:
        directory = session.workdir / "sandbox"
        with steady.sandbox([SOURCE, TARGET], directory, args.broker_heap, args.keep) as box:
            bench = Bench(args, session.workdir, box)
            for system in args.systems:
                log(f"[latency] {system}: {FLOW}, topic {case.topic}")
                try:
                    result = run_system(bench, case, system)
                except Exception as exc:  # the other systems' figures still count
                    log(traceback.format_exc())
                    result = LatencyResult(system, problems=[f"{type(exc).__name__}: {exc}"])
                results.append(result)
                failed |= not result.ok
                log("    " + " | ".join(result.row()))
    except KeyboardInterrupt:
        failed = True
        log("interrupted")
    return session.finish(HEADER, results, failed, flow=FLOW, topic=case.topic)


if __name__ == "__main__":
    sys.exit(main())
