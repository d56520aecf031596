"""The same mirror job, unchanged, on a Spark standalone cluster (master + worker on loopback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mirrorflow.devtools.sandbox import free_port_block
from mirrorflow.runtime import jvm, launch
from tests.conftest import create_topics
from tests.mirror_harness import copied, flow_file, produce, read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="module")
def standalone_master(tmp_path_factory) -> str:
    """A Spark standalone master and one worker (2 cores, 1 GiB) for this module."""
    spark_class = str(jvm.spark_home() / "bin" / "spark-class")
    base = free_port_block(4)
    logs = tmp_path_factory.mktemp("spark-standalone")
    url = f"spark://127.0.0.1:{base}"
    env = {**launch.job_environment(), "SPARK_LOCAL_IP": "127.0.0.1"}
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


def test_the_mirror_job_runs_unchanged_on_a_spark_standalone_cluster(
    sandbox, standalone_master, topic_name, tmp_path
):
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
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={**launch.job_environment(), "SPARK_LOCAL_IP": "127.0.0.1"},
        cwd=Path(sys.prefix),
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert copied(read_topic(secondary, f"primary.{t}")) == copied(read_topic(primary, t))
