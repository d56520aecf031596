"""Secrets nowhere: a flow over TLS and SCRAM with JKS stores (seed 003's way), the target's SCRAM
password in an Airflow connection of the metadata DB (``${airflow:…}``), run as a user runs it,
and every place a secret could leak scanned for the sandbox users' passwords and the stores'
password: the output of the offline and online commands, the generated DAG files, the
command lines and environments of every process of a real mirror DAG run (Airflow, spark-submit,
the Spark JVM, its Python driver, the keytool the driver starts), its metrics, its task log, the
job's state files and Airflow's home. Where a password has to reach a process (keytool reads the
stores' password from its environment, as ``-storepass:env`` is meant to be used), it is only in
the environment of that short-lived process, which only its owner can read: the scan of the
mirror job's processes runs while the job copies, after its clients were built."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from mirrorflow.config import providers
from mirrorflow.devtools.sandbox import free_port_block
from mirrorflow.runtime import jobs
from tests import exposure
from tests.conftest import create_topics
from tests.dag_harness import (
    ROOT,
    add_connection,
    finish,
    render_into_dags_folder,
    start_dag_test,
)
from tests.mirror_harness import produce, read_topic, topic_names, wait_for, write_flow_file

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.airflow]
FLOW = "primary->secondary"


def flow_file(directory: Path, box, topic: str) -> Path:
    """The source over mutual TLS, the target over SASL_SSL with SCRAM, JKS stores; the
    target's SCRAM login and password come from the Airflow connection ``kafka_secondary``."""
    clients = {
        "primary": box["primary"].java_client_config("admin", "SSL", "JKS"),
        "secondary": box["secondary"].java_client_config("admin", "SASL_SSL", "JKS"),
    }
    clients["secondary"]["sasl.jaas.config"] = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="${airflow:kafka_secondary:login}" '
        'password="${airflow:kafka_secondary:password}";'
    )
    lines = [
        "config.providers = airflow",
        f"config.providers.airflow.class = {providers.AIRFLOW}",
        f"{FLOW}.enabled = true",
        f"{FLOW}.topics = {topic}",
        f"{FLOW}.emit.checkpoints.interval.seconds = 5",
    ]
    return write_flow_file(
        directory / "mm2.properties", box, ["primary", "secondary"], lines, clients
    )


def leaks(secrets: list[str], **places: str) -> list[str]:
    return [
        f"{name} holds a secret" for name, text in places.items() if any(s in text for s in secrets)
    ]


def mirrorflow(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "mirrorflow.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode in (0, 1), result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout + result.stderr


def test_no_password_of_a_tls_and_scram_flow_leaks_anywhere(
    sandbox, airflow_home, topic_name, tmp_path
):
    secrets = [p for c in sandbox.clusters.values() for p in c.passwords.values()]
    secrets.append(sandbox["primary"].tls_password)
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("secret")
    create_topics(primary, topic, partitions=2)
    produce(primary, topic, 2, 50)
    config = flow_file(tmp_path, sandbox, topic)
    assert all(s in config.read_text() for s in secrets[-1:])  # the scan looks for real values
    # The target's password is in Airflow's metadata DB (encrypted), not in the flow file.
    connection = sandbox["secondary"].passwords["admin"]
    assert connection not in config.read_text()
    fields = {"conn_type": "kafka", "login": "admin", "password": connection}
    add_connection(tmp_path, "kafka_secondary", fields)

    outputs = {
        "validate": mirrorflow("validate", str(config)),
        "explain": mirrorflow("explain", str(config), FLOW),
        "explain --json": mirrorflow("explain", str(config), FLOW, "--json"),
        "plan": mirrorflow("plan", str(config)),
        "plan --json": mirrorflow("plan", str(config), "--json"),
        "convert": mirrorflow("convert", str(config)),
        "sync --dry-run": mirrorflow("sync", str(config), "--dry-run"),
    }
    assert f"primary.{topic}" in outputs["plan"]
    assert not leaks(secrets, **outputs)

    dag_file = render_into_dags_folder(config)
    assert exposure.files_holding(secrets, [dag_file.parent]) == []

    state, log = tmp_path / "state", tmp_path / "dag-test.log"
    files = jobs.JobFiles.for_flow(FLOW, state / "flows")
    port = free_port_block(1)
    spark = json.dumps({"conn_type": "spark", "host": "local[2]"})
    run = start_dag_test(
        dag_file,
        state,
        log,
        AIRFLOW_CONN_SPARK_DEFAULT=spark,
        MIRRORFLOW_METRICS_PORT=str(port),
    )
    try:
        wait_for(
            lambda: (
                f"primary.{topic}" in topic_names(secondary)
                and sum(map(len, read_topic(secondary, f"primary.{topic}").values())) >= 50
            ),
            240,
            "the copies",
        )
        job = files.running_pid()
        assert job is not None, "the running job is not recorded in its pid file"
        # dag.test() and its task; the job, in a session of its own: the guard, spark-submit's
        # JVM, the Python driver.
        members = exposure.session_members(run.pid) + exposure.session_members(os.getsid(job))
        assert len(members) >= 3, members
        processes = {
            f"pid {pid} ({exposure.command_line(pid)[:60]})": exposure.command_line(pid)
            + "\n"
            + exposure.environment(pid)
            for pid in members
        }
        assert not leaks(secrets, **processes)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert "mirrorflow_record_count_total" in metrics
        assert not leaks(secrets, metrics=metrics)
        files.request_stop()
        result = finish(run, log, timeout=180)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        pid = files.recorded_pid()
        if pid is not None:
            jobs.kill_job(files, pid, log=lambda _line: None)
    assert result["state"] == "success", log.read_text()[-3000:]
    # The task looked the connection up and handed its login and password to the job.
    assert "2 config-provider value(s) handed over by the launcher" in log.read_text()
    assert exposure.files_holding(secrets, [log, state, Path(airflow_home)]) == []
