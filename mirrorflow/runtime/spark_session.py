"""Spark sessions wired for Kafka: the connector jars from the Maven cache, client options.

Used by the Spark entry points in ``spark_jobs/`` and by tests; the same code serves
``local[*]`` and a standalone cluster (``spark://host:7077``), since the connector jars are
shipped with the application through ``spark.jars``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.runtime import jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Settings Spark's Kafka source and sink manage themselves and refuse as kafka.* options.
_SPARK_MANAGED = frozenset(
    {
        "group.id",
        "auto.offset.reset",
        "key.deserializer",
        "value.deserializer",
        "key.serializer",
        "value.serializer",
        "enable.auto.commit",
    }
)


def kafka_jars_conf() -> str:
    """The value of ``spark.jars``: Spark's Kafka connector and mirrorflow's copier, shipped
    to every executor."""
    return ",".join(str(p) for p in [*jvm.spark_kafka_jars(), jvm.copier_jar()])


def prefer_installed_pyspark() -> None:
    """Import pyspark and py4j from the installed package, not from spark-submit's zips.

    spark-submit puts ``$SPARK_HOME/python/lib/{pyspark,py4j-*}.zip`` first on the driver's
    path, and Python compiles every module imported from a zip again at each start (it cannot
    cache their bytecode there): about 2 CPU-seconds per job start. When ``SPARK_HOME`` is the
    installed pyspark package itself (the default), the installed modules are the same files
    with cached bytecode. Call it before anything imports pyspark.
    """
    home = os.environ.get("SPARK_HOME")
    if home and "pyspark" not in sys.modules:
        sys.path[:] = without_spark_zips(sys.path, Path(home))


def without_spark_zips(path: list[str], spark_home: Path) -> list[str]:
    """``path`` without ``spark_home``'s python/lib zips, if ``path`` also holds ``spark_home``
    as an installed pyspark package (else unchanged)."""
    home = spark_home.resolve()
    installed = any(
        (Path(entry) / "pyspark").resolve() == home for entry in path if Path(entry).is_dir()
    )
    if not installed:
        return list(path)
    zips = home / "python" / "lib"
    return [e for e in path if not (e.endswith(".zip") and Path(e).resolve().parent == zips)]


def drop_numpy_converters() -> None:
    """Keep pandas out of the driver: py4j asks each of its input converters about every argument
    of a call into the JVM, and PySpark's NumPy converters answer by importing
    ``pyspark.testing.utils``, which imports pandas (0.2-0.4 s and tens of MiB in each driver, at
    its first call). mirrorflow hands the JVM no NumPy value, so they are dropped."""
    from py4j import protocol
    from pyspark.sql import types

    numpy = (types.NumpyScalarConverter, types.NumpyArrayConverter)
    protocol.INPUT_CONVERTER[:] = [c for c in protocol.INPUT_CONVERTER if not isinstance(c, numpy)]


def build_session(app_name: str, master: str | None = None, **conf: str) -> SparkSession:
    """A SparkSession with the Kafka connector; ``conf`` adds or overrides settings.

    Without ``master`` the session runs where ``spark-submit --master`` said (with the settings
    of its command line), ``local[*]`` when nothing did. With ``master``, the session gets the
    security settings of :mod:`mirrorflow.runtime.spark_security` for it, the UI off.
    """
    from pyspark.sql import SparkSession

    from mirrorflow.runtime import spark_security

    drop_numpy_converters()
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
        for key, value in spark_security.for_master(master, environ={}).conf.items():
            builder = builder.config(key, value)
    builder = (
        builder.config("spark.jars", kafka_jars_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def kafka_options(client_props: Mapping[str, str]) -> dict[str, str]:
    """Java Kafka client properties as Spark Kafka source/sink options (``kafka.`` prefix)."""
    return {f"kafka.{k}": v for k, v in client_props.items() if k not in _SPARK_MANAGED}
