"""``spark-submit`` in this environment: the binary, the environment and the Spark settings
every mirrorflow application gets (the mirror job, and the driver class archive's training run).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import PROJECT_ROOT, resource
from mirrorflow.runtime import spark_security
from mirrorflow.runtime.spark_session import kafka_jars_conf

SPARK_LOG_CONFIG = resource("spark_jobs/log4j2.properties")


JVM_OPTIONS = "-XX:+UseParallelGC"
"""The JVM options of a mirror job's driver and executors: a throughput collector (a mirror job
allocates short-lived records at a high rate, and on a few cores G1's concurrent work cost more
CPU than ParallelGC's pauses, benchmarks/)."""

C2_SCALE = 10
"""For a job that ends once it has copied (``--once``): how many times HotSpot's defaults a method
must run before its optimising compiler (C2, tier 4) compiles it. A job's start (Spark's context,
the clients) runs thousands of methods a few thousand times each: at the defaults C2 compiled
them all, 4-5 CPU-s of a short job's 14-16, while the quick compiler's (C1) code ran them well
enough; the copy's own methods run millions of times and reach C2 all the same. A continuous job
keeps HotSpot's defaults: it pays for its start once, and at a small load its copy's methods
would reach C2 only after a minute or more (benchmarks/README.md, "C2 for what stays hot")."""

SHORT_LIVED_JVM_OPTIONS = " ".join(
    [
        JVM_OPTIONS,
        f"-XX:Tier4InvocationThreshold={5000 * C2_SCALE}",
        f"-XX:Tier4MinInvocationThreshold={600 * C2_SCALE}",
        f"-XX:Tier4CompileThreshold={15000 * C2_SCALE}",
        f"-XX:Tier4BackEdgeThreshold={40000 * C2_SCALE}",
    ]
)
"""The JVM options of a ``--once`` job's driver and executors (see :data:`C2_SCALE`)."""


def spark_submit() -> str:
    """The ``spark-submit`` of the running environment (next to its Python), else on PATH."""
    beside = Path(sys.executable).parent / "spark-submit"
    found = str(beside) if beside.exists() else shutil.which("spark-submit")
    if not found:
        raise MirrorflowError(
            "spark-submit was not found", "run scripts/bootstrap.sh and activate its environment"
        )
    return found


def spark_conf(driver_options: tuple[str, ...] = (), short_lived: bool = False) -> dict[str, str]:
    """Spark settings every mirrorflow application gets (``spark.jars`` ships the connector to
    executors), with ``driver_options`` added to the driver JVM's; ``short_lived``: for a job
    that ends once it has copied (:data:`SHORT_LIVED_JVM_OPTIONS`)."""
    jvm_options = SHORT_LIVED_JVM_OPTIONS if short_lived else JVM_OPTIONS
    options = [f"-Dlog4j2.configurationFile=file:{SPARK_LOG_CONFIG}", jvm_options, *driver_options]
    return {
        "spark.jars": kafka_jars_conf(),
        "spark.driver.extraJavaOptions": " ".join(options),
        "spark.executor.extraJavaOptions": jvm_options,
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.showConsoleProgress": "false",
        "spark.speculation": "false",
        "spark.submit.deployMode": "client",
        # Several flows share one application: each runs its jobs in a pool of its own.
        "spark.scheduler.mode": "FAIR",
    }


def job_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a mirror job: this Python for Spark's workers, mirrorflow importable,
    and ``SPARK_LOCAL_IP`` when ``$MIRRORFLOW_SPARK_UI`` opens the UI (where Spark binds it).
    Airflow connections given as ``AIRFLOW_CONN_*`` variables are left out: a job gets the values
    its flow files take from them handed over by its launcher
    (:func:`mirrorflow.config.providers.hand_over`), never in its environment."""
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith("AIRFLOW_CONN_")
    }
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env.update(spark_security.environment(env))
    return env
