"""Spark sessions wired for Kafka: the connector jars from the Maven cache, client options.

Used by the Spark entry points in ``spark_jobs/`` and by tests; a mirror job starts its
context alone and makes its SQL session only if it needs one (:class:`JobSpark`). The same code
serves ``local[*]`` and a standalone cluster (``spark://host:7077``), since the connector jars
are shipped with the application through ``spark.jars``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.runtime import jvm

if TYPE_CHECKING:
    from pyspark import SparkContext
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


def _settings(app_name: str, master: str | None, conf: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings of :func:`build_session` and :func:`build_context`."""
    from mirrorflow.runtime import spark_security

    settings = {"spark.app.name": app_name}
    if master:
        settings["spark.master"] = master
        settings.update(spark_security.for_master(master, environ={}).conf)
    settings["spark.jars"] = kafka_jars_conf()
    settings["spark.ui.showConsoleProgress"] = "false"
    settings["spark.sql.shuffle.partitions"] = "2"
    return {**settings, **conf}


def build_session(app_name: str, master: str | None = None, **conf: str) -> SparkSession:
    """A SparkSession with the Kafka connector; ``conf`` adds or overrides settings.

    Without ``master`` the session runs where ``spark-submit --master`` said (with the settings
    of its command line), ``local[*]`` when nothing did. With ``master``, the session gets the
    security settings of :mod:`mirrorflow.runtime.spark_security` for it, the UI off. A running
    context (:func:`build_context`) is the session's.
    """
    from pyspark.sql import SparkSession

    drop_numpy_converters()
    builder = SparkSession.builder
    for key, value in _settings(app_name, master, conf).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def build_context(app_name: str, master: str | None = None, **conf: str) -> SparkContext:
    """The SparkContext :func:`build_session` would run, without a SQL session (creating one
    costs a driver some 1.3 CPU-s and 0.6 s more at its start)."""
    from pyspark import SparkConf, SparkContext

    drop_numpy_converters()
    return SparkContext.getOrCreate(
        SparkConf().setAll(list(_settings(app_name, master, conf).items()))
    )


class JobSpark:
    """A mirror job's Spark: its context, running from the job's start, and a SQL session made
    the first time a flow needs one (record transforms' plans, exactly-once batches read by
    Spark). Most jobs never do."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self.context = build_context(app_name)
        self._lock = threading.Lock()
        self._session: SparkSession | None = None

    @property
    def session(self) -> SparkSession:
        with self._lock:
            if self._session is None:
                self._session = build_session(self.app_name)
            return self._session


def kafka_options(client_props: Mapping[str, str]) -> dict[str, str]:
    """Java Kafka client properties as Spark Kafka source/sink options (``kafka.`` prefix)."""
    return {f"kafka.{k}": v for k, v in client_props.items() if k not in _SPARK_MANAGED}
