"""A mirror job's life: it dies with its launcher, one flow runs in one job at a time, and a
cluster that stays away fails the flow after a bound (real Spark jobs, sandbox clusters)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mirrorflow.runtime import launch
from tests.conftest import create_topics
from tests.mirror_harness import ROOT, flow_file, produce, progress, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (children, grandchildren…): pid -> its command, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = {}, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        found[child] = " ".join(a.decode(errors="replace") for a in argv[:3])
        todo += children.get(child, [])
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def mirror_cli(config: Path, state: Path, log: Path, *flows: str, extra=()) -> subprocess.Popen:
    """``mirrorflow mirror`` as a shell starts a job: in a process group of its own."""
    command = [sys.executable, "-m", "mirrorflow.cli", "mirror", str(config)]
    for flow in flows or ("primary->secondary",):
        command += ["--flow", flow]
    command += ["--state-dir", str(state), "--master", "local[2]", *extra]
    return subprocess.Popen(
        command,
        stdout=open(log, "ab"),  # noqa: SIM115 (the child keeps it)
        stderr=subprocess.STDOUT,
        env=launch.job_environment(),
        cwd=ROOT,
        start_new_session=True,
    )


def kill_group(job: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(job.pid, signal.SIGKILL)
    job.wait(30)


def test_killing_the_launchers_process_group_leaves_no_process_of_the_job_running(
    sandbox, topic_name, tmp_path
):
    primary = sandbox["primary"]
    t = topic_name("orphan")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 20_000)
    config = flow_file(tmp_path, sandbox, t)
    state, log = tmp_path / "state", tmp_path / "mirror.log"
    job = mirror_cli(
        config,
        state,
        log,
        extra=("--max-records-per-batch", "100", "--local-batch-max-records", "0"),
    )
    tree: dict[int, str] = {}
    try:
        wait_for(lambda: progress(state).get("batches", 0) >= 2, 180, "the first batches")
        tree = descendants(job.pid)
        print("the job's processes:", *tree.values(), sep="\n  ")
        assert any("java" in command for command in tree.values()), tree
        assert any("mirror.py" in command for command in tree.values()), tree
        os.killpg(job.pid, signal.SIGKILL)  # as a shell or a supervisor kills a job
        job.wait(30)
        killed = time.monotonic()
        wait_for(
            lambda: not [pid for pid in tree if alive(pid)],
            20,
            "every process of the job to end with its launcher",
            interval=0.2,
        )
        gone_after = time.monotonic() - killed
        print(f"every process of the job ended {gone_after:.1f} s after its launcher")
        batches = progress(state).get("batches", 0)
        time.sleep(3)
        assert progress(state).get("batches", 0) == batches, "batches went on after the kill"
    finally:
        kill_group(job)
        for pid in tree:  # what outlived its launcher, should this test fail
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
