"""Processes read through psutil (mirrorflow.runtime.processes) and what is built on them: a
job's identity by its command line, its tree, a session's members; an ended process that its
parent has not reaped yet counts as ended."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mirrorflow.devtools import faults, local_airflow
from mirrorflow.health import status
from mirrorflow.runtime import jobs, launch, processes

SLEEPER = "import sys, time; time.sleep(float(sys.argv[1]))"
# A parent that starts a child in the background and sleeps: a tree of three.
TREE = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', 'grandchild'])\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts, ended (their sessions too) and reaped afterwards."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        for pid in [process.pid, *processes.descendants(process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(10)


def start(started: list[subprocess.Popen], *argv: str, **options) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, *argv], **options)
    started.append(process)
    return process


def eventually(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_process_is_alive_until_it_ends_even_unreaped(started):
    process = start(started, "-c", SLEEPER, "60", "--marker")
    assert processes.alive(process.pid)
    # (eventually: until the child has exec'd, it shows the parent's command line)
    assert eventually(lambda: processes.command_line(process.pid)[-2:] == ["60", "--marker"])
    created = processes.created(process.pid)
    assert created is not None and abs(created - time.time()) < 60
    os.kill(process.pid, signal.SIGKILL)
    # Not reaped (no wait): a zombie, which counts as ended, at once.
    assert processes.wait_for_exit(process.pid, 10, interval=0.05)
    assert not processes.alive(process.pid)
    assert process.poll() == -signal.SIGKILL  # nothing took its exit status
    assert not processes.alive(process.pid)  # reaped: gone
    assert processes.command_line(process.pid) == []
    assert processes.created(process.pid) is None
    for nobody in (0, -1):
        assert not processes.alive(nobody)


def test_wait_for_exit_reaps_a_child_only_when_asked(started):
    process = start(started, "-c", SLEEPER, "60")
    os.kill(process.pid, signal.SIGTERM)
    assert processes.wait_for_exit(process.pid, 10, interval=0.05, reap=True)
    assert eventually(lambda: not psutil.pid_exists(process.pid))  # no zombie left


def test_wait_for_exit_times_out_on_a_running_process(started):
    process = start(started, "-c", SLEEPER, "60")
    began = time.monotonic()
    assert not processes.wait_for_exit(process.pid, 0.3, interval=0.05)
    assert 0.3 <= time.monotonic() - began < 5


def test_descendants_and_session_members_reach_grandchildren(started):
    parent = start(started, "-c", TREE, start_new_session=True)
    # Until the child has exec'd, it is a fork of the parent with the parent's command line.
    assert eventually(
        lambda: [
            pid
            for pid in processes.descendants(parent.pid)
            if "grandchild" in processes.command_line(pid)
        ]
    )
    (child,) = processes.descendants(parent.pid)
    assert sorted(processes.session_members(parent.pid)) == sorted([parent.pid, child])
    assert processes.descendants(child) == []
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    # The orphan is no descendant any more, but still a member of the session.
    assert processes.descendants(parent.pid) == []
    assert processes.session_members(parent.pid) == [child]
    os.kill(child, signal.SIGKILL)
    assert eventually(lambda: processes.session_members(parent.pid) == [])


def test_spark_python_workers_are_found_by_their_command_line(started, tmp_path):
    daemon = tmp_path / "pyspark.daemon.py"  # as `python -m pyspark.daemon` names itself
    daemon.write_text("import time; time.sleep(60)\n")
    parent = start(
        started,
        "-c",
        f"import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(daemon)!r}])\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"time.sleep(60)\n",
    )
    # Both children exec'd (a child not yet exec'd has its parent's command line).
    children = [[str(daemon)], ["-c", "import time; time.sleep(60)"]]
    assert eventually(
        lambda: (
            sorted(processes.command_line(p)[1:] for p in processes.descendants(parent.pid))
            == sorted(children)
        )
    )
    (worker,) = faults.python_workers(parent.pid)
    assert str(daemon) in processes.command_line(worker)


def test_a_job_is_known_by_its_stop_file_and_its_flows(started, tmp_path):
    state = tmp_path / "state"
    flow = "A->B"
    files = jobs.JobFiles.for_flow(flow, state)
    job = tmp_path / "spark_jobs" / launch.MIRROR_JOB.name  # a driver's command line, sleeping
    job.parent.mkdir()
    job.write_text("import time; time.sleep(60)\n")
    driver = start(
        started,
        str(job),
        *("--flow", flow, "--state-dir", str(state), "--stop-file", str(files.stop_file)),
    )
    other = subprocess.Popen(["sleep", "60"])  # this interpreter's path may say "mirrorflow"
    started.append(other)
    assert eventually(lambda: processes.command_line(driver.pid)[1:2] == [str(job)])
    assert files.is_job(driver.pid)
    assert not files.is_job(other.pid)
    assert jobs.mirror_processes(state, flow) == [driver.pid]
    assert jobs.mirror_processes(state, "B->A") == []
    assert jobs.mirror_processes(tmp_path / "elsewhere", flow) == []
    progress = {"pid": driver.pid, "host": socket.gethostname()}
    assert status.job_alive(progress) is True
    assert status.job_alive({**progress, "pid": other.pid}) is False  # no "mirror" in its line
    assert status.job_alive({**progress, "host": "another-host"}) is None
    os.kill(driver.pid, signal.SIGKILL)
    assert processes.wait_for_exit(driver.pid, 10, interval=0.05)
    assert not files.is_job(driver.pid)
    assert jobs.mirror_processes(state, flow) == []
    assert status.job_alive(progress) is False


def test_a_job_without_state_dir_is_known_by_its_own_state_not_the_finders(
    started, tmp_path, monkeypatch
):
    """A driver started without ``--state-dir`` keeps its state where its own environment says
    (``$MIRRORFLOW_STATE``): another process with another state (another pytest worker, another
    user's shell) must not take it for one of its own jobs."""
    flow = "A->B"
    job = tmp_path / "spark_jobs" / launch.MIRROR_JOB.name
    job.parent.mkdir()
    job.write_text("import time; time.sleep(60)\n")
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    driver = start(
        started,
        str(job),
        "--flow",
        flow,
        env={**os.environ, "MIRRORFLOW_STATE": str(theirs)},
    )
    assert eventually(lambda: processes.command_line(driver.pid)[1:2] == [str(job)])
    monkeypatch.setenv("MIRRORFLOW_STATE", str(ours))
    assert jobs.mirror_processes(jobs.default_state_dir(), flow) == []
    assert jobs.mirror_processes(theirs / "flows", flow) == [driver.pid]


def test_a_recorded_airflow_service_is_known_by_its_pid_and_start_time(started):
    service = start(started, "-c", SLEEPER, "60")
    record = {"pid": service.pid, "created": processes.created(service.pid)}
    assert local_airflow._is_service(record)
    assert not local_airflow._is_service({**record, "created": record["created"] - 5})
    assert not local_airflow._is_service({"pid": service.pid, "start": 123})  # an old record
    assert not local_airflow._is_service({"pid": "x", "created": record["created"]})
    service.kill()
    service.wait(10)
    assert not local_airflow._is_service(record)


def test_no_code_reads_proc_by_hand():
    """Processes are read through psutil (the kernel's settings, /proc/sys, are not processes)."""
    root = Path(__file__).resolve().parent.parent / "mirrorflow"
    by_hand = [
        f"{path.relative_to(root.parent)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if '"/proc' in line and '"/proc/sys/' not in line
    ]
    assert by_hand == []
