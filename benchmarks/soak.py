"""Soak: a million records or more copied between two datacenters under random faults.

The source cluster ``east`` runs in its own network namespace behind an emulated WAN link
(:mod:`mirrorflow.devtools.datacenters`: by default 10 Mbit/s, 50 ms round trip, 1% of packets
lost each way; ``--rate``, ``--delay-ms``, ``--jitter-ms``, ``--loss``); the target ``west``
on loopback; the mirror job (``east->west``, the same command ``mirrorflow mirror`` runs) in
this namespace, kept running by a supervisor as Airflow's retries would. While records are
produced at an even pace, a seeded :class:`~mirrorflow.devtools.faults.FaultScheduler` SIGKILLs
the job's driver or a Spark Python worker, restarts either broker, and cuts the link, for
``--duration`` seconds; then the soak waits for the copy to catch up and reads both sides:
records lost and repeated per partition, offset syncs checked, catch-up time after the last
fault. The figures (with the link's conditions) are printed and saved to
``benchmarks/results/soak-<time>.json``. Needs root; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mirrorflow.devtools import datacenters, faults
from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.paths import write_private
from mirrorflow.runtime import launch

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
SYNCS = "mm2-offset-syncs.west.internal"
GROUP = "soak-consumers"  # a group on east whose checkpoints must stay exact


def log(message: str) -> None:
    print(f"[{dt.datetime.now(dt.UTC):%H:%M:%S}] {message}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=100, help="value bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--duration", type=float, default=600, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument(
        "--mode", choices=["at-least-once", "exactly-once"], default="at-least-once"
    )
    parser.add_argument("--rate", default="10mbit", help="the link's rate, each way (10mbit)")
    parser.add_argument(
        "--delay-ms", type=float, default=25.0, help="the link's delay each way (25: 50 ms RTT)"
    )
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="± each way (0)")
    parser.add_argument(
        "--loss", type=float, default=0.01, help="share of packets lost, each way (0.01)"
    )
    parser.add_argument("--gap", type=float, nargs=2, default=(15.0, 45.0), metavar=("MIN", "MAX"))
    parser.add_argument("--cut", type=float, nargs=2, default=(10.0, 60.0), metavar=("MIN", "MAX"))
    parser.add_argument(
        "--faults",
        default="kill-driver,restart-source,restart-target,cut",
        help="kinds to draw from (also kill-worker: a Spark Python worker, when there is one)",
    )
    parser.add_argument("--catch-up-timeout", type=float, default=900)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args(argv)


def flow_file(path: Path, east: sandbox_mod.Cluster, west: sandbox_mod.Cluster, args) -> Path:
    # east runs in a network namespace, west in a sandbox of its own: one view of both
    lines = sandbox_mod.Sandbox(path.parent, {"east": east, "west": west}).mm2_lines()
    lines += [
        "east->west.enabled = true",
        "east->west.topics = soak",
        f"east->west.groups = {GROUP}",
        "emit.checkpoints.interval.seconds = 1",
        "refresh.groups.interval.seconds = 5",
    ]
    if args.mode == "exactly-once":
        lines += [
            "west.exactly.once.source.support = enabled",
            "east.consumer.isolation.level = read_committed",
        ]
    return write_private(path, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM as Ctrl-C: the clean-up below (job, brokers, namespace) runs
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    why = datacenters.unavailable()
    if why:
        print(f"soak: {why}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="mirrorflow-soak-"))
    started = dt.datetime.now(dt.UTC)
    try:
        with datacenters.datacenters(1, work / "datacenters") as (dc,):
            return soak(args, dc, work, started)
    finally:
        sandbox_mod.down(work / "west")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def soak(args, dc: datacenters.Datacenter, work: Path, started: dt.datetime) -> int:
    dc.shape(
        rate=args.rate,
        delay_ms=args.delay_ms,
        jitter_ms=args.jitter_ms,
        loss=args.loss,
        seed=args.seed,
    )
    log(f"starting east in namespace {dc.name} ({dc.address}, link {link_text(dc)}) and west")
    east = dc.start_cluster("east")
    west_dir = work / "west"
    base = sandbox_mod.free_port_block(sandbox_mod.PORTS_PER_CLUSTER)
    west = sandbox_mod.up(["west"], west_dir, base_port=base)["west"]
    admin = AdminClient({**east.client_config(), "log_level": 0})
    admin.create_topics([NewTopic("soak", args.partitions, 1)])["soak"].result(60)
    config = flow_file(work / "mm2.properties", east, west, args)
    state, job_log = work / "state", work / "job.log"

    def start_job() -> subprocess.Popen:
        command = launch.mirror_command(
            [config], "east->west", master="local[2]", driver_memory="1g", state_dir=state
        )
        with open(job_log, "ab") as out:
            return subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=launch.job_environment(),
                cwd=work,
                start_new_session=True,
            )

    supervisor = faults.Supervisor(start_job)
    try:
        return _run_faults(args, dc, east, west, west_dir, config, supervisor, started)
    finally:
        supervisor.stop(graceful_stop)  # on failures too: no job outlives the soak


def _run_faults(args, dc, east, west, west_dir, config, supervisor, started) -> int:
    """Produce, make faults, wait for the copy, verify, report (see the module)."""

    def restart(box_dir: Path, name: str, rng) -> str:
        down = rng.uniform(2, 10)
        sandbox_mod.down(box_dir, [name])
        time.sleep(down)
        sandbox_mod.up([name], box_dir, timeout=180)
        return f"down {down:.0f}s"

    def restart_source(rng) -> str:
        down = rng.uniform(2, 10)
        dc.restart_cluster(down_seconds=down)
        return f"down {down:.0f}s"

    def cut(rng) -> str:
        seconds = rng.uniform(*args.cut)
        with dc.link_cut():
            time.sleep(seconds)
        return f"{seconds:.0f}s"

    def kill_worker(rng) -> str:
        workers = faults.python_workers(supervisor.job.pid)
        if not workers:
            supervisor.kill()
            return "no Python worker running: killed the driver"
        victim = rng.choice(workers)
        os.kill(victim, signal.SIGKILL)
        return f"pid {victim}"

    actions = {
        "kill-driver": lambda rng: supervisor.kill() or "",
        "kill-worker": kill_worker,
        "restart-source": restart_source,
        "restart-target": lambda rng: restart(west_dir, "west", rng),
        "cut": cut,
    }
    chosen = {k: v for k, v in actions.items() if k in args.faults.split(",")}
    scheduler = faults.FaultScheduler(chosen, args.duration, seed=args.seed, gap=tuple(args.gap))

    producer = Producer(
        {
            **east.client_config(),
            "enable.idempotence": True,
            "linger.ms": 50,
            "batch.size": 256 * 1024,
            "delivery.timeout.ms": 1_800_000,
            "queue.buffering.max.kbytes": 256 * 1024,
            "log_level": 0,
        }
    )
    produced = {"n": 0}
    committed: dict[int, int] = {}

    def produce_paced() -> None:
        """The records spread over 80% of the fault period, in slices of 1,000."""
        began, span = time.monotonic(), args.duration * 0.8
        step = 1000
        for start in range(0, args.records, step):
            due = began + span * start / args.records
            time.sleep(max(0.0, due - time.monotonic()))
            count = min(step, args.records - start)
            faults.produce_numbered(
                east, "soak", args.partitions, start, count, args.record_size, producer
            )
            produced["n"] = start + count
            if produced["n"] % 100_000 == 0:  # the group has read half of what is produced
                while producer.flush(10):
                    pass
                half = produced["n"] // 2
                offsets = {p: len(range(p, half, args.partitions)) for p in range(args.partitions)}
                try:
                    faults.commit_group(east, "soak", GROUP, offsets)
                    committed.update(offsets)
                except Exception as exc:  # a long cut: the next commit is checked instead
                    log(f"group commit at {half:,} failed: {exc}")
        while producer.flush(10):
            pass

    log(f"soak: {args.records:,} records of {args.record_size} B, faults for {args.duration:.0f}s")
    writer = threading.Thread(target=produce_paced, daemon=True)
    writer.start()
    scheduler.start()
    last_report = time.monotonic()
    while scheduler._thread.is_alive() or writer.is_alive():
        time.sleep(5)
        if time.monotonic() - last_report > 60:
            last_report = time.monotonic()
            log(f"produced {produced['n']:,}; faults so far {scheduler.counts()}")
    writer.join()
    scheduler.join()
    log(f"faults done: {scheduler.counts()}; waiting for the copy to catch up")
    last_fault = scheduler.last_fault_end or time.monotonic()
    waiting = time.monotonic()
    verdict, copied_after = faults.settle(
        east, "soak", west, "east.soak", SYNCS, args.catch_up_timeout
    )
    catch_up = waiting + copied_after - last_fault
    verify_seconds = time.monotonic() - waiting - copied_after
    wrong_checkpoints = faults.wrong_checkpoints(
        config, "east->west", GROUP, committed, verdict.upstream, verdict.downstream
    )
    supervisor.stop(graceful_stop)
    link_counters = dc.link_stats()
    figures = {
        "started": started.isoformat(timespec="seconds"),
        "mode": args.mode,
        "records": verdict.records,
        "record_bytes": args.record_size,
        "partitions": args.partitions,
        "link": dc.conditions,
        "link_counters": link_counters,
        "fault_seconds": args.duration,
        "seed": args.seed,
        "faults": scheduler.counts(),
        "fault_log": [asdict(f) for f in scheduler.faults],
        "fault_errors": scheduler.errors,
        "job_restarts": supervisor.restarts,
        "copies": verdict.copies,
        "lost": verdict.total_lost,
        "lost_per_partition": verdict.lost,
        "repeated": verdict.total_repeated,
        "repeated_per_partition": verdict.repeated,
        "offset_syncs": verdict.syncs,
        "wrong_offset_syncs": verdict.wrong_syncs,
        "group_commits_checked": committed,
        "wrong_checkpoints": wrong_checkpoints,
        "catch_up_seconds_after_last_fault": round(catch_up, 1),
        "verification_seconds": round(verify_seconds, 1),
        "command": "python benchmarks/soak.py " + " ".join(sys.argv[1:]),
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"soak-{started:%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{'link':>34}: {link_text(dc)}")
    for way in ("to_dc", "to_host"):
        n = link_counters.get(way, {})
        print(
            f"{'link packets ' + way:>34}: {n.get('packets', 0):,} sent, {n.get('lost', 0):,} lost,"
            f" {n.get('cut', 0):,} cut, {n.get('queue_full', 0):,} queue full"
        )
    print(f"{'link forwarder CPU (s)':>34}: {link_counters.get('cpu_seconds')}")
    for key in ("records", "faults", "job_restarts", "copies", "lost", "repeated"):
        print(f"{key:>34}: {figures[key]}")
    print(f"{'offset syncs (wrong)':>34}: {verdict.syncs} ({verdict.wrong_syncs})")
    print(f"{'checkpointed partitions (wrong)':>34}: {len(committed)} ({wrong_checkpoints})")
    print(
        f"{'catch-up after the last fault (s)':>34}: {figures['catch_up_seconds_after_last_fault']}"
    )
    print(f"saved {out}")
    ok = verdict.total_lost == 0 and verdict.wrong_syncs == 0 and wrong_checkpoints == 0
    if args.mode == "exactly-once":
        ok = ok and verdict.total_repeated == 0
    return 0 if ok else 1


def link_text(dc: datacenters.Datacenter) -> str:
    c = dc.conditions
    jitter = f" ±{c['jitter_ms']:g}" if c.get("jitter_ms") else ""
    return (
        f"{c.get('rate') or 'unlimited'}, {c.get('delay_ms', 0):g}{jitter} ms each way, "
        f"{c.get('loss', 0):.1%} loss each way"
    )


def graceful_stop(job: subprocess.Popen) -> None:
    if job.poll() is None:
        job.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.wait(90)


if __name__ == "__main__":
    sys.exit(main())
