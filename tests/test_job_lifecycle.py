"""A mirror job's life: it dies with its launcher, one flow runs in one job at a time, and a
cluster that stays away fails the flow after a bound (real Spark jobs, sandbox clusters)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mirrorflow.runtime import jobs, launch, processes
from tests.conftest import create_topics
from tests.mirror_harness import (
    ROOT,
    copied,
    flow_file,
    free_port,
    mirror_command,
    produce,
    progress,
    read_topic,
    run_mirror_once,
    site_flow_file,
    start_mirror,
    stop_job,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

FLOW = "primary->secondary"
CLI = (sys.executable, "-m", "mirrorflow.cli", "mirror")


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (children, grandchildren…): pid -> its command."""
    return {p: " ".join(processes.command_line(p)[:3]) for p in processes.descendants(pid)}


def mirror_cli(config: Path, state: Path, log: Path, *flows: str, extra=()) -> subprocess.Popen:
    """``mirrorflow mirror`` as a shell starts a job: in a process group of its own."""
    command = [*CLI, str(config)]
    for flow in flows or ("primary->secondary",):
        command += ["--flow", flow]
    command += ["--state-dir", str(state), "--master", "local[2]", *extra]
    return subprocess.Popen(
        command,
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        env=launch.job_environment(),
        cwd=ROOT,
        start_new_session=True,
    )


def kill_group(job: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(job.pid, signal.SIGKILL)
    job.wait(30)


EXACTLY_ONCE = (
    "secondary.exactly.once.source.support = enabled",
    "primary.consumer.isolation.level = read_committed",
)


@pytest.mark.parametrize(
    "mode",
    # The job's processes are the same in both modes: the default suite kills the default mode's
    # (tests/test_faults.py SIGKILLs an exactly-once job), MIRRORFLOW_SLOW_TESTS=1 both.
    ["at-least-once", pytest.param("exactly-once", marks=pytest.mark.slow)],
)
def test_killing_the_launchers_process_group_leaves_no_process_of_the_job_running(
    mode, sandbox, topic_name, tmp_path
):
    primary = sandbox["primary"]
    t = topic_name("orphan")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 20_000)
    config = flow_file(tmp_path, sandbox, t, *(EXACTLY_ONCE if mode == "exactly-once" else ()))
    state, log = tmp_path / "state", tmp_path / "mirror.log"
    small = ("--max-records-per-batch", "100", "--local-batch-max-records", "0")
    job = mirror_cli(config, state, log, extra=small)
    tree: dict[int, str] = {}
    try:
        wait_for(lambda: progress(state).get("batches", 0) >= 2, 180, "the first batches")
        tree = descendants(job.pid)
        print(f"the job's processes ({mode}):", *tree.values(), sep="\n  ")
        assert any("java" in command for command in tree.values()), tree
        assert any("mirror.py" in command for command in tree.values()), tree
        os.killpg(job.pid, signal.SIGKILL)  # as a shell or a supervisor kills a job
        job.wait(30)
        killed = time.monotonic()
        # The job's guard asks the job to stop after its batch (the launcher is gone and
        # cannot): it ends by itself, well within its grace period (120 s).
        wait_for(
            lambda: not [pid for pid in tree if processes.alive(pid)],
            20,
            "every process of the job to end with its launcher",
            interval=0.2,
        )
        print(
            f"every process of the job ended {time.monotonic() - killed:.1f} s after its launcher"
        )
        assert progress(state).get("state") == "STOPPED", "the job was killed mid-batch"
        batches = progress(state).get("batches", 0)
        time.sleep(3)
        assert progress(state).get("batches", 0) == batches, "batches went on after the stop"
    finally:
        kill_group(job)
        for pid in tree:  # what outlived its launcher, should this test fail
            if processes.alive(pid):
                os.kill(pid, signal.SIGKILL)
    # The flow is free again: a new job of it starts (and would resume from its positions).
    jobs.check_leases(state, ["primary->secondary"])


LAUNCHER = """
import os, pathlib, signal, subprocess, sys, time
from mirrorflow.runtime import guard, launch
command, stop_file, delay = sys.argv[2:-2], pathlib.Path(sys.argv[-2]), float(sys.argv[-1])
job = subprocess.Popen(
    guard.guarded(command, stop_file, 60), env=launch.job_environment(), start_new_session=True
)
pathlib.Path(sys.argv[1]).write_text(str(job.pid))
time.sleep(delay)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_job_whose_launcher_dies_as_it_starts_it_never_outlives_it(sandbox, topic_name, tmp_path):
    """A launcher killed 0, 10 or 50 ms after it started the job (before the guard's Python
    could look for its parent: issue 27): every process of the job is gone within 2 s, and the
    flow starts again at once."""
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("launcher")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 300)
    config = flow_file(tmp_path, sandbox, t)
    state = tmp_path / "state"
    command = mirror_command(config, "primary->secondary", state)
    for delay in (0.0, 0.01, 0.05):
        pid_file = tmp_path / f"guard-{delay}.pid"
        arguments = [str(pid_file), *command, str(tmp_path / "stop"), str(delay)]
        launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, *arguments], cwd=ROOT)
        launcher.wait(30)
        died = time.monotonic()
        guard = int(pid_file.read_text())  # the job's session: the guard and all it starts
        try:
            wait_for(
                lambda: not processes.session_members(guard),  # noqa: B023 (called here)
                2,
                f"the job to end with its launcher (killed {delay * 1000:.0f} ms after it)",
                interval=0.05,
            )
        finally:
            for pid in processes.session_members(guard):
                os.kill(pid, signal.SIGKILL)
        print(f"{delay * 1000:.0f} ms: the job was gone {time.monotonic() - died:.2f} s later")
    run_mirror_once(config, "primary->secondary", state)  # the lease is free
    assert copied(read_topic(secondary, f"primary.{t}")) == copied(read_topic(primary, t))


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_two_workers_never_copy_one_flow_at_once_and_a_frozen_holder_is_fenced(
    mode, sandbox, topic_name, tmp_path
):
    """Two jobs of one flow with different state directories, as two Airflow workers start them
    (the file lease cannot see each other's): the second waits, then fails naming the first;
    the first freezes (SIGSTOP), the second takes the flow over within the lease's bound; the
    first wakes up fenced and ends in one line, and the copy is whole."""
    from mirrorflow.replication import lease

    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name(f"workers-{mode}")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 20_000)
    config = flow_file(tmp_path, sandbox, t, *(EXACTLY_ONCE if mode == "exactly-once" else ()))
    # Batches of 200: at least once as Spark jobs; exactly once in the driver, which keeps its
    # transactional producers from batch to batch (a frozen job's kept producers must not
    # commit once it wakes).
    small = ("--max-records-per-batch", "200") + (
        () if mode == "exactly-once" else ("--local-batch-max-records", "0")
    )
    one, two = tmp_path / "worker-1", tmp_path / "worker-2"
    first = start_mirror(config, FLOW, one, tmp_path / "first.log", *small)
    second = None
    try:
        wait_for(lambda: progress(one).get("batches", 0) >= 2, 180, "the first job's batches")
        # 1. The second worker's job: it waits for the lease, then fails naming the holder.
        busy = run_to_end(mirror_command(config, FLOW, two, *small), 240)
        assert busy.returncode == 2
        line = one_error_line(busy.stdout + busy.stderr)
        assert f"flow {FLOW} is already running in another mirror job (pid " in line, line
        assert f"state {one})" in line or f"state {one};" in line, line
        assert progress(one).get("state") in ("RUNNING", "IDLE"), "the holder was disturbed"

        # 2. The holder freezes; the second worker's job takes over within the bound.
        os.killpg(first.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        # The second copies what is left in batches of its default size: the claims are about
        # the first's batches (fenced, at most one repeated) and about when the second starts.
        second = start_mirror(config, FLOW, two, tmp_path / "second.log")
        produce(primary, t, 2, 1_000, start=20_000)  # only the second job can copy these
        wait_for(lambda: progress(two).get("batches", 0) >= 1, 180, "the second job's batches")
        took = time.monotonic() - frozen
        print(f"{mode}: the second job copied {took:.1f} s after the first froze")
        assert took <= lease.EXPIRY_S + lease.RENEW_S + 60  # the bound, and a Spark start

        # 3. The first wakes up: fenced, it ends in one line; the second copies on.
        os.killpg(first.pid, signal.SIGCONT)
        assert first.wait(60) == 2
        log = (tmp_path / "first.log").read_text()
        assert f"flow {FLOW} lost its lease on secondary to another job" in log, log[-3000:]
        if mode == "exactly-once":  # the batches the freeze caught were the driver's
            assert "offset syncs (in the driver) from" in log, log[-3000:]
            # Woken without its lease, it fenced nothing: fencing then would have killed the
            # second job's producer, and ended that job (a suite run saw it).
            assert "are aborted; nothing of it is visible" not in log, log[-3000:]
        assert second.poll() is None, (tmp_path / "second.log").read_text()[-3000:]
        produce(primary, t, 2, 1_000, start=21_000)
        source = stamps(primary, t)
        assert len(source) == 22_000
        wait_for(lambda: stamps(secondary, f"primary.{t}") == source, 180, "every record copied")
    finally:
        for job in (first, second):
            if job is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.pid, signal.SIGCONT)
                stop_job(job)
    copies = [r[4] for rs in read_topic(secondary, f"primary.{t}").values() for r in rs]
    twice = len(copies) - len(set(copies))
    print(f"{mode}: {twice} records copied twice")
    if mode == "exactly-once":  # nothing the fenced job wrote after its freeze is visible
        assert twice == 0
    else:  # at least once: only the batch it had in flight; it starts no batch once fenced
        assert twice <= int(small[1]), twice


def run_to_end(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``command`` run to its end from the repository, as a user runs it, its output kept."""
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=launch.job_environment(),
        cwd=ROOT,
        timeout=timeout,
    )


def stamps(cluster, topic: str) -> set[int]:
    """The timestamps of ``topic``'s records: ``produce`` gives each record its own."""
    return {r[4] for records in read_topic(cluster, topic).values() for r in records}


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("mirrorflow: error:")]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


@pytest.mark.airflow
def test_a_flow_runs_in_one_job_at_a_time_however_the_second_is_started(
    sandbox, topic_name, tmp_path
):
    from airflow.sdk.exceptions import AirflowException

    from mirrorflow.airflow.operators import MirrorFlowOperator

    flows = {"primary->secondary": topic_name("a"), "tertiary->secondary": topic_name("b")}
    config = site_flow_file(tmp_path, sandbox, flows, 10_000)
    state, log = tmp_path / "state", tmp_path / "site.log"
    small = ("--max-records-per-batch", "100", "--local-batch-max-records", "0")
    site = mirror_cli(config, state, log, *flows, extra=small)
    try:
        wait_for(
            lambda: all(progress(state, f.replace("->", "-")).get("batches", 0) for f in flows),
            180,
            "both flows of the site job to copy",
        )
        # A second `mirrorflow mirror` of one of its flows: one line, before any Spark starts.
        started = time.monotonic()
        second = run_to_end(
            [*CLI, str(config), "--flow", "tertiary->secondary", "--state-dir", str(state)], 60
        )
        assert second.returncode == 2
        line = one_error_line(second.stderr)
        assert "flow tertiary->secondary is already running in another mirror job" in line
        pid = line.split("(pid ", 1)[1].split(",")[0]
        assert f"what to do: `kill {pid}` stops it after its batch" in second.stderr, second.stderr
        assert time.monotonic() - started < 15
        # The same job started any other way (spark-submit, a benchmark): its driver refuses.
        direct = run_to_end(mirror_command(config, "tertiary->secondary", state), 240)
        assert direct.returncode == 2
        line = one_error_line(direct.stdout + direct.stderr)  # the driver's stderr: stdout
        assert "flow tertiary->secondary is already running" in line, line
        # A DAG run of it: the task fails with the one line.
        operator = MirrorFlowOperator(
            task_id="mirror",
            flows=["primary->secondary"],
            flow_files=[str(config)],
            state_dir=str(state),
        )
        with pytest.raises(AirflowException, match="already running in another") as failed:
            operator.execute({})
        assert "\n" not in str(failed.value)
        holder = str(failed.value).split("(pid ", 1)[1].split(",")[0]
        assert holder.isdigit() and processes.alive(int(holder))
        assert "mirror.py" in descendants(site.pid).get(int(holder), ""), "not the site's driver"
        # The site job went on all along: it copies what arrives now (in batches, or in its
        # stream if it has caught up with its backlog meanwhile).
        before = progress(state).get("records", 0)
        produce(sandbox["primary"], flows["primary->secondary"], 2, 50, start=10_000)
        wait_for(lambda: progress(state).get("records", 0) > before, 60, "the site job to go on")
        assert site.poll() is None
    finally:
        stop_job(site)


def test_a_cluster_that_stays_unreachable_fails_the_job_in_one_line_after_the_retry_timeout(
    sandbox, topic_name, tmp_path
):
    primary = sandbox["primary"]
    t = topic_name("away")
    create_topics(primary, t, partitions=1)
    produce(primary, t, 1, 10)
    config = flow_file(tmp_path, sandbox, t)
    away = f"127.0.0.1:{free_port()}"  # nothing listens there
    text = re.sub(
        r"(?m)^secondary\.bootstrap\.servers = .*$",
        f"secondary.bootstrap.servers = {away}",
        config.read_text(),
    )
    config.write_text(text)
    log = tmp_path / "mirror.log"
    started = time.time()
    job = mirror_cli(config, tmp_path / "state", log, extra=("--retry-timeout", "75"))
    try:
        driver_started = wait_for(
            lambda: (
                job.poll() is not None
                or ("mirror.py" in " ".join(descendants(job.pid).values()) and time.time())
            ),
            120,
            "the job's driver to start",
            interval=0.5,
        )
        code = job.wait(200)
    finally:
        kill_group(job)
    ended = time.time()
    output = log.read_text(errors="replace")
    assert code == 2, output[-3000:]
    line = one_error_line(output)
    assert "cluster secondary did not answer" in line, line
    assert "gave up after" in line and "--retry-timeout 75" in line, line
    assert "secondary.bootstrap.servers" in line, line
    retries = [ln for ln in output.splitlines() if "retrying in" in ln]
    assert retries and "the flow fails by 75s" in retries[0], output[-3000:]
    # Within the bound (each try waits up to 30 s for the target: two tries fit in 75 s),
    # plus the Spark session's start, counted from the driver's start (the JVM that starts
    # it takes seconds on an idle machine, a minute on a loaded one).
    assert driver_started is not True, "the job ended before its driver started"
    print(
        f"the job failed {ended - started:.0f}s after its start, {ended - driver_started:.0f}s "
        f"after its driver's, after {len(retries)} retries"
    )
    assert ended - driver_started < 75 + 30, output[-3000:]


def test_a_test_run_that_crashes_leaves_no_sandbox_broker_behind(tmp_path):
    directory = tmp_path / "sandbox"
    assert_dies_with_its_crashed_caller(
        "from mirrorflow.devtools import sandbox\n"
        "sandbox.DIE_WITH_CALLER = True  # as tests/conftest.py sets it\n"
        "port = sandbox.free_port_block(sandbox.PORTS_PER_CLUSTER)\n"
        f"box = sandbox.up(['crash'], __import__('pathlib').Path({str(directory)!r}), port)\n"
        "print(box['crash'].pid, flush=True)\n",
        "the broker",
    )


def test_a_test_run_that_crashes_leaves_no_airflow_service_behind(tmp_path):
    """As a broker: a service a crashed test run started through :class:`LocalAirflow` ends with
    it (the api-server rewrites its environment, so the check for leftovers cannot find it).
    The service here is a stand-in for ``airflow <service>`` that sleeps."""
    fake = tmp_path / "airflow"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    assert_dies_with_its_crashed_caller(
        "import pathlib\n"
        "from mirrorflow.devtools import local_airflow\n"
        "local_airflow.DIE_WITH_CALLER = True  # as tests/conftest.py sets it\n"
        "class Fake(local_airflow.LocalAirflow):\n"
        f"    def _airflow(self): return {str(fake)!r}\n"
        f"home = pathlib.Path({str(tmp_path / 'home')!r})\n"
        "airflow = Fake(home, home.parent / 'state', say=lambda _text: None)\n"
        "airflow.start_services(('scheduler',))\n"
        "print(airflow.running_services()['scheduler'], flush=True)\n",
        "the service",
    )


def assert_dies_with_its_crashed_caller(start: str, what: str) -> None:
    """Runs ``start`` (Python that starts a process and prints its pid) in a process that then
    segfaults: the process it started must end within 10 s."""
    crashing = (
        f"import ctypes, sys\n{start}sys.stdin.readline()\nctypes.string_at(0)  # a segfault\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", crashing],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    started = int(run.stdout.readline())
    try:
        assert processes.alive(started)
        run.stdin.write("\n")
        run.stdin.flush()
        assert run.wait(30) == -signal.SIGSEGV
        wait_for(
            lambda: not processes.alive(started),
            10,
            f"{what} to die with its crashed caller",
            0.2,
        )
    finally:
        if processes.alive(started):
            os.kill(started, signal.SIGKILL)


def test_an_idle_flow_whose_target_goes_away_fails_after_the_retry_timeout(
    sandbox, topic_name, tmp_path
):
    from mirrorflow.devtools import sandbox as sandbox_mod

    primary = sandbox["primary"]
    t = topic_name("gone")
    create_topics(primary, t, partitions=1)
    produce(primary, t, 1, 10)
    config = flow_file(tmp_path, sandbox, t)
    state, log = tmp_path / "state", tmp_path / "mirror.log"
    bound = 15  # seconds; short, so the test waits little (any bound is honoured alike)
    job = mirror_cli(config, state, log, extra=("--retry-timeout", str(bound)))
    try:
        wait_for(lambda: progress(state).get("state") == "IDLE", 180, "the flow to copy and idle")
        sandbox_mod.down(sandbox.directory, ["secondary"])
        gone = time.monotonic()
        code = job.wait(120)
        failed_after = time.monotonic() - gone
    finally:
        kill_group(job)
        sandbox_mod.up(["secondary"], sandbox.directory)
    output = log.read_text(errors="replace")
    assert code == 2, output[-3000:]
    line = one_error_line(output)
    assert "cluster secondary did not" in line and "gave up after" in line, line
    assert "check secondary.bootstrap.servers" in line, line
    print(f"the idle flow failed {failed_after:.0f}s after its target went away")
    assert bound <= failed_after < bound + 40, failed_after
    assert progress(state)["state"] == "FAILED"
