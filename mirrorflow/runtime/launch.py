"""How a mirror job is launched: the one ``spark-submit`` command line for a flow.

Used by ``mirrorflow mirror``, the generated Airflow DAGs, the tests and the benchmark, so all
of them run the job the same way: Spark's Kafka connector on ``--jars`` (the driver needs it
before the application starts), quiet Spark logging, the security settings of
:mod:`mirrorflow.runtime.spark_security` for its master, and only file paths and the flow's name on
the command line; credentials stay in the flow files (or the config providers they name; the
values of ``${airflow:…}`` references are resolved by the launcher and handed to the job in a
private file, :func:`handed_over`), Spark's secrets in a properties file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from mirrorflow.config import providers
from mirrorflow.paths import resource
from mirrorflow.runtime import driver_archive, guard, spark_security
from mirrorflow.runtime.submit import job_environment, spark_submit
from mirrorflow.runtime.submit import spark_conf as base_spark_conf

MIRROR_JOB = resource("spark_jobs/mirror.py")


def spark_conf(once: bool = False) -> dict[str, str]:
    """Spark settings of a mirror job (``once``: one that ends once it has copied): the driver
    maps the class archive of :mod:`mirrorflow.runtime.driver_archive` when there is one."""
    archive = driver_archive.driver_java_options()
    return base_spark_conf((archive,) if archive else (), short_lived=once)


def flow_list(flow: str | Sequence[str]) -> list[str]:
    """One flow name or several, as a list."""
    return [flow] if isinstance(flow, str) else list(flow)


def job_args(
    configs: Iterable[Path],
    flow: str | Sequence[str],
    *,
    state_dir: Path | None = None,
    once: bool = False,
    stop_file: Path | None = None,
    starting_offsets: str | None = None,
    max_records_per_batch: int | None = None,
    local_batch_max_records: int | None = None,
    metrics_port: int | None = None,
    retry_timeout: float | None = None,
    continuous: bool | None = None,
) -> list[str]:
    """The mirror job's own arguments."""
    args = [arg for config in configs for arg in ("--config", str(Path(config).resolve()))]
    for name in flow_list(flow):
        args += ["--flow", name]
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
    if local_batch_max_records is not None:  # 0 means something: never in the driver
        args += ["--local-batch-max-records", str(local_batch_max_records)]
    if metrics_port is not None:  # 0 means something: no endpoint, whatever the environment
        args += ["--metrics-port", str(metrics_port)]
    if retry_timeout is not None:
        args += ["--retry-timeout", f"{retry_timeout:g}"]
    if continuous is not None:  # None: the job's default (continuous)
        args.append("--continuous" if continuous else "--no-continuous")
    return args


def mirror_command(
    configs: Sequence[Path],
    flow: str | Sequence[str],
    *,
    master: str = "local[*]",
    driver_memory: str = "1g",
    conf: dict[str, str] | None = None,
    **job_options,
) -> list[str]:
    """The full ``spark-submit`` command that runs ``flow`` (one name, or several run by one
    application) of the flow files ``configs``; ``conf`` adds or overrides Spark settings (no
    secret: it would be on the command line)."""
    spark_security.check_no_secret(conf or {})
    security = spark_security.for_master(master)
    name = f"mirrorflow {', '.join(flow_list(flow))}"
    command = [spark_submit(), "--master", master, "--name", name]
    if security.properties_file:
        command += ["--properties-file", str(security.properties_file)]
    command += ["--driver-memory", driver_memory]
    once = bool(job_options.get("once"))
    for key, value in {**spark_conf(once), **security.conf, **(conf or {})}.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, str(MIRROR_JOB), *job_args(configs, flow, **job_options)]


def handed_over(configs: Sequence[Path], flow: str | Sequence[str]) -> dict[str, str]:
    """Resolve, here in the launcher, the flow files' references to providers that need it
    (``${airflow:…}``: an Airflow task's connection lookup) and hand them to the job: the
    environment entry naming the private file that holds them (none if there are no such
    references). Whoever starts the job calls :func:`discard` with it once the job has ended."""
    from mirrorflow.config.topology import load_topology

    topology = load_topology(configs)
    return providers.hand_over(topology.handed_over_values(flow_list(flow)))


def discard(handoff: dict[str, str]) -> None:
    """Remove what :func:`handed_over` wrote, if the job has not already."""
    providers.discard_handoff(handoff)


def stop_file_for(state_dir: Path, flow: str | Sequence[str]) -> Path:
    """The file whose appearance asks the running job of ``flow`` (one name, or the flows of
    one application) to stop after its batch: ``S-T/stop`` for one flow, ``to-T/stop`` for
    several into one target, else ``app-<hash of the flows>/stop``."""
    flows = flow_list(flow)
    targets = {f.partition("->")[2] for f in flows}
    if len(flows) == 1:
        source, _, target = flows[0].partition("->")
        name = f"{source}-{target}"
    elif len(targets) == 1:
        name = f"to-{targets.pop()}"
    else:
        name = "app-" + hashlib.sha256("\n".join(sorted(flows)).encode()).hexdigest()[:12]
    return Path(state_dir) / name / "stop"


def supervise(
    command: list[str],
    stop_file: Path,
    grace_s: float = 120.0,
    handoff: dict[str, str] | None = None,
) -> int:
    """Run a mirror job in the foreground; on SIGTERM or SIGINT ask it to stop after its
    current batch (through ``stop_file``), and end it only if it has not within ``grace_s``.

    spark-submit's JVM is the parent of the Python driver, so a signal sent to it ends the
    job mid-batch; this is how a caller gets a clean stop instead. The job runs under
    :mod:`mirrorflow.runtime.guard`, in a process group of its own: should this process be
    killed (SIGKILL, a crash), the job ends with it. ``handoff`` (from :func:`handed_over`)
    joins the job's environment and is discarded when the job ends.
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
    job = subprocess.Popen(
        guard.guarded(command, stop_file, grace_s),
        env={**job_environment(), **(handoff or {})},
        start_new_session=True,
    )
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
        discard(handoff or {})
