"""The driver of a Spark mirror job: one flow ``S->T``, MirrorMaker 2's semantics.

Spark's Kafka source reads every source topic that may be replicated (an anchored Java regex
that over-approximates the flow's topic filter, so excluded topics are not even fetched) and
keeps the read positions in the query's checkpoint. Each micro-batch then:

1. lists the source topics and keeps those the flow replicates (filter, heartbeats, not
   internal, no cycle), and creates or grows their remote topics on the target;
2. copies the batch's records, same partition, key, value, headers and timestamp, in order:

   - **at-least-once** (the default): :data:`mirrorflow.runtime.jvm.COPIER_CLASS` copies the offset
     ranges Spark planned for the batch on the executors, one task per source partition, with
     Kafka's Java clients and without turning records into rows; from each copy's
     acknowledgement it writes MirrorMaker 2's offset syncs (its ``OffsetSyncWriter`` rule), so
     a sync never points at data that is not there;
   - **exactly-once**: :func:`mirrorflow.runtime.eos_writer.copy_records` in the Python workers
     commits each source partition's copies and its position in one Kafka transaction; the
     driver then writes the offset syncs the copy produced.

Spark records a batch as done only after it was written, so a crash anywhere replays the batch:
records may be copied twice (at-least-once), never lost, and every sync stays exact because it
pairs a record with the offset of the copy that was acknowledged.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.config.librdkafka import principal
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.mm2.formats import OffsetSync
from mirrorflow.replication.heartbeats import HeartbeatEmitter
from mirrorflow.replication.positions import OFFSETS_TOPIC_PARTITIONS, SourceOffsetReader
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin, RemoteTopics, ensure_internal_topic
from mirrorflow.runtime import eos_writer as mirror_writer
from mirrorflow.runtime import jvm
from mirrorflow.runtime.spark_session import kafka_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("mirrorflow.mirror")


class MirrorJob:
    """Runs one flow as a Spark structured streaming query until told to stop."""

    def __init__(self, spark: SparkSession, spec: MirrorSpec) -> None:
        from confluent_kafka import Producer

        self.spark, self.spec = spark, spec
        self._stop_requested = threading.Event()
        self.admins = {
            alias: ClusterAdmin(alias, conf)
            for alias, conf in ((spec.source, spec.source_admin), (spec.target, spec.target_admin))
        }
        self.remote_topics = RemoteTopics(
            self.admins[spec.source],
            self.admins[spec.target],
            spec.should_replicate,
            spec.remote_topic,
            spec.replication_factor,
            spec.replicate_config,
            spec.flow,
        )
        producer_base = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
        self.producers = {
            spec.source: Producer({**spec.source_client, **producer_base}),
            spec.target: Producer({**spec.target_client, **producer_base}),
        }
        self.copy_producer_config = {
            **spec.target_client,
            **producer_base,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 262_144,
            "message.max.bytes": 1_000_000_000,
        }
        self.heartbeats: HeartbeatEmitter | None = None
        self.positions: SourceOffsetReader | None = None
        self._copier_settings_cache: tuple | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def prepare(self) -> None:
        """Check both clusters and create the internal topics before reading anything."""
        spec = self.spec
        for admin in self.admins.values():
            admin.metadata()
        if spec.emit_offset_syncs:
            ensure_internal_topic(
                self.admins[spec.offset_syncs_cluster],
                spec.offset_syncs_topic,
                spec.offset_syncs_replication_factor,
                "offset-syncs.topic.replication.factor",
            )
        if spec.emit_heartbeats:
            for alias in (spec.source, spec.target):
                ensure_internal_topic(
                    self.admins[alias],
                    spec.heartbeats_topic,
                    spec.heartbeats_replication_factor,
                    "heartbeats.topic.replication.factor",
                )
        if spec.exactly_once:
            ensure_internal_topic(
                self.admins[spec.target],
                spec.offsets_topic,
                spec.offsets_replication_factor,
                "offset.storage.replication.factor",
                partitions=OFFSETS_TOPIC_PARTITIONS,
            )
            self.positions = SourceOffsetReader(
                spec.target_consumer, spec.target_admin, spec.offsets_topic, spec.source
            )
        self.remote_topics.prepare()

    def start(self, once: bool = False) -> StreamingQuery:
        """Prepare the clusters and start the streaming query (and the heartbeats)."""
        self.prepare()
        self._ship_library()
        spec = self.spec
        reader = (
            self.spark.readStream.format("kafka")
            .options(**kafka_options(spec.source_consumer))
            .option("subscribePattern", spec.subscribe_pattern)
            .option("includeHeaders", "true")
            .option("failOnDataLoss", "false")
            .option("maxOffsetsPerTrigger", str(spec.max_records_per_batch))
        )
        if spec.starting_offsets.isdigit():
            reader = reader.option("startingTimestamp", spec.starting_offsets)
        else:
            reader = reader.option("startingOffsets", spec.starting_offsets)
        writer = (
            reader.load()
            .writeStream.queryName(f"mirror {spec.flow}")
            .option("checkpointLocation", spec.checkpoint_dir)
            .foreachBatch(self._copy_batch)
        )
        writer = (
            writer.trigger(availableNow=True)
            if once
            else writer.trigger(processingTime=spec.trigger_interval)
        )
        if spec.emit_heartbeats:
            self.heartbeats = HeartbeatEmitter(
                spec.source,
                spec.target,
                self.producers,
                spec.heartbeats_topic,
                spec.heartbeats_interval_s,
            )
            self.heartbeats.beat()
            self.heartbeats.start()
        return writer.start()

    def run(self, once: bool = False, stop_file: Path | None = None) -> None:
        """Run until the query ends, SIGTERM/SIGINT arrives or ``stop_file`` appears.

        A stop request lets the batch in progress finish, then stops the query. A cluster that
        does not answer (at start or mid-run) is retried with exponential backoff, each retry
        logged; the query then resumes from its checkpoint. Other errors end the run.
        """
        import tenacity

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop_requested.set())
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(ClusterUnreachable),
            wait=tenacity.wait_exponential_jitter(
                initial=self.spec.retry_backoff_s, max=self.spec.retry_backoff_max_s
            ),
            sleep=lambda seconds: self._sleep_unless_stopped(seconds, stop_file),
            before_sleep=self._log_retry,
            reraise=True,
        )
        retrying(self._run_query, once, stop_file)

    def _run_query(self, once: bool, stop_file: Path | None) -> None:
        from confluent_kafka import KafkaException
        from pyspark.errors import StreamingQueryException

        if self._stop_requested.is_set():
            return
        query = self.start(once=once)
        try:
            while query.isActive:
                if stop_file is not None and stop_file.exists():
                    self._stop_requested.set()
                if self._stop_requested.is_set():
                    self._stop_after_current_batch(query)
                    break
                query.awaitTermination(1.0)
            if query.exception() is not None:
                raise _query_error(self.spec, query.exception())
        except StreamingQueryException as exc:
            raise _query_error(self.spec, exc) from None
        finally:
            if self.heartbeats is not None:
                self.heartbeats.stop()
            for alias, producer in self.producers.items():
                try:
                    producer.flush(10)
                except KafkaException as exc:  # the query's own error, if any, says more
                    log.warning("%s: the producer of %s failed: %s", self.spec.flow, alias, exc)

    def _sleep_unless_stopped(self, seconds: float, stop_file: Path | None) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._stop_requested.is_set():
            if stop_file is not None and stop_file.exists():
                self._stop_requested.set()
            time.sleep(0.2)

    def _log_retry(self, state) -> None:
        log.warning(
            "%s: %s; retrying in %.0f s (attempt %d)",
            self.spec.flow,
            state.outcome.exception(),
            state.next_action.sleep,
            state.attempt_number,
        )

    def _stop_after_current_batch(self, query: StreamingQuery) -> None:
        log.info("stop requested: finishing the batch in progress of %s", self.spec.flow)
        deadline = time.monotonic() + 600
        while (
            query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        query.stop()

    def _ship_library(self) -> None:
        """Ship the mirrorflow package to the executors (a cluster's workers may lack it)."""
        package = Path(mirror_writer.__file__).parent
        archive = (
            Path(self.spec.checkpoint_dir).parent
            / f"mirrorflow-lib-{self.spec.source}-{self.spec.target}.zip"
        )
        archive.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive, "w") as zf:
            for path in sorted(package.rglob("*.py")):
                zf.write(path, path.relative_to(package.parent))
        self.spark.sparkContext.addPyFile(str(archive))

    # -- one micro-batch ---------------------------------------------------------------------
    def _copy_batch(self, batch: DataFrame, batch_id: int) -> None:
        mapping = self.remote_topics.prepare()
        if self.spec.exactly_once:
            records, size, syncs = self._copy_in_transactions(batch, mapping)
            log.info(
                "%s batch %d: %d records, %d bytes, %d offset syncs",
                self.spec.flow,
                batch_id,
                records,
                size,
                syncs,
            )
        else:
            copied = self._copy_with_copier(batch, batch_id, mapping)
            log.info("%s batch %d: %s", self.spec.flow, batch_id, copied)

    def _copy_with_copier(self, batch: DataFrame, batch_id: int, mapping: dict[str, str]) -> str:
        """At-least-once: the JVM copier copies the offset ranges Spark planned for the batch
        and writes the offset syncs. Returns what it copied, for the log."""
        context = self.spark.sparkContext
        copier = getattr(context._jvm, jvm.COPIER_CLASS)
        ranges = copier.plannedRanges(batch._jdf)
        if len(ranges) == 0:
            return "nothing new"
        context.setJobDescription(f"mirror {self.spec.flow} batch {batch_id}")
        try:
            copied = copier.copy(context._jsc, ranges, self._copier_settings(mapping))
        finally:
            context.setJobDescription(None)
        return f"{copied[0]} records, {copied[1]} bytes from {len(ranges)} partitions"

    def _copier_settings(self, mapping: dict[str, str]):
        """The copier's settings (see ``MirrorCopier``'s documentation) as a Java map, built
        again only when the topics or their size limits change."""
        limits = {rem: self.remote_topics.max_message_bytes[rem] for rem in mapping.values()}
        key = (tuple(sorted(mapping.items())), tuple(sorted(limits.items())))
        if self._copier_settings_cache is not None and self._copier_settings_cache[0] == key:
            return self._copier_settings_cache[1]
        spec = self.spec
        largest = min(max(max(limits.values(), default=0), 1 << 20) + (64 << 10), (1 << 31) - 1)
        producer = {
            "linger.ms": "20",
            "batch.size": "524288",
            **spec.target_producer,
            "enable.idempotence": "true",
            "acks": "all",
            "max.request.size": str(largest),
            "buffer.memory": str(min(max(64 << 20, 2 * largest), 256 << 20)),
        }
        settings = {
            "source": spec.source,
            "target": spec.target,
            "source.principal": principal(spec.source_consumer),
            "target.principal": principal(spec.target_producer),
            "record.overhead": str(mirror_writer.RECORD_OVERHEAD),
            "error.prefix": mirror_writer.ERROR_PREFIX,
            **{f"consumer.{k}": v for k, v in spec.source_consumer.items()},
            **{f"producer.{k}": v for k, v in producer.items()},
            **{f"topic.{src}": rem for src, rem in mapping.items()},
            **{f"limit.{rem}": str(limit) for rem, limit in limits.items()},
        }
        if spec.emit_offset_syncs:
            settings["syncs.topic"] = spec.offset_syncs_topic
            settings["syncs.lag.max"] = str(spec.max_offset_lag)
            settings["syncs.interval.ms"] = str(spec.offset_syncs_interval_ms)
            settings["syncs"] = spec.offset_syncs_cluster
            settings["syncs.principal"] = principal(spec.offset_syncs_producer)
            for k, v in spec.offset_syncs_producer.items():
                settings[f"syncs.producer.{k}"] = v
        java_map = self.spark.sparkContext._jvm.java.util.HashMap()
        for k, v in settings.items():
            java_map.put(k, v)
        self._copier_settings_cache = (key, java_map)
        return java_map

    def _copy_in_transactions(self, batch: DataFrame, mapping: dict[str, str]) -> tuple:
        """Exactly-once: the Python workers copy each source partition in a transaction that
        also commits its position; then the offset syncs go out. Returns (records, bytes, syncs)."""
        from pyspark.sql import functions as F

        spec = self.spec
        assert self.positions is not None
        settings = mirror_writer.CopySettings(
            source_alias=spec.source,
            target_alias=spec.target,
            producer_config=self.copy_producer_config,
            remote_topics=mapping,
            max_message_bytes=dict(self.remote_topics.max_message_bytes),
            max_offset_lag=spec.max_offset_lag,
            transactional_id_prefix=f"mirrorflow-{spec.source}->{spec.target}",
            committed=self.positions.read_to_end(),
            offsets_topic=spec.offsets_topic,
            consumer_config=spec.target_consumer,
            admin_config=spec.target_admin,
        )

        def copy(batches):
            return mirror_writer.copy_records(settings, batches)

        rows = (
            batch.where(F.col("topic").isin(list(mapping)))
            .select(
                "topic",
                "partition",
                "offset",
                "key",
                "value",
                # Headers as JSON text (values base64): Arrow's conversion of an array of
                # structs costs more than all the rest of the copy (ListVector.setValueCount).
                F.when(
                    F.size("headers") > 0,
                    F.to_json(
                        F.transform(
                            "headers",
                            lambda h: F.struct(h.key.alias("k"), F.base64(h.value).alias("v")),
                        )
                    ),
                ).alias("headers"),
                F.expr("unix_millis(timestamp)").alias("ts_ms"),
            )
            .mapInArrow(copy, mirror_writer.RESULT_DDL)
            .collect()
        )
        syncs = [
            OffsetSync(r.topic, r.partition, r.upstream, r.downstream)
            for r in sorted(rows, key=lambda r: (r.topic, r.partition, r.upstream))
        ]
        if spec.emit_offset_syncs and syncs:
            self._write_offset_syncs(syncs)
        lasts = [r for r in rows if r.kind == "last"]
        return sum(r.records for r in lasts), sum(r.bytes for r in lasts), len(syncs)

    def _write_offset_syncs(self, syncs: list[OffsetSync]) -> None:
        producer = self.producers[self.spec.offset_syncs_cluster]
        failures: list = []
        for sync in syncs:
            while True:
                try:
                    producer.produce(
                        self.spec.offset_syncs_topic,
                        sync.value(),
                        sync.key(),
                        partition=0,
                        on_delivery=lambda err, _m: err and failures.append(err),
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        remaining = producer.flush(60)
        if failures or remaining:
            cause = failures[0] if failures else "timed out"
            raise MirrorflowError(
                f"writing offset syncs to {self.spec.offset_syncs_topic} on "
                f"{self.spec.offset_syncs_cluster} failed: {cause}",
                "the batch will be replayed when the job restarts; check the cluster",
            )


_UNREACHABLE = re.compile(
    r"TimeoutException|NetworkException|DisconnectException|Local: Timed out|"
    r"_TRANSPORT|All broker connections are down|not acknowledged within|did not answer"
)


_KAFKA_CAUSE = re.compile(r"org\.apache\.kafka\.common\.errors\.\w+: .*")
_DRIVER_ERROR = re.compile(r"mirrorflow\.errors\.(MirrorflowError|ClusterUnreachable): (.*)")


def _query_error(spec: MirrorSpec, exc) -> MirrorflowError:
    """The first line a user needs from a failed query (a copy error names the record); a
    cluster that did not answer gives :class:`ClusterUnreachable`, which is retried."""
    text = str(exc.desc if hasattr(exc, "desc") else exc)
    driver = _DRIVER_ERROR.search(text)  # raised by this driver inside foreachBatch
    if driver:
        kind = ClusterUnreachable if driver.group(1) == "ClusterUnreachable" else MirrorflowError
        return kind(f"flow {spec.flow} stopped: {driver.group(2).strip()}")
    match = re.search(re.escape(mirror_writer.ERROR_PREFIX) + r"(.*)", text)
    if match:
        message = f"flow {spec.flow} stopped: {match.group(1).strip()}"
        if _UNREACHABLE.search(match.group(1)):
            return ClusterUnreachable(message)
        return MirrorflowError(message)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # Kafka's own exception says more than Spark's wrappers around it.
    causes = [m[0] for ln in lines if (m := _KAFKA_CAUSE.search(ln))]
    first = causes[0] if causes else lines[0] if lines else text
    if _UNREACHABLE.search(text) and "AuthenticationException" not in text:
        cause = next((ln for ln in text.splitlines() if _UNREACHABLE.search(ln)), first)
        return ClusterUnreachable(
            f"flow {spec.flow}: a cluster did not answer: {cause.strip()[:300]}",
            f"check that {spec.source} and {spec.target} are up and reachable",
        )
    return MirrorflowError(f"flow {spec.flow} stopped: {first[:500]}", "see the job's log")
