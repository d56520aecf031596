"""MirrorFlowOperator's stop paths, Params and Spark connection, with stand-in job processes
(no Spark)."""

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
        flow="primary->secondary",
        flow_files=["examples/active-passive.properties"],
        state_dir=str(tmp_path / "flows"),
        stop_grace_period=timedelta(seconds=20),
        pause_check_interval=0.2,
    )
    op._job_files = jobs.JobFiles.for_flow(op.flow, op.state_dir)
    op._job_files.directory.mkdir(parents=True)
    return op


def fake_job(files: jobs.JobFiles, obeys_stop_file: bool) -> subprocess.Popen:
    """A process like the mirror job: its own group, the stop file on its command line."""
    loop = (
        "import pathlib, sys, time\n"
        "stop = pathlib.Path(sys.argv[2])\n"
        f"while not ({obeys_stop_file} and stop.exists()): time.sleep(0.1)\n"
        "time.sleep(1)  # finishing its batch\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", loop, "--stop-file", str(files.stop_file)],
        start_new_session=True,
    )


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
    from mirrorflow.airflow.operators import _JobWatcher

    answers = iter([False, False, True])
    ti = SimpleNamespace(
        dag_id="mirror__primary__secondary",
        get_dag=lambda dag_id: SimpleNamespace(is_paused=next(answers, True)),
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
    from mirrorflow.airflow.operators import _JobWatcher

    ti = SimpleNamespace(dag_id="d", get_dag=lambda dag_id: SimpleNamespace(is_paused=True))
    watcher = _JobWatcher(operator, SimpleNamespace(process=None), operator._job_files, {"ti": ti})
    watcher.start()
    time.sleep(1)  # five checks
    watcher.stop()
    assert not watcher.paused and not operator._job_files.stop_file.exists()


def test_params_choose_the_start_position_and_restart_asks_the_job_to_start_over(operator):
    files = operator._job_files
    assert operator._start_position({"starting_offsets": "default"}, files) is None
    assert operator._start_position({"starting_offsets": "latest"}, files) == "latest"
    when = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    position = operator._start_position(
        {"starting_offsets": "timestamp", "starting_timestamp": "2026-03-01T12:00:00Z"}, files
    )
    assert position == str(int(when.timestamp() * 1000))
    assert not files.restart_file.exists(), "a start position alone must not restart the flow"
    params = {"starting_offsets": "earliest", "restart": True}
    assert operator._start_position(params, files) == "earliest"
    assert files.restart_file.exists()
    # A retry of the same run resumes from what its first try copied: no second restart.
    files.restart_file.unlink()
    assert operator._start_position(params, files, first_try=False) == "earliest"
    assert not files.restart_file.exists()
    from airflow.sdk.exceptions import AirflowException

    with pytest.raises(AirflowException, match="needs starting_timestamp"):
        operator._start_position({"starting_offsets": "timestamp"}, files)


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
