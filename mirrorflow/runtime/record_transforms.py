"""A flow's record transforms (:mod:`mirrorflow.mm2.transforms`) in Spark: the same two Spark SQL
expressions become DataFrame columns on the exactly-once path (:func:`with_transform`) and an
analysed plan the JVM copier evaluates record by record (:func:`copier_plan`).

Both are made from :data:`mirrorflow.mm2.transforms.COLUMNS`, so an expression that Spark cannot
analyse fails the job at its start, in one line naming the flow's settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.transforms import COLUMNS, RecordTransform
from mirrorflow.runtime import jvm

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCHEMA_DDL = ", ".join(f"`{name}` {kind}" for name, kind in COLUMNS)


def _failed(flow: str, transform: RecordTransform, exc: Exception) -> MirrorflowError:
    text = str(exc).strip().splitlines()
    reason = text[0] if text else type(exc).__name__
    return MirrorflowError(
        f"flow {flow}: Spark SQL cannot evaluate its record transforms "
        f"({transform.description}): {reason}",
        f"fix {flow}.record.filter or {flow}.transforms",
    )


def _columns(frame: DataFrame, transform: RecordTransform) -> DataFrame:
    return frame.selectExpr(
        *(name for name, _kind in COLUMNS if name not in ("headers", "key", "value")),
        f"{transform.headers} AS headers",
        f"{transform.keep} AS keep",
        f"{transform.key} AS key",
        f"{transform.value} AS value",
    )


def copier_plan(spark: SparkSession, flow: str, transform: RecordTransform) -> str:
    """The transform, analysed by Spark over an empty relation of the record's columns and
    serialised for the JVM copier (its ``transform`` setting)."""
    try:
        frame = spark.createDataFrame([], SCHEMA_DDL).selectExpr(
            f"{transform.headers} AS headers",
            f"{transform.keep} AS keep",
            f"{transform.key} AS key",
            f"{transform.value} AS value",
        )
        analyzed = frame._jdf.queryExecution().analyzed()
        record_transform: Any = getattr(spark.sparkContext._jvm, jvm.TRANSFORM_CLASS)
        return str(record_transform.encode(analyzed))
    except Exception as exc:  # Spark's parse or analysis error, or the copier's check
        raise _failed(flow, transform, exc) from None


def with_transform(
    frame: DataFrame, flow: str, remote_topics: dict[str, str], transform: RecordTransform
) -> DataFrame:
    """``frame`` (Spark's Kafka source) with the headers to write and a ``keep`` column."""
    from pyspark.sql import functions as F

    names = F.create_map(*(F.lit(x) for pair in remote_topics.items() for x in pair))
    try:
        return _columns(frame.withColumn("remote_topic", names[F.col("topic")]), transform)
    except Exception as exc:
        raise _failed(flow, transform, exc) from None
