#!/usr/bin/env python
"""Scale benchmark: memory and CPU of N flows, idle and under a small load, for MirrorMaker 2
(all flows in one JVM) and mirrorflow (one Spark application per flow, one per target, or one
for every flow: the sites co-located on one machine, as MirrorMaker 2 runs them).

    python benchmarks/scale.py [--topology mesh3|agg5|both] [--only mm2,mirrorflow-per-flow,...]
                               [--load-rate 1000 --load-seconds 30 --idle-seconds 60]

Per topology (``mesh3``: 3 clusters, every one mirrored to every other, 6 flows; ``agg5``: 5
source clusters into 1 target, 5 flows) it starts one sandbox cluster per alias, then runs each
system in turn: start it and wait until it copies a probe record on every flow, produce a small
paced load to every source's ``t.load`` while sampling, then sample it idle. Reported per system:
resident memory of its whole process tree (peak, and at the end of the idle phase), mean CPU
cores under load and idle, and whether every loaded record reached every flow's remote topic.
See benchmarks/README.md ("Scale").
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shutil
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))

from benchmarks import procstats, replicate, steady  # noqa: E402
from benchmarks.replicate import MIB, Bench, Launch, fmt, log  # noqa: E402
from mirrorflow.runtime import launch  # noqa: E402

SYSTEMS = ("mm2", "mirrorflow-per-flow", "mirrorflow-one-app", "mirrorflow-one-process")
SOURCE_TOPIC = "t.load"  # every flow mirrors t.* (remote topics <source>.t.load do not match)
TOPIC_PATTERN = "t.*"


class NotAvailable(Exception):
    """A system this checkout cannot run yet (e.g. several flows in one Spark application)."""


# --------------------------------------------------------------------------------------------
# Topologies


@dataclass(frozen=True)
class Topology:
    name: str
    clusters: tuple[str, ...]
    flows: tuple[tuple[str, str], ...]  # (source, target)

    @property
    def flow_names(self) -> list[str]:
        return [f"{source}->{target}" for source, target in self.flows]

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(source for source, _ in self.flows))

    def flows_by_target(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for source, target in self.flows:
            found.setdefault(target, []).append(f"{source}->{target}")
        return found

    def mm2_herders(self, only_flows: bool) -> int:
        """Herders (Connect workers) MirrorMaker 2 runs for the file: by default one for every
        ordered pair of clusters (a disabled pair still emits heartbeats)."""
        n = len(self.clusters)
        return len(self.flows) if only_flows else n * (n - 1)


def topology(name: str) -> Topology:
    """``meshN`` (N clusters, every ordered pair a flow) or ``aggN`` (N sources, one target)."""
    match = re.fullmatch(r"(mesh|agg)(\d+)", name)
    if not match or not 1 <= int(match[2]) <= 26:
        raise ValueError(f"unknown topology {name!r}: use meshN or aggN (N up to 26), or both")
    kind, n = match[1], int(match[2])
    letters = [chr(ord("a") + i) for i in range(n)]
    if kind == "mesh":
        if n < 2:
            raise ValueError("a mesh needs at least 2 clusters")
        clusters = tuple(f"mesh-{x}" for x in letters)
        flows = tuple((s, t) for s in clusters for t in clusters if s != t)
        return Topology(name, clusters, flows)
    sources = tuple(f"src-{x}" for x in letters)
    return Topology(name, (*sources, "agg"), tuple((s, "agg") for s in sources))


def topologies(option: str) -> list[Topology]:
    names = ["mesh3", "agg5"] if option == "both" else [n.strip() for n in option.split(",")]
    return [topology(n) for n in names if n]


def remote_topic(source: str) -> str:
    return f"{source}.{SOURCE_TOPIC}"  # MirrorMaker 2's DefaultReplicationPolicy


# --------------------------------------------------------------------------------------------
# One run


@dataclass
class ScaleResult:
    topology: str
    system: str
    flows: int
    units: str = ""  # what runs: JVMs, herders, Spark applications
    ok: bool = False
    skipped: str | None = None
    problems: list[str] = field(default_factory=list)
    startup_s: float | None = None  # launch -> a probe record copied on every flow
    load_rate: float | None = None  # records/s actually produced, all sources together
    load_cores: float | None = None
    idle_cores: float | None = None
    idle_window_s: float | None = None
    peak_rss_bytes: int | None = None
    idle_rss_bytes: int | None = None  # at the end of the idle phase
    idle_pss_bytes: int | None = None
    processes: int | None = None  # at the end of the idle phase
    commands: dict[str, int] = field(default_factory=dict)
    cpu_s: float | None = None  # whole trees, whole lives (start-up and stop included)
    produced: dict[str, int] = field(default_factory=dict)  # per source cluster
    arrived: dict[str, int] = field(default_factory=dict)  # per flow, beyond the probes
    broker_cpu_s: float | None = None  # all brokers, while the system ran (not in the figures)
    timeline: list[list[float]] = field(default_factory=list)  # t, cpu_s, rss_mib, phase

    def row(self) -> list[str]:
        check = "not available: " + self.skipped if self.skipped else check_text(self)
        return [
            self.topology,
            self.system,
            str(self.flows),
            self.units,
            fmt(self.startup_s, 1),
            fmt(self.load_cores, 3),
            fmt(self.idle_cores, 3),
            steady.mib(self.peak_rss_bytes),
            steady.mib(self.idle_rss_bytes),
            steady.mib(self.idle_pss_bytes),
            check,
        ]


HEADER = [
    "topology",
    "system",
    "flows",
    "runs as",
    "start s",
    "load cores",
    "idle cores",
    "peak RSS MiB",
    "idle RSS MiB",
    "idle PSS MiB",
    "check",
]


def check_text(result: ScaleResult) -> str:
    return ("ok" if result.ok else "FAILED: ") + "; ".join(result.problems)


def flow_file(bench: Bench, topo: Topology) -> Path:
    """One mm2.properties per topology, read unchanged by MirrorMaker 2 and by mirrorflow."""
    args = bench.args
    extra = list(args.flow_prop)
    if args.mm2_herders == "flows":  # no heartbeat-only herders for the pairs that are no flow
        extra += [
            (f"{s}->{t}.emit.heartbeats.enabled", "false")
            for s in topo.clusters
            for t in topo.clusters
            if s != t and (s, t) not in topo.flows
        ]
    lines = [
        "# Written by benchmarks/scale.py; read by MirrorMaker 2 and by mirrorflow alike.",
        *replicate.mm2_properties(
            [bench.box[name] for name in topo.clusters],
            dict.fromkeys(topo.flow_names, TOPIC_PATTERN),
            [],
            args.tasks,
            extra,
        ),
    ]
    path = bench.workdir / f"{topo.name}.mm2.properties"
    replicate.write_private(path, "\n".join(lines) + "\n")
    return path


def check_several_flows(command: list[str], flows: list[str]) -> None:
    """Raise :class:`NotAvailable` unless ``command`` asks the mirror job for every flow and the
    job's own argument parser keeps them all (not only the last ``--flow``)."""
    if not all(isinstance(arg, str) for arg in command):
        raise NotAvailable("launch.mirror_command does not take a list of flows yet")
    job_args = command[command.index(str(launch.MIRROR_JOB)) + 1 :]
    parse_args = runpy.run_path(str(launch.MIRROR_JOB)).get("parse_args")
    try:
        parsed = vars(parse_args(job_args)) if parse_args else {}
    except SystemExit:
        raise NotAvailable(f"spark_jobs/mirror.py refuses {job_args}") from None
    kept = [v for v in parsed.values() if isinstance(v, list | tuple) and set(flows) <= set(v)]
    if not kept:
        raise NotAvailable(
            f"spark_jobs/mirror.py keeps only {parsed.get('flow')!r} of --flow {' '.join(flows)}"
        )


def launches(
    bench: Bench, topo: Topology, system: str, config: Path
) -> tuple[list[Launch], list[Path], str]:
    """The processes of ``system``, the stop files that end them cleanly, and what runs."""
    if system == "mm2":
        herders = topo.mm2_herders(bench.args.mm2_herders == "flows")
        return [replicate.mm2_launch(bench, config, None)], [], f"1 JVM, {herders} herders"
    state_root = bench.workdir / "state" / f"{topo.name}-{system}"
    shutil.rmtree(state_root, ignore_errors=True)
    groups: dict[str, str | list[str]]
    if system == "mirrorflow-per-flow":  # one application per flow, named after it
        groups = {flow: flow for flow in topo.flow_names}
    elif system == "mirrorflow-one-process":  # every site co-located: one application, as MM2
        groups = {"all": topo.flow_names}
    else:  # one application per target cluster, running every flow into it
        groups = {f"to-{t}": flows for t, flows in topo.flows_by_target().items()}
    found, stop_files = [], []
    for label, flows in groups.items():
        name = "mirrorflow-" + re.sub(r"[^A-Za-z0-9]+", "-", label)
        state = state_root / name
        stop = state / "stop"
        try:
            one = replicate.mirrorflow_launch(bench, [config], flows, state, name, stop_file=stop)
        except Exception as exc:  # the multi-flow interface may not exist yet
            raise NotAvailable(
                f"launch.mirror_command({flows}): {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(flows, list):
            check_several_flows(one.command, flows)
        found.append(one)
        stop_files.append(stop)
    apps = len(found)
    return found, stop_files, f"{apps} Spark app{'s' if apps > 1 else ''}"


def broker_cpu(bench: Bench) -> float:
    values = [procstats.process_cpu_seconds(c.pid) for c in bench.box.clusters.values() if c.pid]
    return sum(v for v in values if v is not None)


def run_system(bench: Bench, topo: Topology, system: str, config: Path) -> ScaleResult:
    args = bench.args
    result = ScaleResult(topo.name, system, len(topo.flows))
    clusters = [bench.box[name] for name in topo.clusters]
    steady.reset_topics(bench, clusters)
    for source in topo.sources:
        replicate.create_topic(bench.admin(bench.box[source]), SOURCE_TOPIC, args.partitions)
    time.sleep(args.settle)
    try:
        found, stop_files, result.units = launches(bench, topo, system, config)
    except NotAvailable as exc:
        result.skipped = str(exc)
        return result

    brokers0 = broker_cpu(bench)
    system_run = steady.System.launch(bench, system, found, f"{topo.name}-{system}", stop_files)
    probes = [
        steady.Probe(bench.box[s], SOURCE_TOPIC, args.partitions, bench.box[t], remote_topic(s))
        for s, t in topo.flows
    ]
    t_load = t_idle = None
    try:
        try:
            base = steady.wait_ready(
                bench, system_run, probes, args.startup_timeout, args.sample_interval
            )
        except steady.NotReady as exc:
            result.problems.append(f"not ready: {exc}")
            return result
        result.startup_s = time.monotonic() - system_run.t0
        log(f"    ready after {result.startup_s:.1f}s; load for {args.load_seconds:.0f}s")

        sinks = [steady.Sink(bench.box[s], SOURCE_TOPIC, args.partitions) for s in topo.sources]
        pool = os.urandom(args.record_size + 4096)
        load = steady.PacedLoad(
            sinks,
            args.load_rate,
            args.load_seconds,
            lambda i, _ms: pool[i % 4096 : i % 4096 + args.record_size],
        )
        load.start()
        t_load = system_run.sample().t
        if problems := system_run.watch(load.done_producing.is_set, args.sample_interval):
            result.problems += problems
            return result
        load.join()
        t_idle = system_run.sample().t
        log(f"    idle for {args.idle_seconds:.0f}s")
        idle_end = t_idle + args.idle_seconds
        if problems := system_run.watch(lambda: time.monotonic() >= idle_end, args.sample_interval):
            result.problems += problems
            return result
        last = system_run.sample()
        memory = system_run.final_memory()

        samples = system_run.sampler.samples
        result.load_rate = sum(s.sent for s in sinks) / load.produced_s if load.produced_s else None
        result.load_cores = steady.cores_between(samples, t_load, t_idle)
        skip = args.idle_skip if args.idle_seconds > args.idle_skip else 0.0
        result.idle_cores = steady.cores_between(samples, t_idle + skip, last.t)
        result.idle_window_s = round(last.t - t_idle - skip, 1)
        result.idle_rss_bytes, result.idle_pss_bytes = memory.rss_bytes, memory.pss_bytes
        result.processes = memory.processes
        if load.error or load.undelivered:
            result.problems.append(f"load: {load.error or f'{load.undelivered} not delivered'}")
        verify(bench, topo, sinks, base, result)
        if result.problems:  # where the system's threads wait, for the failure's cause
            for dump in system_run.thread_dumps():
                log(f"    thread dump: {dump}")
    finally:
        result.problems += system_run.end(args.stop_timeout)
        result.broker_cpu_s = round(broker_cpu(bench) - brokers0, 2)
        result.cpu_s = system_run.cpu_s()
        result.peak_rss_bytes = system_run.sampler.peak_rss_bytes
        result.commands = system_run.sampler.commands
        result.timeline = timeline(system_run, t_load, t_idle)
    result.ok = not result.problems
    return result


def timeline(
    system_run: steady.System, t_load: float | None, t_idle: float | None
) -> list[list[float]]:
    """Per sample: seconds since launch, CPU seconds so far, RSS MiB, phase (0 start-up, 1 load,
    2 idle and stop)."""
    found = []
    for sample in system_run.sampler.samples:
        phase = sum(t is not None and sample.t >= t for t in (t_load, t_idle))
        t, cpu = round(sample.t - system_run.t0, 2), round(sample.cpu_s, 2)
        found.append([t, cpu, sample.rss_bytes // MIB, phase])
    return found


def verify(
    bench: Bench,
    topo: Topology,
    sinks: list[steady.Sink],
    base: dict[str, int],
    result: ScaleResult,
) -> None:
    """Every flow's remote topic gained at least the records delivered to its source."""
    delivered = {sink.cluster.name: sink.delivered for sink in sinks}
    result.produced = delivered
    for (source, target), flow in zip(topo.flows, topo.flow_names, strict=True):
        topic = remote_topic(source)
        count = steady.remote_count(bench.admin(bench.box[target]), topic)
        result.arrived[flow] = count - base[topic]
        if result.arrived[flow] < delivered[source]:
            result.problems.append(
                f"{flow}: {result.arrived[flow]} of {delivered[source]} records on {topic}"
            )


# --------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    what = parser.add_argument_group("what")
    what.add_argument("--topology", default="both", help="mesh3, agg5, both, or meshN/aggN,...")
    what.add_argument(
        "--only", default=",".join(SYSTEMS), help=f"systems, in order (default {','.join(SYSTEMS)})"
    )
    what.add_argument(
        "--mm2-herders",
        choices=("all", "flows"),
        default="all",
        help="all: MM2's default, a herder per ordered pair of clusters (those that are no\n"
        "flow emit heartbeats only); flows: a herder per flow (X->Y.emit.heartbeats.enabled\n"
        "= false for the other pairs, in the file both systems read)",
    )
    load = parser.add_argument_group("load and phases")
    load.add_argument("--load-rate", type=float, default=1000.0, help="records/s, all sources")
    load.add_argument("--record-size", type=int, default=1024, help="value bytes")
    load.add_argument("--partitions", type=int, default=2, help="of each source's t.load")
    load.add_argument("--load-seconds", type=float, default=30.0)
    load.add_argument("--idle-seconds", type=float, default=60.0)
    load.add_argument(
        "--idle-skip", type=float, default=10.0, help="idle seconds left out of idle CPU"
    )
    load.add_argument("--sample-interval", type=float, default=1.0, help="seconds")
    steady.add_common_arguments(parser, broker_heap="384m")
    args = parser.parse_args(argv)
    args.systems = steady.systems_option(parser, args.only, SYSTEMS)
    try:
        args.topologies = topologies(args.topology)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    session = steady.Session.begin("scale", args)
    results: list[ScaleResult] = []
    failed = False
    try:
        for topo in args.topologies:
            directory = session.workdir / f"sandbox-{topo.name}"
            with steady.sandbox(list(topo.clusters), directory, args.broker_heap, args.keep) as box:
                bench = Bench(args, session.workdir, box)
                config = flow_file(bench, topo)
                for system in args.systems:
                    log(f"[{topo.name}] {system}: {len(topo.flows)} flows")
                    try:
                        result = run_system(bench, topo, system, config)
                    except Exception as exc:  # the other systems' figures still count
                        log(traceback.format_exc())
                        problem = f"{type(exc).__name__}: {exc}"
                        result = ScaleResult(topo.name, system, len(topo.flows), problems=[problem])
                    results.append(result)
                    failed |= not result.ok and not result.skipped
                    log("    " + " | ".join(result.row()))
    except KeyboardInterrupt:
        failed = True
        log("interrupted")
    topologies = [asdict(t) for t in args.topologies]
    return session.finish(HEADER, results, failed, topologies=topologies)


if __name__ == "__main__":
    sys.exit(main())
