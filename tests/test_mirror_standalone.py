"""The same mirror job, unchanged, on a Spark standalone cluster (master + worker on loopback)
that requires authentication: the master, the worker and the job share a secret through one
Spark properties file of mode 0600, never through a command line."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mirrorflow.devtools.sandbox import free_port_block
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import write_private
from mirrorflow.runtime import jvm, launch, spark_security
from tests.conftest import create_topics
from tests.mirror_harness import copied, flow_file, produce, read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="module")
def cluster_secret(tmp_path_factory) -> tuple[Path, str]:
    """The standalone cluster's Spark properties file (0600) and the secret it holds."""
    secret = secrets.token_hex(32)
    path = tmp_path_factory.mktemp("spark-secret") / "spark.properties"
    write_private(
        path,
        "spark.authenticate=true\n"
        f"spark.authenticate.secret={secret}\n"
        "spark.network.crypto.enabled=true\n",
    )
    return path, secret


@pytest.fixture(scope="module")
def standalone_logs(tmp_path_factory) -> Path:
    """Where the master and worker write their logs (and the worker its executors')."""
    return tmp_path_factory.mktemp("spark-standalone")


@pytest.fixture(scope="module")
def standalone_master(standalone_logs, cluster_secret) -> str:
    """A Spark standalone master and one worker (2 cores, 1 GiB) for this module, which
    authenticate every connection with the secret of ``cluster_secret``."""
    spark_class = str(jvm.spark_home() / "bin" / "spark-class")
    base = free_port_block(4)
    logs = standalone_logs
    url = f"spark://127.0.0.1:{base}"
    env = {**launch.job_environment(), "SPARK_LOCAL_IP": "127.0.0.1"}
    secured = ["--properties-file", str(cluster_secret[0])]
    processes = []
    for name, args in (
        (
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(base),
                "--webui-port",
                str(base + 1),
                *secured,
            ],
        ),
        (
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "1g",
                "--webui-port",
                str(base + 2),
                "--work-dir",
                str(logs / "work"),
                *secured,
            ],
        ),
    ):
        log = open(logs / f"{name}.log", "wb")  # noqa: SIM115
        processes.append(
            subprocess.Popen(
                [spark_class, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        time.sleep(2 if name == "master" else 0)
    deadline = time.monotonic() + 90
    while "Successfully registered with master" not in (logs / "worker.log").read_text(
        errors="replace"
    ):
        assert time.monotonic() < deadline, (logs / "worker.log").read_text()[-2000:]
        time.sleep(0.5)
    yield url
    for process in reversed(processes):
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


def test_a_standalone_master_needs_the_clusters_secret_from_a_private_properties_file(
    monkeypatch, cluster_secret
):
    monkeypatch.delenv(spark_security.PROPERTIES_SWITCH, raising=False)
    with pytest.raises(MirrorflowError, match="shared secret"):
        launch.mirror_command([Path("f.properties")], "a->b", master="spark://127.0.0.1:7077")
    monkeypatch.setenv(spark_security.PROPERTIES_SWITCH, str(cluster_secret[0]))
    command = launch.mirror_command([Path("f.properties")], "a->b", master="spark://h:7077")
    assert cluster_secret[1] not in " ".join(command)
    assert command[command.index("--properties-file") + 1] == str(cluster_secret[0])
    for setting in ("spark.authenticate=true", "spark.network.crypto.enabled=true"):
        assert setting in command


def test_the_mirror_job_runs_unchanged_on_a_spark_standalone_cluster(
    sandbox, standalone_master, standalone_logs, cluster_secret, topic_name, tmp_path, monkeypatch
):
    monkeypatch.setenv(spark_security.PROPERTIES_SWITCH, str(cluster_secret[0]))
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("cluster")
    create_topics(primary, t, partitions=4)
    produce(primary, t, 4, 400)
    config = flow_file(tmp_path, sandbox, t)
    command = launch.mirror_command(
        [config],
        "primary->secondary",
        master=standalone_master,
        driver_memory="768m",
        state_dir=tmp_path / "state",
        once=True,
    )
    command[1:1] = ["--conf", "spark.executor.memory=768m", "--conf", "spark.cores.max=2"]
    log = tmp_path / "job.log"
    with open(log, "wb") as out:
        job = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**launch.job_environment(), "SPARK_LOCAL_IP": "127.0.0.1"},
            cwd=Path(sys.prefix),
            start_new_session=True,
        )
    command_lines: set[str] = set()  # every process's, sampled while the job runs
    deadline = time.monotonic() + 300
    while job.poll() is None and time.monotonic() < deadline:
        command_lines |= _command_lines()
        time.sleep(0.5)
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
    output = log.read_text(errors="replace")
    assert job.wait(30) == 0, output[-4000:]
    # The executor the worker started got the secret in its environment, not its command line,
    # and no log of the job or of the cluster holds it.
    assert [line for line in command_lines if "CoarseGrainedExecutorBackend" in line]
    for name in ("master", "worker"):  # the cluster did require the secret
        assert "authentication enabled" in (standalone_logs / f"{name}.log").read_text()
    assert not [line for line in command_lines if cluster_secret[1] in line]
    for path in [log, *standalone_logs.rglob("*")]:
        if path.is_file() and (path.suffix == ".log" or path.name in ("stdout", "stderr")):
            assert cluster_secret[1] not in path.read_text(errors="replace"), path
    assert copied(read_topic(secondary, f"primary.{t}")) == copied(read_topic(primary, t))


def _command_lines() -> set[str]:
    """Every process's command line."""
    return {" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])}
