"""How a mirror job is launched: the one ``spark-submit`` command line for a flow.

Used by ``mirrorflow mirror``, the generated Airflow DAGs, the tests and the benchmark, so all
of them run the job the same way: Spark's Kafka connector on ``--jars`` (the driver needs it
before the application starts), quiet Spark logging, and only file paths and the flow's name on
the command line; credentials stay in the flow files.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from mirrorflow import driver_archive
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import PROJECT_ROOT
from mirrorflow.spark_session import kafka_jars_conf

MIRROR_JOB = PROJECT_ROOT / "spark_jobs" / "mirror.py"
SPARK_LOG_CONFIG = PROJECT_ROOT / "spark_jobs" / "log4j2.properties"


JVM_OPTIONS = "-XX:+UseParallelGC"
"""A throughput collector: a mirror job allocates short-lived records at a high rate, and on
a few cores G1's concurrent work cost more CPU than ParallelGC's pauses (benchmarks/)."""


def spark_submit() -> str:
    """The ``spark-submit`` of the running environment (next to its Python), else on PATH."""
    beside = Path(sys.executable).parent / "spark-submit"
    found = str(beside) if beside.exists() else shutil.which("spark-submit")
    if not found:
        raise MirrorflowError(
            "spark-submit was not found", "run scripts/bootstrap.sh and activate its environment"
        )
    return found


def spark_conf(class_archive: bool = True) -> dict[str, str]:
    """Spark settings every mirror job gets (``spark.jars`` ships the connector to executors;
    the driver maps the class archive of :mod:`mirrorflow.driver_archive` when there is one)."""
    driver_options = [f"-Dlog4j2.configurationFile=file:{SPARK_LOG_CONFIG}", JVM_OPTIONS]
    if class_archive and (archive := driver_archive.driver_java_options()):
        driver_options.append(archive)
    return {
        "spark.jars": kafka_jars_conf(),
        "spark.driver.extraJavaOptions": " ".join(driver_options),
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.showConsoleProgress": "false",
        "spark.speculation": "false",
        "spark.submit.deployMode": "client",
    }


def job_args(
    configs: Iterable[Path],
    flow: str,
    *,
    state_dir: Path | None = None,
    once: bool = False,
    stop_file: Path | None = None,
    starting_offsets: str | None = None,
    max_records_per_batch: int | None = None,
) -> list[str]:
    """The mirror job's own arguments."""
    args = [arg for config in configs for arg in ("--config", str(Path(config).resolve()))]
    args += ["--flow", flow]
    if state_dir:
        args += ["--state-dir", str(Path(state_dir).resolve())]
    if once:
        args.append("--once")
    if stop_file:
        args += ["--stop-file", str(stop_file)]
    if starting_offsets:
        args += ["--starting-offsets", starting_offsets]
    if max_records_per_batch:
        args += ["--max-records-per-batch", str(max_records_per_batch)]
    return args


def mirror_command(
    configs: Sequence[Path],
    flow: str,
    *,
    master: str = "local[*]",
    driver_memory: str = "1g",
    **job_options,
) -> list[str]:
    """The full ``spark-submit`` command that runs ``flow`` of the flow files ``configs``."""
    command = [spark_submit(), "--master", master, "--name", f"mirrorflow {flow}"]
    command += ["--driver-memory", driver_memory]
    for key, value in spark_conf().items():
        command += ["--conf", f"{key}={value}"]
    return [*command, str(MIRROR_JOB), *job_args(configs, flow, **job_options)]


def job_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a mirror job: this Python for Spark's workers, mirrorflow importable."""
    env = dict(os.environ if base is None else base)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    return env


def stop_file_for(state_dir: Path, flow: str) -> Path:
    """The file whose appearance asks the running job of ``flow`` to stop after its batch."""
    source, _, target = flow.partition("->")
    return Path(state_dir) / f"{source}-{target}" / "stop"


def supervise(command: list[str], stop_file: Path, grace_s: float = 120.0) -> int:
    """Run a mirror job in the foreground; on SIGTERM or SIGINT ask it to stop after its
    current batch (through ``stop_file``), and end it only if it has not within ``grace_s``.

    spark-submit's JVM is the parent of the Python driver, so a signal sent to it ends the
    job mid-batch; this is how a caller gets a clean stop instead.
    """
    import signal
    import subprocess
    import time

    stop_file.parent.mkdir(parents=True, exist_ok=True)
    stop_file.unlink(missing_ok=True)
    requested: list[float] = []

    def request_stop(*_):
        if not requested:
            requested.append(time.monotonic())
            stop_file.touch()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    job = subprocess.Popen(command, env=job_environment(), start_new_session=True)
    try:
        while job.poll() is None:
            if requested and time.monotonic() - requested[0] > grace_s:
                os.killpg(job.pid, signal.SIGTERM)
                try:
                    job.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(job.pid, signal.SIGKILL)
                break
            time.sleep(0.2)
        return job.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_file.unlink(missing_ok=True)
