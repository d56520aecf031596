"""How a mirror job's driver starts: compiled pyspark modules, and the class archive of its JVM."""

from __future__ import annotations

import subprocess

import pytest

from mirrorflow.runtime import driver_archive, launch
from mirrorflow.runtime.spark_session import without_spark_zips


def _conf(command: list[str]) -> dict[str, str]:
    pairs = [command[i + 1] for i, arg in enumerate(command) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_the_driver_imports_the_installed_pyspark_rather_than_spark_submits_zips(tmp_path):
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    path = [*zips, "/app/files/mirrorflow-lib.zip", str(site)]
    assert without_spark_zips(path, site / "pyspark") == [
        "/app/files/mirrorflow-lib.zip",
        str(site),
    ]
    # A separate Spark distribution (SPARK_HOME elsewhere): its zips are the only pyspark.
    other = tmp_path / "opt" / "spark"
    assert without_spark_zips([*zips, str(site)], other) == [*zips, str(site)]


def test_only_the_driver_maps_the_class_archive_and_it_can_be_turned_off(tmp_path, monkeypatch):
    archive = driver_archive.ensure()
    assert archive is not None and archive.exists(), "scripts/bootstrap.sh makes the archive"
    conf = _conf(launch.mirror_command([tmp_path / "mm2.properties"], "a->b"))
    assert f"-XX:SharedArchiveFile={archive}" in conf["spark.driver.extraJavaOptions"]
    assert "SharedArchiveFile" not in conf["spark.executor.extraJavaOptions"]
    monkeypatch.setenv(driver_archive.SWITCH, "off")
    conf = _conf(launch.mirror_command([tmp_path / "mm2.properties"], "a->b"))
    assert "SharedArchiveFile" not in conf["spark.driver.extraJavaOptions"]


@pytest.mark.spark  # spark-submit's JVM
@pytest.mark.timeout(120)
def test_the_class_archive_fits_the_drivers_classpath_so_the_jvm_maps_it():
    archive = driver_archive.ensure()
    assert archive is not None
    # -Xshare:on: the JVM refuses to start unless it can map the archive for this classpath.
    result = subprocess.run(
        [
            launch.spark_submit(),
            "--conf",
            f"spark.driver.extraJavaOptions=-Xshare:on -XX:SharedArchiveFile={archive}",
            "--version",
        ],
        env=launch.job_environment(),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "version" in result.stderr + result.stdout


@pytest.mark.parametrize("dropped", [False, True])
def test_the_drivers_calls_into_the_jvm_do_not_import_pandas(dropped):
    """py4j asks every input converter about each argument of a call into the JVM; PySpark's
    NumPy converters import pandas to answer. The driver drops them (it hands the JVM no NumPy
    value): a call with a string argument then leaves pandas unimported."""
    import sys

    script = (
        "import sys\n"
        "import pyspark.sql.types  # registers PySpark's converters, as a session does\n"
        "from py4j import protocol\n"
        "from mirrorflow.runtime.spark_session import drop_numpy_converters\n"
        f"if {dropped}:\n"
        "    drop_numpy_converters()\n"
        "for converter in protocol.INPUT_CONVERTER:\n"
        "    converter.can_convert('flow')\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(not dropped)
