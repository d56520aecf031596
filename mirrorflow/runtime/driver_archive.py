"""A class-data sharing archive of the mirror job's driver JVM: made once, mapped at each start.

Starting Spark loads, parses and verifies some ten thousand classes before the first record is
copied. Java's class-data sharing (CDS) keeps them, already parsed and verified, in an archive
file that later JVMs map into memory: on this project's 2-core machine it cut a mirror job's
start-up from about 17 to about 13 CPU-seconds.

The archive is made once per Java and Spark installation (``mirrorflow jars``, which
``scripts/bootstrap.sh`` runs) by a short Spark application that starts the driver the way a
mirror job does; no Kafka cluster is needed. It is keyed by the Java binary and Spark's jars
and where they are, so an upgrade or another venv makes a new one. Only the driver uses it
(executors of a Spark cluster start on other machines). ``MIRRORFLOW_CLASS_ARCHIVE=off`` turns it
off; a JVM that cannot use an archive warns and starts without it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mirrorflow.paths import cache_dir, resource
from mirrorflow.runtime import jvm, spark_security, submit

ENTRY_POINT = resource("spark_jobs/driver_archive.py")
SWITCH = "MIRRORFLOW_CLASS_ARCHIVE"


def enabled() -> bool:
    return os.environ.get(SWITCH, "on").strip().lower() not in {"off", "0", "false", "no"}


def archive_path() -> Path:
    """Where the archive of this Java and Spark installation lives (whether made or not)."""
    java = Path(jvm.require_tool("java", "to run Spark")).resolve()
    spark_home = jvm.spark_home().resolve()
    spark_jars = sorted(p.name for p in (spark_home / "jars").glob("*.jar"))
    key = hashlib.sha256(
        "\n".join(
            [
                str(java),
                str(java.stat().st_mtime_ns),
                str(spark_home),  # the archive holds the jars' paths: another venv, another archive
                *spark_jars,
                ENTRY_POINT.read_text(),  # the training run: a changed one makes a new archive
                Path(__file__).read_text(),
            ]
        ).encode()
    ).hexdigest()[:12]
    return cache_dir() / f"driver-archive-{key}" / "spark-driver.jsa"


def driver_java_options() -> str:
    """The driver JVM option that maps the archive, or ``""`` when there is none (or it is off)."""
    if not enabled():
        return ""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path.exists() else ""


def ensure(quiet: bool = True) -> Path | None:
    """Make the archive unless it exists; ``None`` when it is off or could not be made.

    A failure only costs start-up time, so it is reported and not raised.
    """
    if not enabled():
        return None
    path = archive_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        partial = Path(tmp) / path.name
        # As a mirror job's driver in local mode: loopback, authenticated, no UI.
        conf = {**submit.spark_conf(), **spark_security.for_master("local[*]", environ={}).conf}
        conf["spark.driver.extraJavaOptions"] += f" -XX:ArchiveClassesAtExit={partial}"
        command = [submit.spark_submit(), "--master", "local[*]", "--name", "mirrorflow archive"]
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        command += [str(ENTRY_POINT), tmp]
        started = time.monotonic()
        result = subprocess.run(
            command, env=submit.job_environment(), capture_output=True, text=True, timeout=600
        )
        if result.returncode != 0 or not partial.exists():
            print(
                "mirrorflow: warning: making the driver's class archive failed; mirror jobs "
                f"start without it: {(result.stderr or result.stdout).strip()[-600:]}",
                file=sys.stderr,
            )
            return None
        partial.replace(path)
    if not quiet:
        print(f"driver class archive: {path} ({time.monotonic() - started:.0f} s)")
    return path


def remove() -> None:
    """Delete this installation's archive (the next ``ensure`` makes it again)."""
    shutil.rmtree(archive_path().parent, ignore_errors=True)


def exercise(workdir: Path) -> int:
    """The archive's training run: start the driver and run a few batches as a mirror job
    does (jobs of one-partition tasks on the executors, a DataFrame read). ``workdir`` is the
    scratch directory the entry point is given; this run needs none."""
    from mirrorflow.runtime import spark_session

    spark_session.prefer_installed_pyspark()
    spark = spark_session.build_session("mirrorflow class archive")
    spark.sparkContext.setLogLevel("WARN")
    jsc = spark.sparkContext._jsc
    # _jvm: py4j's view of the JVM, Optional to pyspark, set while the context runs
    numbers = spark.sparkContext._jvm.java.util.ArrayList()  # type: ignore[union-attr]
    for i in range(4):
        numbers.add(str(i))
    for _ in range(3):
        jsc.parallelize(numbers, 2).count()
        spark.range(10).count()
    spark.stop()
    return 0
