"""The generated DAGs run by Airflow (``dag.test()``) against real clusters and Spark: a site's
mirror DAG runs its flows' job (or an application's, for sites co-located in one); a flow's own
DAG pauses that flow alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mirrorflow.runtime import jobs
from tests.conftest import create_topics
from tests.dag_harness import finish, render_into_dags_folder, start_dag_test
from tests.mirror_harness import (
    copied,
    fake_job,
    flow_file,
    produce,
    progress,
    read_topic,
    site_flow_file,
    topic_names,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.airflow]


def records(by_partition: dict[int, list]) -> set[tuple]:
    """Each distinct record as (partition, key, value, headers, timestamp), offsets left out."""
    return {(p, r[1], r[2], tuple(r[3]), r[4]) for p, rs in by_partition.items() for r in rs}


def stop_everything(run: subprocess.Popen, files: jobs.JobFiles) -> None:
    """Clean-up after a failed test: no dag.test() or Spark job may outlive it."""
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(10)
    pid = files.recorded_pid()
    if pid is not None:
        jobs.kill_job(files, pid, log=lambda _line: None)


def count(cluster, topic: str) -> int:
    if topic not in topic_names(cluster):
        return 0
    return sum(map(len, read_topic(cluster, topic).values()))


def test_the_mirror_dag_runs_the_spark_job_that_replicates_until_asked_to_stop(
    sandbox, airflow_home, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("orders")
    create_topics(primary, topic, partitions=2)
    produce(primary, topic, 2, 60)
    dag_file = render_into_dags_folder(flow_file(tmp_path, sandbox, topic))
    state, log = tmp_path / "state", tmp_path / "dag-test.log"
    files = jobs.JobFiles.for_flow("primary->secondary", state / "flows")
    # Through a Spark connection, as a deployment configures it (here: two local cores).
    spark = json.dumps({"conn_type": "spark", "host": "local[2]"})
    run = start_dag_test(dag_file, state, log, AIRFLOW_CONN_SPARK_DEFAULT=spark)
    try:
        wait_for(lambda: count(secondary, f"primary.{topic}") >= 60, 180, "the first copy")
        produce(primary, topic, 2, 40, start=60)  # the job keeps running: later records follow
        wait_for(lambda: count(secondary, f"primary.{topic}") >= 100, 60, "the later records")
        job = files.running_pid()
        assert job is not None, "the running job is not recorded in its pid file"
        assert run.poll() is None, "the DAG run ended while its job should keep running"
        files.request_stop()  # what on_kill and a paused DAG do
        result = finish(run, log)
    finally:
        stop_everything(run, files)
    assert result == {"state": "success", "tasks": {"mirror": ["success", 1]}}
    assert not jobs.process_alive(job) and files.recorded_pid() is None
    output = log.read_text()
    assert "running primary->secondary on Spark master local[2]" in output
    assert "stopped on request (stop file)" in output
    # Every record once, in order, per partition: a clean stop replays nothing.
    source, target = read_topic(primary, topic), read_topic(secondary, f"primary.{topic}")
    assert copied(target) == copied(source)


def test_a_killed_spark_job_is_started_again_by_airflow_and_no_record_is_lost(
    sandbox, airflow_home, topic_name, tmp_path
):
    primary, tertiary = sandbox["primary"], sandbox["tertiary"]
    topic = topic_name("payments")
    create_topics(primary, topic, partitions=3)
    sent = produce(primary, topic, 3, 150)
    dag_file = render_into_dags_folder(flow_file(tmp_path, sandbox, topic, target="tertiary"))
    state, log = tmp_path / "state", tmp_path / "dag-test.log"
    files = jobs.JobFiles.for_flow("primary->tertiary", state / "flows")
    run = start_dag_test(dag_file, state, log)  # no Spark connection: local[*]
    remote = f"primary.{topic}"
    try:
        wait_for(lambda: count(tertiary, remote) >= 150, 180, "the first copy")
        first_job = files.running_pid()
        assert first_job is not None
        os.killpg(first_job, signal.SIGKILL)  # the driver dies: no clean shutdown, no batch end
        sent += produce(primary, topic, 3, 150, start=150)  # while no job runs
        second_job = wait_for(
            lambda: (pid := files.running_pid()) not in (None, first_job) and pid,
            120,
            "Airflow to start the job again",
        )

        def every_record_arrived():
            target = records(read_topic(tertiary, remote))
            return all(
                (r["partition"], r["key"], r["value"], tuple(r["headers"] or ()), r["timestamp"])
                in target
                for r in sent
            )

        wait_for(every_record_arrived, 120, "every record, including those sent while down")
        files.request_stop()
        result = finish(run, log)
    finally:
        stop_everything(run, files)
    # One task: its first try failed with the job, its retry ran the restarted job to the end.
    assert result == {"state": "success", "tasks": {"mirror": ["success", 2]}}
    assert not jobs.process_alive(second_job)
    output = log.read_text()
    assert "no Airflow connection 'spark_default': running Spark on local[*]" in output
    # At-least-once: a record may have been copied twice, none may be missing or made up.
    assert records(read_topic(tertiary, remote)) == records(read_topic(primary, topic))


def airflow_cli(*args: str) -> None:
    """An ``airflow`` command on the tests' metadata DB, as an operator would type it."""
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run([str(airflow), *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_sites_co_located_in_one_application_and_a_flows_dag_pauses_that_flow_alone(
    sandbox, airflow_home, topic_name, tmp_path
):
    """``mirror.application = dc1``: flows into two targets (secondary, tertiary) share one
    mirror DAG, ``mirror__dc1``, and one Spark application, as MirrorMaker 2's one process serves
    every target of its ``--clusters``. Pausing one flow's own DAG pauses that flow in the
    running job while the others, into either target, go on."""
    primary, secondary, tertiary = sandbox["primary"], sandbox["secondary"], sandbox["tertiary"]
    a, b, c = topic_name("site-a"), topic_name("site-b"), topic_name("site-c")
    topics = {"primary->secondary": a, "tertiary->secondary": b, "primary->tertiary": c}
    config = site_flow_file(tmp_path, sandbox, topics, 50, ["mirror.application = dc1"])
    dag_file = render_into_dags_folder(config)  # its one mirror DAG
    assert dag_file.name == "mirror__dc1.py"
    state, log = tmp_path / "state", tmp_path / "dag-test.log"
    flows = sorted(topics)
    files = jobs.JobFiles.for_flows(flows, state / "flows")
    paused_file = files.flow_dir("tertiary->secondary") / jobs.PAUSED_FILE
    run = start_dag_test(dag_file, state, log)
    try:
        wait_for(lambda: count(secondary, f"primary.{a}") >= 50, 180, "flow a's first copy")
        wait_for(lambda: count(secondary, f"tertiary.{b}") >= 50, 60, "flow b's first copy")
        wait_for(lambda: count(tertiary, f"primary.{c}") >= 50, 60, "flow c's first copy")
        job = files.running_pid()
        assert job is not None, "the application's job is not recorded in its pid file"
        # The flow's own DAG paused, as the UI's toggle does (the CLI writes the same flag).
        airflow_cli("dags", "pause", "flow__tertiary__secondary")
        wait_for(paused_file.exists, 60, "the operator to pause the flow")
        wait_for(
            lambda: progress(state / "flows", "tertiary-secondary").get("state") == "PAUSED",
            60,
            "the flow to pause",
        )
        produce(primary, a, 2, 30, start=50)
        produce(tertiary, b, 2, 30, start=50)
        produce(primary, c, 2, 30, start=50)
        wait_for(lambda: count(secondary, f"primary.{a}") >= 80, 60, "the other flow's copies")
        wait_for(lambda: count(tertiary, f"primary.{c}") >= 80, 60, "the other target's copies")
        time.sleep(3)
        assert count(secondary, f"tertiary.{b}") == 50, "the paused flow copied records"
        assert files.running_pid() == job, "pausing one flow restarted the application's job"
        airflow_cli("dags", "unpause", "flow__tertiary__secondary")
        wait_for(lambda: count(secondary, f"tertiary.{b}") >= 80, 120, "the resumed flow")
        assert not paused_file.exists() and files.running_pid() == job
        files.request_stop()
        result = finish(run, log)
    finally:
        stop_everything(run, files)
    assert result == {"state": "success", "tasks": {"mirror": ["success", 1]}}
    output = log.read_text()
    assert f"running {', '.join(flows)} on Spark master" in output
    assert "flow tertiary->secondary paused" in output and "resumed" in output
    # Paused and resumed from its positions: nothing copied twice, nothing lost.
    for source, target, topic in ((primary, secondary, a), (tertiary, secondary, b),
                                  (primary, tertiary, c)):  # fmt: skip
        remote = f"{source.name}.{topic}"
        assert copied(read_topic(target, remote)) == copied(read_topic(source, topic))


def test_a_stop_request_lets_a_job_finish_and_one_that_hangs_is_killed_after_its_grace(
    tmp_path,
):
    files = jobs.JobFiles.for_flow("a->b", tmp_path)
    files.directory.mkdir(parents=True)

    polite = fake_job(files, obeys_stop_file=True)
    files.record(polite.pid)
    wait_for(lambda: files.running_pid() == polite.pid, 10, "the job to start", interval=0.1)
    started = time.monotonic()
    assert jobs.stop_job(files, polite.pid, grace=20) is True
    assert polite.wait(1) == 0 and time.monotonic() - started < 10  # it ended by itself

    files.clear_stop_request()
    stubborn = fake_job(files, obeys_stop_file=False)
    files.record(stubborn.pid)
    started = time.monotonic()
    assert jobs.stop_job(files, stubborn.pid, grace=2, log=lambda _line: None) is False
    assert stubborn.wait(1) == -signal.SIGTERM  # it had to be killed, after the grace period
    assert 2 <= time.monotonic() - started < 2 + jobs.KILL_WAIT
    assert files.running_pid() is None
