"""The benchmark's accounting (benchmarks/procstats.py, benchmarks/replicate.py) on real processes:
CPU of a whole process tree, orphans included, memory summed over the tree, signals forwarded,
and a run that lost records reported as such. No timings are asserted, only CPU consumed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchmarks import procstats
from benchmarks.replicate import judge

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_wrapper_reports_cpu_of_the_whole_tree_orphans_included(tmp_path: Path) -> None:
    # The child starts a busy grandchild and exits without waiting for it: the grandchild is
    # orphaned. Without the subreaper its CPU would go to init and be lost.
    grandchild = _python(BUSY.format(s=0.6))
    child = _python(f"import subprocess\nsubprocess.Popen({grandchild!r})\n" + BUSY.format(s=0.4))
    report = tmp_path / "usage.json"
    done = subprocess.run(procstats.wrapped(report, child), timeout=120)
    usage = procstats.TreeUsage.load(report)
    assert done.returncode == 0
    assert usage.returncode == 0
    assert usage.orphans_reaped >= 1
    assert usage.cpu_s >= 1.0, usage  # 0.4 s (child) + 0.6 s (orphan), plus start-ups
    assert usage.wrapper_self_s < usage.cpu_s


def test_sampler_sums_memory_and_cpu_over_the_live_tree(tmp_path: Path) -> None:
    go, ready = tmp_path / "go", tmp_path / "ready"
    ready.mkdir()
    # Each process says when its block alone is resident: while bytearray copies the bytes
    # object, one process briefly holds 240 MiB by itself, so the tree's RSS reaching 240 MiB
    # does not mean both blocks are there.
    hold = f"""
        import os, pathlib, time
        block = bytearray(b"x" * (120 * 1024 * 1024))  # touched: resident
        pathlib.Path({str(ready)!r}, str(os.getpid())).touch()
        while not pathlib.Path({str(go)!r}).exists():
            time.sleep(0.05)
    """
    child = _python(
        f"import subprocess, sys\nkid = subprocess.Popen({_python(hold)!r})\n"
        + textwrap.dedent(hold)
        + "kid.wait()\n"
    )
    proc = subprocess.Popen(procstats.wrapped(tmp_path / "usage.json", child))
    sampler = procstats.TreeSampler([proc.pid], pss_every=1)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            both_ready = len(list(ready.iterdir())) == 2  # before the sample that counts
            sample = sampler.sample()
            if both_ready and sample.processes == 2:
                break
            time.sleep(0.1)
    finally:
        go.touch()
        proc.wait(timeout=60)
    assert sampler.peak_processes == 2
    assert sampler.peak_rss_bytes >= 240 * 1024 * 1024  # both processes, not just the largest
    assert sampler.peak_pss_bytes >= 240 * 1024 * 1024
    assert sampler.samples[-1].cpu_s > 0
    cpu = [s.cpu_s for s in sampler.samples]
    assert cpu == sorted(cpu)
    assert procstats.TreeUsage.load(tmp_path / "usage.json").returncode == 0


def test_wrapper_forwards_sigterm_to_the_command(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = _python(
        f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(600)\n"
    )
    proc = subprocess.Popen(procstats.wrapped(tmp_path / "usage.json", child))
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.terminate()
    assert proc.wait(timeout=60) == 128 + 15
    assert procstats.TreeUsage.load(tmp_path / "usage.json").returncode == -15


def test_a_run_that_lost_records_is_reported_as_data_loss() -> None:
    exact = judge({"missing": 0, "duplicates": 0, "out_of_order": 0})
    assert exact["ok"] and exact["status"] == "exact"
    lost = judge({"missing": 3, "duplicates": 3})
    assert not lost["ok"]
    assert lost["status"].startswith("DATA LOST: 3 records missing")
    reordered = judge({"missing": 0, "out_of_order": 2})
    assert not reordered["ok"] and "out of order" in reordered["status"]


def test_thread_cores_names_the_busy_thread_and_not_the_idle_one(tmp_path: Path) -> None:
    """``procstats threads``: each thread's CPU over a window, grouped by its OS name with its
    digits as ``#``: a spinning thread named ``spin-7`` shows, a sleeping ``nap-3`` takes next to
    nothing."""
    ready = tmp_path / "ready"
    code = f"""
        import ctypes, pathlib, threading, time

        def named(name, work):
            def run():
                ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
                work()
            return threading.Thread(target=run, daemon=True)

        def spin():
            end = time.monotonic() + 30
            while time.monotonic() < end:
                pass

        named("spin-7", spin).start()
        named("nap-3", lambda: time.sleep(30)).start()
        pathlib.Path({str(ready)!r}).touch()
        time.sleep(30)
    """
    proc = subprocess.Popen(_python(code))
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        rows = procstats.thread_cores([proc.pid], 1.0)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    cores = {name: (count, used) for _pid, name, count, used in rows}
    # A busy machine gives the spinning thread less than a core, never next to nothing.
    assert cores["spin-#"][0] == 1 and cores["spin-#"][1] > 0.01, rows
    assert cores["nap-#"][0] == 1 and cores["nap-#"][1] < cores["spin-#"][1] / 20, rows
    assert rows[0][1] == "spin-#", rows  # busiest first
