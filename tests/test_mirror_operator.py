"""MirrorFlowOperator's stop and pause paths and Spark connection, FlowControlOperator's
Params, with stand-in job processes (no Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from mirrorflow.runtime import jobs
from tests.mirror_harness import fake_job

pytestmark = pytest.mark.airflow


@pytest.fixture
def operator(tmp_path, monkeypatch):
    # A Spark connection from the environment, as a deployment may define it.
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"})
    )
    from mirrorflow.airflow.operators import MirrorFlowOperator

    op = MirrorFlowOperator(
        task_id="mirror",
        flows=["primary->secondary", "tertiary->secondary"],
        flow_dags={
            "primary->secondary": "flow__primary__secondary",
            "tertiary->secondary": "flow__tertiary__secondary",
        },
        flow_files=["examples/active-passive.properties"],
        state_dir=str(tmp_path / "flows"),
        stop_grace_period=timedelta(seconds=20),
        pause_check_interval=0.2,
    )
    op._job_files = jobs.JobFiles.for_flows(op.flows, op.state_dir)
    op._job_files.directory.mkdir(parents=True)
    return op


def test_killing_the_task_lets_the_job_finish_its_batch_instead_of_killing_it(operator):
    from mirrorflow.airflow.hooks import MirrorJobHook

    operator._hook = MirrorJobHook(operator.conn_id)
    assert operator._hook.master() == "local[1]"
    job = fake_job(operator._job_files, obeys_stop_file=True)
    operator._hook.process = job
    started = time.monotonic()
    operator.on_kill()  # what Airflow calls when the task is marked failed or times out
    assert operator._job_files.stop_file.exists()
    assert job.wait(1) == 0, "the job was killed instead of stopping by itself"
    assert time.monotonic() - started < 15


def test_a_job_that_ignores_the_stop_request_is_killed_after_the_grace_period(operator):
    operator.stop_grace_period = 2
    from mirrorflow.airflow.hooks import MirrorJobHook

    operator._hook = MirrorJobHook(operator.conn_id)
    job = fake_job(operator._job_files, obeys_stop_file=False)
    operator._hook.process = job
    started = time.monotonic()
    operator.on_kill()
    assert job.wait(5) < 0  # killed by a signal
    assert 2 <= time.monotonic() - started < 2 + jobs.KILL_WAIT


def test_pausing_the_dag_while_the_job_runs_asks_it_to_stop(operator):
    from mirrorflow.airflow.operators.mirror import _JobWatcher

    answers = iter([False, False, True])
    ti = SimpleNamespace(
        dag_id="mirror__secondary",
        get_dag=lambda dag_id: SimpleNamespace(
            is_paused=next(answers, True) if dag_id == "mirror__secondary" else False
        ),
    )
    watcher = _JobWatcher(operator, SimpleNamespace(process=None), operator._job_files, {"ti": ti})
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while not operator._job_files.stop_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        watcher.stop()
    assert watcher.paused and operator._job_files.stop_file.exists()


def test_a_dag_already_paused_when_the_run_starts_keeps_its_job_running(operator):
    from mirrorflow.airflow.operators.mirror import _JobWatcher

    ti = SimpleNamespace(dag_id="d", get_dag=lambda dag_id: SimpleNamespace(is_paused=True))
    watcher = _JobWatcher(operator, SimpleNamespace(process=None), operator._job_files, {"ti": ti})
    watcher.start()
    time.sleep(1)  # five checks
    watcher.stop()
    assert not watcher.paused and not operator._job_files.stop_file.exists()


def test_a_flow_is_paused_while_its_own_dag_is_and_resumed_when_unpaused(operator):
    from mirrorflow.airflow.operators.mirror import _JobWatcher

    paused = {"mirror__secondary": False, "flow__tertiary__secondary": True}
    ti = SimpleNamespace(
        dag_id="mirror__secondary",
        get_dag=lambda dag_id: SimpleNamespace(is_paused=paused.get(dag_id, False)),
    )
    files = operator._job_files
    one, other = (files.flow_dir(f) / jobs.PAUSED_FILE for f in operator.flows)
    one.parent.mkdir(parents=True, exist_ok=True)
    one.touch()  # left from an earlier run: its DAG is unpaused now
    watcher = _JobWatcher(operator, SimpleNamespace(process=None), files, {"ti": ti})
    watcher.sync_flow_pauses()  # before the job starts: a paused flow does not start at all
    assert other.exists() and not one.exists()
    watcher.start()
    try:
        paused["flow__tertiary__secondary"] = False
        paused["flow__primary__secondary"] = True
        deadline = time.monotonic() + 10
        while (other.exists() or not one.exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        watcher.stop()
    assert one.exists() and not other.exists()
    assert not watcher.paused and not files.stop_file.exists(), "the whole job was stopped"


@pytest.fixture
def control(tmp_path):
    from mirrorflow.airflow.operators import FlowControlOperator

    return FlowControlOperator(
        task_id="control",
        flow="tertiary->secondary",
        state_dir=str(tmp_path / "flows"),
        wait_timeout=timedelta(seconds=10),
    )


def test_params_give_the_start_position():
    from airflow.sdk.exceptions import AirflowException

    from mirrorflow.airflow.operators.flow_control import start_position

    assert start_position({"starting_offsets": "default"}) is None
    assert start_position({}) is None
    assert start_position({"starting_offsets": "latest"}) == "latest"
    when = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    stamp = {"starting_offsets": "timestamp", "starting_timestamp": "2026-03-01T12:00:00Z"}
    assert start_position(stamp) == str(int(when.timestamp() * 1000))
    with pytest.raises(AirflowException, match="needs starting_timestamp"):
        start_position({"starting_offsets": "timestamp"})
    with pytest.raises(AirflowException, match="must be one of"):
        start_position({"starting_offsets": "beginning"})


def test_a_flow_run_with_restart_asks_the_running_job_to_start_the_flow_over(control):
    import threading

    flow_dir = control.flow_dir
    flow_dir.mkdir(parents=True)
    (flow_dir / jobs.PROGRESS_FILE).write_text(json.dumps({"state": "RUNNING", "records": 7}))
    # A start position alone does not move a flow that has progress.
    assert control.execute({"params": {"starting_offsets": "latest"}})["records"] == 7
    assert jobs.restart_request(flow_dir) is None

    def running_job_takes_the_request():  # as the application and the driver do
        while jobs.restart_request(flow_dir) != "earliest":
            time.sleep(0.05)
        (flow_dir / jobs.RESTART_FILE).unlink()

    taker = threading.Thread(target=running_job_takes_the_request)
    taker.start()
    started = time.monotonic()
    control.execute({"params": {"starting_offsets": "earliest", "restart": True}})
    taker.join(5)
    assert time.monotonic() - started < 5, "the task did not see the request taken"
    # Without a running job the request stays for the flow's next start.
    control.wait_timeout = 1
    control.execute({"params": {"starting_offsets": "default", "restart": True}})
    assert jobs.restart_request(flow_dir) == ""  # the job's own start position


def test_a_start_position_starts_a_flow_without_progress_there(control):
    control.wait_timeout = 0
    control.execute({"params": {"starting_offsets": "latest"}})
    assert jobs.restart_request(control.flow_dir) == "latest"


def test_a_missing_flow_file_fails_the_task_naming_it(operator):
    from airflow.sdk.exceptions import AirflowException

    operator.flow_files = ["examples/no-such-flow.properties"]
    with pytest.raises(AirflowException, match=r"no-such-flow\.properties"):
        operator._flow_file_paths()


@pytest.mark.parametrize(
    ("connection", "master"),
    [
        ({"conn_type": "spark", "host": "local[2]"}, "local[2]"),
        (
            {"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077},
            "spark://127.0.0.1:7077",
        ),
        (None, "local[*]"),  # no spark_default: local, as `mirrorflow mirror` runs it
    ],
)
def test_the_spark_master_comes_from_the_airflow_connection(monkeypatch, connection, master):
    from mirrorflow.airflow.hooks import MirrorJobHook

    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    if connection is not None:
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(connection))
    assert MirrorJobHook().master() == master


def test_a_named_spark_connection_that_does_not_exist_fails_the_task_naming_it(monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    from mirrorflow.airflow.hooks import MirrorJobHook

    with pytest.raises(AirflowException, match="'spark_prod' does not exist"):
        MirrorJobHook("spark_prod").master()


def test_the_job_is_launched_in_its_own_process_group_and_its_error_line_is_kept(tmp_path):
    from mirrorflow.airflow.hooks import MirrorJobHook

    hook = MirrorJobHook()
    script = "import os, pathlib, sys; "
    script += "pathlib.Path('group').write_text(str(os.getpgid(0) == os.getpid())); "
    script += "print('mirrorflow: error: flow a->b stopped: refused'); sys.exit(2)"
    code = hook.submit([sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ))
    assert code == 2
    assert (tmp_path / "group").read_text() == "True", "the job shares the task's process group"
    assert hook.error_line == "mirrorflow: error: flow a->b stopped: refused"


def test_a_standalone_master_without_its_secret_fails_the_task_in_one_line(operator, monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT",
        json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}),
    )
    monkeypatch.delenv("MIRRORFLOW_SPARK_PROPERTIES", raising=False)
    with pytest.raises(AirflowException, match="needs the cluster's shared secret") as failed:
        operator.execute({})
    assert "\n" not in str(failed.value)


def test_a_flow_held_by_a_failover_stays_paused_though_its_dag_is_unpaused(operator):
    from mirrorflow.airflow.operators.mirror import _JobWatcher

    ti = SimpleNamespace(
        dag_id="mirror__secondary", get_dag=lambda dag_id: SimpleNamespace(is_paused=False)
    )
    files = operator._job_files
    held, other = (files.flow_dir(f) for f in operator.flows)
    jobs.hold(held, "failover manual__1")
    jobs.set_paused(other, True)
    watcher = _JobWatcher(operator, SimpleNamespace(process=None), files, {"ti": ti})
    watcher.sync_flow_pauses()
    assert (held / jobs.PAUSED_FILE).exists() and jobs.held(held) == "failover manual__1"
    assert not (other / jobs.PAUSED_FILE).exists()  # its DAG is unpaused: it runs
    assert jobs.release(held) and jobs.held(held) is None
    watcher.sync_flow_pauses()
    assert not (held / jobs.PAUSED_FILE).exists()


STAND_IN_JOB = """
import os, pathlib, sys, time
from mirrorflow.runtime import guard
pid_file, stop_file = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
if sys.argv[3] == "copying":
    guard.copying()  # as the driver does once it runs its flows
pid_file.write_text(str(os.getpid()))
while not stop_file.exists():
    try:
        print("copying a batch", flush=True)  # as the JVM logs: a dead reader does not end it
    except OSError:
        pass
    time.sleep(0.1)
time.sleep(1)  # the batch in flight
(pid_file.parent / "stopped-after-its-batch").touch()
"""


def task_running_a_job(
    tmp_path, stop_file, grace: float, copying: bool = False, hook: bool = False
) -> tuple[subprocess.Popen, int]:
    """A stand-in Airflow task that started a stand-in job (which stops only when asked) under
    the job's guard, as the operator does: through the real ``MirrorJobHook`` (which reads the
    job's output through a pipe), or by a plain ``Popen``. Returns the task and the job's pid."""
    pid_file = tmp_path / "job.pid"
    job = [sys.executable, "-c", STAND_IN_JOB, str(pid_file), str(stop_file)]
    job.append("copying" if copying else "starting")
    if hook:
        start = (
            "from mirrorflow.airflow.hooks import MirrorJobHook\n"
            f"MirrorJobHook().submit(guard.guarded({job!r}, {str(stop_file)!r}, {grace}),"
            " cwd=pathlib.Path.cwd(), env=os.environ)\n"
        )
    else:
        start = (
            f"subprocess.Popen(guard.guarded({job!r}, {str(stop_file)!r}, {grace}),"
            " start_new_session=True)\n"
        )
    task = (
        "import os, pathlib, subprocess, sys, time\n"
        "from mirrorflow.runtime import guard\n" + start + "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", task], start_new_session=True)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the stand-in job did not start"
        time.sleep(0.05)
    return process, int(pid_file.read_text())


def test_a_job_whose_task_is_killed_before_it_copies_ends_at_once(tmp_path):
    stop_file = tmp_path / "stop"
    task, job = task_running_a_job(tmp_path, stop_file, grace=60)
    os.killpg(task.pid, 9)  # the task's process group: the job, in its own, is not hit
    task.wait(5)
    started = time.monotonic()
    assert jobs.wait_for_exit(job, 5), "the job outlived its task"
    assert time.monotonic() - started < 2
    assert not (tmp_path / "stopped-after-its-batch").exists()


def test_a_job_asked_to_stop_gets_its_grace_period_after_its_task_is_killed(tmp_path):
    stop_file = tmp_path / "stop"
    task, job = task_running_a_job(tmp_path, stop_file, grace=4, copying=True)
    stop_file.touch()  # on_kill asked the job to stop; Airflow kills the task 5 s later
    os.killpg(task.pid, 9)
    task.wait(5)
    assert not jobs.wait_for_exit(job, 0.5), "the job was killed before its batch ended"
    assert jobs.wait_for_exit(job, 6), "the job outlived its grace period"
    assert (tmp_path / "stopped-after-its-batch").exists()


def test_a_copying_job_whose_airflow_task_is_sigkilled_finishes_its_batch(tmp_path):
    """No stop request, the output pipe broken by the task's death: the job's guard asks the
    job to stop itself (issue 27: it used to die of the broken pipe 0.05 s later)."""
    stop_file = tmp_path / "stop"
    task, job = task_running_a_job(tmp_path, stop_file, grace=30, copying=True, hook=True)
    time.sleep(0.5)  # the hook copies the job's output into the task's log
    os.killpg(task.pid, 9)
    task.wait(5)
    killed = time.monotonic()
    assert jobs.wait_for_exit(job, 10), "the job did not stop after its batch"
    assert (tmp_path / "stopped-after-its-batch").exists(), "the job was killed mid-batch"
    assert time.monotonic() - killed >= 0.9, "the batch in flight was cut short"
    assert stop_file.exists()  # the guard's stop request


def test_a_flows_lease_is_held_by_one_process_and_freed_when_it_dies_however(tmp_path):
    state = tmp_path / "flows"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from mirrorflow.runtime import jobs\n"
            f"jobs.hold_leases({str(state)!r}, ['a->t', 'b->t'])\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(jobs.FlowBusy) as busy:
            jobs.check_leases(state, ["b->t"])
        assert f"flow b->t is already running in another mirror job (pid {holder.pid}," in str(
            busy.value
        )
        assert f"`kill {holder.pid}` stops it after its batch" in str(busy.value)
        jobs.check_leases(state, ["c->t"])  # per flow: another flow into t is free
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own
        holder.wait()
    jobs.check_leases(state, ["a->t", "b->t"], wait_s=2)
