"""Pieces shared by the long-running benchmarks (``scale.py``, ``latency.py``).

Unlike ``replicate.py``, where a system copies a fixed data set and stops, these run a system
continuously: start it, wait until it copies a probe record on every flow, feed it a paced load
(:class:`PacedLoad`, a token bucket in a thread), sample its process tree, then stop it. Starting,
stopping and sampling reuse ``replicate.py``'s helpers (the reaping wrapper, :func:`start`,
:func:`stop`) and ``procstats.TreeSampler``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from benchmarks import procstats, replicate
from benchmarks.replicate import MIB, Bench, Launch, Running, log
from mirrorflow.devtools import sandbox as sandbox_mod

PROBE = b"probe"  # the value of a readiness probe record (shorter than any load record)


# --------------------------------------------------------------------------------------------
# Pure arithmetic


@dataclass
class TokenBucket:
    """``rate`` tokens per second, at most ``capacity`` saved up; tokens beyond are dropped
    (counted in ``dropped``): a sender that falls behind does not catch up in a burst."""

    rate: float
    capacity: float
    tokens: float = 0.0
    last: float | None = None
    dropped: float = 0.0

    def take(self, now: float) -> int:
        """Refill up to ``now`` and take every whole token there is."""
        if self.last is not None:
            self.tokens += max(0.0, now - self.last) * self.rate
            if self.tokens > self.capacity:
                self.dropped += self.tokens - self.capacity
                self.tokens = self.capacity
        self.last = now
        whole = int(self.tokens)
        self.tokens -= whole
        return whole

    def wait_s(self) -> float:
        """Seconds until the next whole token."""
        return max(0.0, (1.0 - self.tokens) / self.rate)


def cores_between(samples: list[procstats.TreeSample], t_from: float, t_to: float) -> float | None:
    """Mean CPU cores used between two moments: the CPU difference between the first sample at
    or after ``t_from`` and the last one at or before ``t_to``, over their time difference."""
    inside = [s for s in samples if t_from <= s.t <= t_to]
    if len(inside) < 2 or inside[-1].t <= inside[0].t:
        return None
    return (inside[-1].cpu_s - inside[0].cpu_s) / (inside[-1].t - inside[0].t)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0-100) of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def mib(value: int | None) -> str:
    return replicate.fmt(value / MIB if value else None)


# --------------------------------------------------------------------------------------------
# Paced load


@dataclass
class Sink:
    """One topic a :class:`PacedLoad` writes to, its producer, and what it wrote there."""

    cluster: sandbox_mod.Cluster
    topic: str
    partitions: int
    sent: int = 0
    failed: int = 0
    producer: Producer = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.producer = Producer(
            {
                **self.cluster.client_config(),
                "linger.ms": 5,
                "compression.type": "none",
                "queue.buffering.max.kbytes": 262_144,
                "on_delivery": self._delivered,
            }
        )

    def _delivered(self, err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            self.failed += 1

    @property
    def delivered(self) -> int:
        return self.sent - self.failed


class PacedLoad(threading.Thread):
    """Produces ``rate`` records per second in all for ``seconds``, spread round-robin over the
    sinks and their partitions. Each record's CreateTime is set to the wall clock (ms) when it is
    produced and given, with the record's index, to ``make_value(index, create_ms)``."""

    def __init__(
        self,
        sinks: list[Sink],
        rate: float,
        seconds: float,
        make_value: Callable[[int, int], bytes],
        burst_s: float = 0.1,
    ) -> None:
        super().__init__(name="paced-load", daemon=True)
        self.sinks, self.rate, self.seconds = sinks, rate, seconds
        self.make_value = make_value
        self.bucket = TokenBucket(rate, max(1.0, rate * burst_s))
        self.done_producing = threading.Event()
        self.started_t: float | None = None  # time.monotonic()
        self.started_wall: float | None = None  # time.time()
        self.ended_t: float | None = None
        self.undelivered = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._produce()
        except Exception as exc:  # reported by the benchmark, not lost in a thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done_producing.set()
            self.undelivered = sum(sink.producer.flush(60) for sink in self.sinks)
            for sink in self.sinks:
                sink.producer.close()

    def _produce(self) -> None:
        sinks, n_sinks = self.sinks, len(self.sinks)
        self.started_wall, self.started_t = time.time(), time.monotonic()
        end = self.started_t + self.seconds
        i = 0
        while (now := time.monotonic()) < end:
            for _ in range(self.bucket.take(now)):
                sink = sinks[i % n_sinks]
                create_ms = int(time.time() * 1000)
                value = self.make_value(i, create_ms)
                partition = (i // n_sinks) % sink.partitions
                while True:
                    try:
                        sink.producer.produce(
                            sink.topic, value, partition=partition, timestamp=create_ms
                        )
                        break
                    except BufferError:
                        sink.producer.poll(0.01)
                sink.sent += 1
                i += 1
            for sink in sinks:
                sink.producer.poll(0)
            time.sleep(max(0.0005, min(0.01, self.bucket.wait_s())))
        self.ended_t = time.monotonic()

    @property
    def produced_s(self) -> float | None:
        if self.started_t is None or self.ended_t is None:
            return None
        return self.ended_t - self.started_t


# --------------------------------------------------------------------------------------------
# A running system


class NotReady(Exception):
    """The system did not copy the probes (exited, or timed out)."""


@dataclass
class Probe:
    """A flow to wait for: ``topic`` on ``source``, copied to ``remote_topic`` on ``target``."""

    source: sandbox_mod.Cluster
    topic: str
    partitions: int
    target: sandbox_mod.Cluster
    remote_topic: str


@dataclass
class System:
    """The process trees of one system under test, sampled from outside."""

    name: str
    runs: list[Running]
    sampler: procstats.TreeSampler
    stop_files: list[Path] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    @classmethod
    def launch(
        cls, bench: Bench, name: str, launches: list[Launch], tag: str, stop_files: list[Path]
    ) -> System:
        t0 = time.monotonic()
        runs = [replicate.start(bench, launch, tag) for launch in launches]
        sampler = procstats.TreeSampler([r.proc.pid for r in runs], with_pss=False)
        system = cls(name, runs, sampler, stop_files, t0)
        system.sample()
        return system

    def sample(self) -> procstats.TreeSample:
        return self.sampler.sample()

    def exited(self) -> list[str]:
        """What exited so far (a system under test runs until it is stopped)."""
        return [
            f"{r.launch.name} exited with code {r.proc.returncode} (log: {r.log})"
            for r in self.runs
            if r.proc.poll() is not None
        ]

    def watch(self, done: Callable[[], bool], interval: float) -> list[str]:
        """Sample every ``interval`` seconds until ``done()``; what exited, if anything did."""
        while not done():
            if exited := self.exited():
                return exited
            time.sleep(interval)
            self.sample()
        return []

    def final_memory(self) -> procstats.TreeSample:
        """One sample with PSS (shared pages divided among the processes sharing them)."""
        return procstats.TreeSampler(self.sampler.roots, with_pss=True, pss_every=1).sample()

    def end(self, timeout: float) -> list[str]:
        """Ask for a clean stop (the stop files, for mirrorflow) and wait up to ``timeout``;
        then SIGTERM and, after ``timeout`` more, SIGKILL what is left."""
        problems = []
        alive = [r for r in self.runs if r.proc.poll() is None]  # exits before: reported
        if self.stop_files:
            for path in self.stop_files:
                path.touch()
            deadline = time.monotonic() + timeout
            while any(r.proc.poll() is None for r in alive) and time.monotonic() < deadline:
                time.sleep(0.25)
            late = [r for r in alive if r.proc.poll() is None]
            if late:  # where a stop waits, before SIGTERM
                for dump in [*self.thread_dumps(late), *self.python_stacks(late)]:
                    print(f"    thread dump: {dump}", flush=True)
            problems += [
                f"{r.launch.name} stopped with exit code {r.proc.returncode} (log: {r.log})"
                if r.proc.returncode is not None
                else f"{r.launch.name} still ran {timeout:.0f}s after its stop file: SIGTERM"
                for r in alive
                if r.proc.returncode != 0
            ]
        return problems + replicate.stop(self.runs, timeout)

    def thread_dumps(self, runs: list | None = None) -> list[Path]:
        """A thread dump (``jstack -l``) of every JVM in the system's trees (``runs``' only, if
        given), beside its log: where each thread waits, when a check fails and the system
        still runs."""
        import subprocess

        import psutil

        dumps = []
        for run in self.runs if runs is None else runs:
            for process in _tree(run):
                try:
                    if process.name() != "java":
                        continue
                except psutil.Error:  # gone meanwhile
                    continue
                path = run.log.with_name(f"{run.log.stem}.jstack-{process.pid}.txt")
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    with path.open("w") as out:
                        subprocess.run(
                            ["jstack", "-l", str(process.pid)],
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            timeout=60,
                            check=False,
                        )
                    dumps.append(path)
        return dumps

    @staticmethod
    def python_stacks(runs: list) -> list[Path]:
        """Every Python thread's stack of the mirror jobs in ``runs``' trees, written to their
        logs: ``spark_jobs/mirror.py`` dumps them on SIGUSR2 (:mod:`faulthandler`). Only those
        processes get the signal (it ends any other)."""
        import psutil

        logs = []
        for run in runs:
            for process in _tree(run):
                with contextlib.suppress(psutil.Error):
                    # the script itself, not a wrapper naming it among its arguments
                    if process.cmdline()[1:2] and process.cmdline()[1].endswith(
                        "spark_jobs/mirror.py"
                    ):
                        process.send_signal(signal.SIGUSR2)
                        logs.append(run.log)
        time.sleep(1)  # faulthandler writes at once; let it land before the stop
        return logs

    def cpu_s(self) -> float | None:
        """The exact CPU seconds of the whole trees over their lives (after :meth:`end`)."""
        reports = [r.report for r in self.runs if r.report.exists()]
        if len(reports) != len(self.runs):
            return None
        return sum(procstats.TreeUsage.load(path).cpu_s for path in reports)


def wait_ready(
    bench: Bench,
    system: System,
    probes: list[Probe],
    timeout: float,
    interval: float,
    every: float = 5.0,
) -> dict[str, int]:
    """Send a probe record to every partition of each flow's source topic (again every
    ``every`` seconds) until each flow's remote topic has a record; sample meanwhile.

    Returns the records on each remote topic then: the base line for counting what the load
    adds. Raises :class:`NotReady` if a process exits or ``timeout`` passes first."""
    producers: dict[str, Producer] = {}
    for probe in probes:
        if probe.source.name not in producers:
            producers[probe.source.name] = Producer(probe.source.client_config())
    try:
        return _wait_ready(bench, system, probes, producers, timeout, interval, every)
    finally:
        for producer in producers.values():
            producer.close()


def _wait_ready(
    bench: Bench,
    system: System,
    probes: list[Probe],
    producers: dict[str, Producer],
    timeout: float,
    interval: float,
    every: float,
) -> dict[str, int]:
    admins = {p.target.name: bench.admin(p.target) for p in probes}
    counts: dict[str, int] = {}
    next_probe = 0.0
    deadline = time.monotonic() + timeout
    while True:
        now = system.sample().t
        waiting = [p for p in probes if counts.get(p.remote_topic, 0) < 1]
        if not waiting:
            break
        if exited := system.exited():
            raise NotReady("; ".join(exited))
        if now > deadline:
            names = ", ".join(f"{p.source.name}->{p.target.name}" for p in waiting)
            raise NotReady(f"no probe copied after {timeout:.0f}s on {names}")
        if now >= next_probe:
            for probe in waiting:
                for partition in range(probe.partitions):
                    producers[probe.source.name].produce(probe.topic, PROBE, partition=partition)
            for producer in producers.values():
                producer.flush(10)
            next_probe = now + every
        for probe in waiting:
            counts[probe.remote_topic] = remote_count(admins[probe.target.name], probe.remote_topic)
        time.sleep(interval)
    return counts


def remote_count(admin: AdminClient, topic: str) -> int:
    """Records on ``topic`` (0 while it does not exist or its leader is not known yet)."""
    try:
        return sum(replicate.partition_counts(admin, topic) or [0])
    except KafkaException as exc:
        if exc.args[0].code() not in replicate.TRANSIENT:
            log(f"    (end offsets of {topic}: {exc})")
        return 0


# --------------------------------------------------------------------------------------------
# Clusters, options, results


@contextlib.contextmanager
def sandbox(
    names: list[str], directory: Path, heap: str, keep: bool
) -> Iterator[sandbox_mod.Sandbox]:
    """Sandbox clusters on free ports for the block's duration; on the way out every process
    the benchmark started is stopped, then the brokers, and (unless ``keep``) their data goes."""
    try:
        log(f"starting clusters {', '.join(names)} in {directory}")
        base_port = sandbox_mod.free_port_block(len(names) * sandbox_mod.PORTS_PER_CLUSTER)
        yield sandbox_mod.up(names, directory, base_port, heap=heap)
    finally:
        for run in list(replicate.LIVE):
            replicate.stop([run], 10.0)
        with contextlib.suppress(Exception):
            sandbox_mod.down(directory)
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


def reset_topics(bench: Bench, clusters: list[sandbox_mod.Cluster]) -> None:
    """Delete every topic on the clusters (an earlier run's data, progress and internal topics)."""
    for cluster in clusters:
        admin = bench.admin(cluster)
        replicate.delete_topics(admin, replicate.user_topics(admin))


def add_common_arguments(parser: argparse.ArgumentParser, broker_heap: str) -> None:
    """Options both benchmarks share: how the systems run, limits, where things go."""
    runs = parser.add_argument_group("systems")
    replicate.add_system_arguments(parser, runs, tasks=1, tasks_help="tasks.max (default 1, MM2's)")
    limits = parser.add_argument_group("limits")
    limits.add_argument("--settle", type=float, default=3.0, help="idle seconds before a run")
    limits.add_argument("--startup-timeout", type=float, default=600.0)
    limits.add_argument("--stop-timeout", type=float, default=60.0)
    where = parser.add_argument_group("where")
    where.add_argument("--broker-heap", default=broker_heap)
    where.add_argument("--workdir", type=Path, help="default: a new temporary directory")
    where.add_argument("--keep", action="store_true", help="keep the clusters' data and logs")
    where.add_argument("--results-dir", type=Path, default=replicate.RESULTS_DIR)


def systems_option(parser: argparse.ArgumentParser, only: str, known: tuple[str, ...]) -> list[str]:
    systems = [s.strip() for s in only.split(",") if s.strip()]
    if unknown := set(systems) - set(known):
        parser.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(known)}")
    return systems


def busy_warning() -> None:
    load1 = os.getloadavg()[0]
    if load1 > 1.5:
        log(f"WARNING: load average is {load1:.2f}: other work on this machine will skew figures")


@dataclass
class Session:
    """One benchmark invocation: its work directory, start time and machine description."""

    kind: str
    args: argparse.Namespace
    workdir: Path
    started: dt.datetime
    environment: dict[str, Any]

    @classmethod
    def begin(cls, kind: str, args: argparse.Namespace) -> Session:
        busy_warning()
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"mirrorflow-{kind}-"))
        workdir.mkdir(parents=True, exist_ok=True)
        return cls(kind, args, workdir, dt.datetime.now(dt.UTC), replicate.environment())

    def finish(self, header: list[str], results: list[Any], failed: bool, **extra: Any) -> int:
        """Write the JSON report, print the markdown table; the exit status."""
        self.environment["load_average_end"] = os.getloadavg()
        hidden = ("workdir", "results_dir", "topologies")
        report = {
            "started": self.started.isoformat(timespec="seconds"),
            "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "arguments": {k: v for k, v in vars(self.args).items() if k not in hidden},
            **extra,
            "environment": self.environment,
            "results": [asdict(r) for r in results],
            "all_verified": not failed,
        }
        directory = self.args.results_dir
        directory.mkdir(parents=True, exist_ok=True)
        out = directory / f"{self.kind}-{self.started.strftime('%Y%m%dT%H%M%SZ')}.json"
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print()
        print(markdown_table(header, [r.row() for r in results]))
        print()
        print(f"results: {out}")
        if failed or self.args.keep:
            print(f"logs: {self.workdir / 'logs'}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if failed:
            print("\n!!! AT LEAST ONE RUN FAILED OR LOST DATA: see 'check' above !!!")
            return 1
        return 0


def _tree(run) -> list:
    """The processes of ``run``'s tree (psutil), its root first; none once it is gone."""
    import psutil

    try:
        root = psutil.Process(run.proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
