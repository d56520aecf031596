"""The pure logic of benchmarks/scale.py, latency.py and steady.py: pacing, CPU windows,
percentiles, topologies, flow files, latency bookkeeping (no Kafka, no Spark)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from benchmarks import procstats, scale, steady
from benchmarks.latency import RECORD_HEAD, Latencies, LatencyResult
from benchmarks.replicate import Bench
from mirrorflow.devtools import sandbox as sandbox_mod


def test_token_bucket_paces_and_drops_what_a_late_sender_missed() -> None:
    bucket = steady.TokenBucket(rate=100.0, capacity=10.0)
    assert bucket.take(0.0) == 0
    assert bucket.take(0.05) == 5
    assert bucket.wait_s() == pytest.approx(0.01)
    assert bucket.take(1.05) == 10  # a second late: only the capacity, the rest is dropped
    assert bucket.dropped == pytest.approx(90.0)


def sample(t: float, cpu: float) -> procstats.TreeSample:
    return procstats.TreeSample(t=t, cpu_s=cpu, rss_bytes=0, pss_bytes=None, processes=1)


def test_cores_between_uses_the_samples_inside_the_window() -> None:
    samples = [sample(0, 0.0), sample(10, 5.0), sample(20, 6.0), sample(30, 8.0)]
    assert steady.cores_between(samples, 10, 30) == pytest.approx(0.15)
    assert steady.cores_between(samples, 5, 25) == pytest.approx(0.1)
    assert steady.cores_between(samples, 11, 19) is None


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert steady.percentile(values, 50) == 50.0
    assert steady.percentile(values, 99) == 99.0
    assert steady.percentile(values, 100) == 100.0
    assert steady.percentile([7.0], 99.9) == 7.0
    assert steady.percentile([], 50) is None


def test_topologies() -> None:
    mesh = scale.topology("mesh3")
    assert len(mesh.clusters) == 3 and len(mesh.flows) == 6
    assert all(len(flows) == 2 for flows in mesh.flows_by_target().values())
    agg = scale.topology("agg5")
    assert agg.flows_by_target() == {"agg": [f"src-{x}->agg" for x in "abcde"]}
    assert agg.sources == [f"src-{x}" for x in "abcde"]
    assert (agg.mm2_herders(only_flows=False), agg.mm2_herders(only_flows=True)) == (30, 5)
    assert [t.name for t in scale.topologies("both")] == ["mesh3", "agg5"]
    with pytest.raises(ValueError):
        scale.topology("ring4")


def fake_bench(tmp_path: Path, names: tuple[str, ...], **options: object) -> Bench:
    clusters = {
        name: sandbox_mod.Cluster(name, 9000 + 10 * i, 9001 + 10 * i, str(tmp_path), {"admin": "x"})
        for i, name in enumerate(names)
    }
    args = argparse.Namespace(tasks=1, flow_prop=[], mm2_herders="all", **options)
    return Bench(args, tmp_path, sandbox_mod.Sandbox(tmp_path, clusters))


@pytest.mark.parametrize("herders", ["all", "flows"])
def test_flow_file_has_every_flow_and_single_broker_factors(tmp_path: Path, herders: str) -> None:
    topo = scale.topology("agg2")
    bench = fake_bench(tmp_path, topo.clusters)
    bench.args.mm2_herders = herders
    lines = scale.flow_file(bench, topo).read_text().splitlines()
    assert "clusters = src-a, src-b, agg" in lines
    assert {"src-a->agg.topics = t.*", "src-b->agg.enabled = true"} <= set(lines)
    assert "offset.storage.replication.factor = 1" in lines
    quiet = [ln for ln in lines if "emit.heartbeats.enabled = false" in ln]
    assert len(quiet) == (0 if herders == "all" else 6 - 2)


def test_several_flows_need_the_launcher_and_the_job_to_keep_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tmp_path / "mirror.py"
    monkeypatch.setattr(scale.launch, "MIRROR_JOB", job)
    flows = ["a->c", "b->c"]
    with pytest.raises(scale.NotAvailable, match="list of flows"):
        scale.check_several_flows(["spark-submit", str(job), "--flow", flows], flows)
    command = ["spark-submit", str(job), "--flow", "a->c", "--flow", "b->c"]
    parser = "import argparse\ndef parse_args(argv):\n    p = argparse.ArgumentParser()\n"
    job.write_text(parser + "    p.add_argument('--flow')\n    return p.parse_args(argv)\n")
    with pytest.raises(scale.NotAvailable, match="keeps only 'b->c'"):
        scale.check_several_flows(command, flows)
    job.write_text(
        parser + "    p.add_argument('--flow', action='append')\n    return p.parse_args(argv)\n"
    )
    scale.check_several_flows(command, flows)


def record(index: int, created_ms: int) -> bytes:
    return RECORD_HEAD.pack(index, created_ms) + b"x" * 8


def test_latencies_skip_probes_warm_up_and_duplicates() -> None:
    seen = Latencies(measure_from_ms=1_000)
    seen.add(steady.PROBE, 0, 5.0)
    seen.add(record(0, 900), 900, 950.0)  # warm-up: received, not measured
    seen.add(record(1, 1_000), 1_000, 1_012.5)
    seen.add(record(1, 1_000), 1_000, 1_100.0)  # a duplicate: the first arrival counts
    seen.add(record(70_000, 1_010), 1_011, 1_030.0)  # timestamp not the source's
    result = LatencyResult("x")
    seen.summary(result)
    assert (result.received, result.duplicates, result.measured) == (3, 1, 2)
    assert result.timestamp_changed == 1
    assert (result.p50_ms, result.max_ms) == (12.5, 20.0)


def test_a_failed_check_dumps_the_threads_of_every_jvm_in_the_system(tmp_path: Path) -> None:
    """A system whose launcher (a shell) runs a JVM: the JVM's threads are dumped beside the
    system's log, the shell is not."""
    import subprocess

    from benchmarks.replicate import Launch, Running

    program = tmp_path / "Sleeper.java"
    program.write_text(
        "public class Sleeper { public static void main(String[] a) throws Exception {"
        ' System.out.println("up"); Thread.sleep(120_000); } }'
    )
    shell = subprocess.Popen(
        ["bash", "-c", f"java {program}; true"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert shell.stdout is not None and shell.stdout.readline().strip() == "up"
        launch = Launch("sleeper", [])
        run = Running(launch, shell, tmp_path / "report.json", tmp_path / "sleeper.log")
        system = steady.System("sleeper", [run], procstats.TreeSampler([shell.pid]))
        dumps = system.thread_dumps()
        assert len(dumps) == 1, dumps
        assert dumps[0].parent == tmp_path and dumps[0].name.startswith("sleeper.jstack-")
        assert dumps[0].name != f"sleeper.jstack-{shell.pid}.txt"  # the JVM's, not the shell's
        text = dumps[0].read_text()
        assert "Full thread dump" in text and "Sleeper.main" in text, text[:500]
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)], check=False)
        shell.kill()
        shell.wait(10)


def test_a_slow_stop_dumps_the_mirror_jobs_python_threads_into_its_log(tmp_path: Path) -> None:
    """A mirror job (``spark_jobs/mirror.py``, which dumps its threads on SIGUSR2) under a
    launcher shell that has no such handler: the job writes every thread's stack to the log and
    goes on; the shell is not signalled (SIGUSR2 would end it)."""
    import subprocess
    import sys

    from benchmarks.replicate import Launch, Running

    job = tmp_path / "spark_jobs" / "mirror.py"
    job.parent.mkdir()
    job.write_text(
        "import faulthandler, signal, sys, time\n"
        "faulthandler.register(signal.SIGUSR2, all_threads=True)\n"
        "print('up', flush=True)\n"
        "def waiting_for_the_stop():\n"
        "    time.sleep(120)\n"
        "waiting_for_the_stop()\n"
    )
    log = tmp_path / "job.log"
    # Beside the job, a process naming its script as its last argument, as spark-submit's JVM
    # does (HotSpot uses SIGUSR2 itself: the signal crashed it): it must not be signalled.
    launcher = f"{sys.executable} -c 'import time; time.sleep(120)' {job} &"
    with log.open("w") as out:
        shell = subprocess.Popen(
            ["bash", "-c", f"{launcher} {sys.executable} {job}; true"],
            stdout=out,
            stderr=out,
            text=True,
        )
    try:
        for _ in range(100):
            if "up" in log.read_text():
                break
            time.sleep(0.1)
        run = Running(Launch("job", []), shell, tmp_path / "report.json", log)
        assert steady.System.python_stacks([run]) == [log]
        text = log.read_text()
        assert "waiting_for_the_stop" in text and "mirror.py" in text, text
        assert shell.poll() is None  # neither the shell nor the job ended
        import psutil

        named = [p for p in psutil.Process(shell.pid).children() if "-c" in p.cmdline()]
        assert len(named) == 1 and named[0].status() != psutil.STATUS_ZOMBIE, named
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)], check=False)
        shell.kill()
        shell.wait(10)
