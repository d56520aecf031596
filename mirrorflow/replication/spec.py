"""From a flow definition to what one mirror job runs: a :class:`MirrorSpec`.

This is where MirrorMaker 2's settings of a flow ``S->T`` become the job's inputs: clients
(secrets resolved from the flow files or their config providers, never from the command line),
the topic rule, naming, replication factors, heartbeats, offset syncs and start position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mirrorflow.config import validation
from mirrorflow.config.topology import Flow, Role, load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs
from mirrorflow.mm2.transforms import (
    RecordTransform,
    TransformError,
    compile_transforms,
    heartbeats_predicate,
)
from mirrorflow.replication.offset_map import map_topic
from mirrorflow.replication.positions import OFFSETS_TOPIC_PARTITIONS, offsets_topic

LOCAL_BATCH_MAX_RECORDS = 1000
"""The default of ``--local-batch-max-records`` at least once: below it, scheduling a Spark job
costs more than copying the records on the driver (see benchmarks/README.md, "Small batches")."""
EOS_LOCAL_BATCH_MAX_RECORDS = 50_000
"""Its default exactly once: the driver copies 1 KiB records in transactions at ~13,000 a
second, where a Spark job's start costs 0.5-1 s and ~0.7 CPU-s (the first of a job, its Python
workers' start, 12 s), so a steady flow's hiccup is caught up in the driver, not by a Spark job
that falls further behind (benchmarks/README.md, "Small exactly-once batches in the driver")."""


@dataclass
class MirrorSpec:
    """Everything one flow's job needs, resolved from the flow definition (secrets included)."""

    source: str
    target: str
    source_consumer: dict[str, str] = field(repr=False)  # Java client properties
    target_producer: dict[str, str] = field(repr=False)  # Java client properties
    offset_syncs_producer: dict[str, str] = field(repr=False)  # Java producer, syncs' cluster
    source_client: dict[str, str] = field(repr=False)  # librdkafka producer settings
    target_client: dict[str, str] = field(repr=False)
    source_admin: dict[str, str] = field(repr=False)  # librdkafka admin settings
    target_admin: dict[str, str] = field(repr=False)
    should_replicate: Callable[[str], bool]
    remote_topic: Callable[[str], str]
    replicate_config: Callable[[str], bool]
    replication_factor: int
    replicate_source_default: Callable[[str], bool] = lambda name: False
    sync_configs_enabled: bool = True
    sync_configs_interval_s: float = 600.0
    should_replicate_group: Callable[[str], bool] = lambda group: True
    sync_acls_enabled: bool = True
    sync_acls_interval_s: float = 600.0
    sync_acls_remove: bool = False  # remove the ACLs it created once the source's are gone
    acl_ledger_topic: str = ""  # on the target: the ACLs the sync created
    heartbeats_topic: str = "heartbeats"
    # Whether a topic is a heartbeats topic, its own cluster's or one copied from another
    # (``A.heartbeats``, ``B.A.heartbeats``): the replication policy's rule.
    is_heartbeats_topic: Callable[[str], bool] = lambda topic: False
    emit_heartbeats: bool = True
    heartbeats_interval_s: float = 1.0
    refresh_topics_enabled: bool = True
    refresh_topics_interval_s: float = 30.0  # mirrorflow's default (MirrorMaker 2's: 600)
    heartbeats_replication_factor: int = 3
    emit_offset_syncs: bool = True
    offset_syncs_topic: str = ""
    offset_syncs_location: str = "source"
    offset_syncs_replication_factor: int = 3
    max_offset_lag: int = 100
    # how often a stream's positions and the held-back offset syncs are written (MirrorMaker
    # 2: its offset flush, source offsets and held-back syncs)
    offset_flush_interval_ms: int = 5000
    # how long a stream's end waits for its copies' acknowledgements (MirrorMaker 2: a task's stop)
    stop_grace_ms: int = 5000  # DEFAULT_STOP_GRACE_MS
    flow_dir: str = ""  # the flow's local files: progress.json, the restart request
    starting_offsets: str = "earliest"  # earliest | latest | epoch milliseconds
    # A partition without a position starts at this group's committed offset on the source,
    # when it has one within the partition (``starting.offsets.group``; "": none)
    starting_offsets_group: str = ""
    # The flow's record transforms (Connect's transforms and record.filter), None: unchanged
    transform: RecordTransform | None = None
    provenance: bool = False  # provenance mode (provenance.header.enabled)
    retry_backoff_s: float = 2.0  # first wait after a cluster did not answer, doubling
    retry_backoff_max_s: float = 120.0
    # How long a cluster that does not answer is retried before the flow fails (-1: forever);
    # ``--retry-timeout``. After it, the job exits and its launcher (Airflow) takes over.
    retry_timeout_s: float = 600.0
    max_records_per_batch: int = 500_000
    # A batch of at most this many records is copied in the driver (at least once, its JVM;
    # exactly once, its Python), without a Spark job (0: every batch is a Spark job);
    # ``--local-batch-max-records``. None: the mode's default (:meth:`local_batch_limit`).
    local_batch_max_records: int | None = None
    # Caught up, an at-least-once flow copies continuously in the driver's JVM instead of batch
    # after batch (the default; ``--no-continuous``: batches only; exactly-once flows copy in
    # batches).
    continuous: bool = True
    # Positions live in Connect's offsets topic on the target, as MirrorMaker 2's. Exactly-once
    # (``<target>.exactly.once.source.support = enabled``) commits them with the copies.
    exactly_once: bool = False
    # exactly once, caught up: a batch (one transaction) starts at most this often; 0: each as
    # soon as records arrive (transaction.boundary = poll). See transaction_interval_ms().
    transaction_interval_ms: int = 100  # DEFAULT_TRANSACTION_INTERVAL_MS
    offsets_topic: str = ""
    offsets_partitions: int = OFFSETS_TOPIC_PARTITIONS
    offsets_replication_factor: int = 3
    target_consumer: dict[str, str] = field(default_factory=dict, repr=False)
    source_consumer_client: dict[str, str] = field(default_factory=dict, repr=False)  # librdkafka
    # Consumer-group checkpoints and offset sync (MirrorMaker 2's MirrorCheckpointConnector);
    # the offset map they translate with lives on the target, in ``offset_map_topic``.
    offset_map_topic: str = ""
    checkpoints_topic: str = ""
    checkpoints_replication_factor: int = 3
    emit_checkpoints_enabled: bool = True
    emit_checkpoints_interval_s: float = 60.0
    refresh_groups_enabled: bool = True
    refresh_groups_interval_s: float = 600.0
    sync_group_offsets_enabled: bool = False
    sync_group_offsets_interval_s: float = 60.0
    checkpoint_topic: Callable[[str], str] = lambda topic: topic  # source topic -> target name
    # Reverse checkpoints (failback): groups on the source that consumed the copies of the
    # target's topics, translated back with the opposite flow's offset map (on the source).
    reverse_checkpoints_enabled: bool = True
    reverse_map_topic: str = ""
    reverse_remote_topic: Callable[[str], str | None] = lambda topic: None  # target topic ->
    # its copy's name on the source, None if the policy cannot name it back (identity)

    @property
    def flow(self) -> str:
        return f"{self.source}->{self.target}"

    @property
    def offset_syncs_cluster(self) -> str:
        return self.source if self.offset_syncs_location == "source" else self.target

    @property
    def local_batch_limit(self) -> int:
        """The most records a batch copied in the driver holds (0: none is)."""
        if self.local_batch_max_records is not None:
            return self.local_batch_max_records
        return EOS_LOCAL_BATCH_MAX_RECORDS if self.exactly_once else LOCAL_BATCH_MAX_RECORDS


DEFAULT_OFFSET_FLUSH_INTERVAL_MS = 5000
"""How often a stream's positions and the held-back offset syncs are written unless
``offset.flush.interval.ms`` is set. MirrorMaker 2 writes its source offsets and those syncs at
each offset flush (Connect's default: every 60 s); sooner keeps checkpoints of caught-up groups
closer to the end of the topic, at a few records per partition, and a crash's re-copies
shorter."""


DEFAULT_TRANSACTION_INTERVAL_MS = validation.DEFAULT_TRANSACTION_INTERVAL_MS
"""How often a caught-up exactly-once flow commits (a batch, one transaction, of what arrived
since) unless the flow sets ``transaction.boundary``: Kafka Streams' ``commit.interval.ms`` under
exactly-once. MirrorMaker 2's default, ``poll``, commits each batch as soon as it is copied: lower
latency at a small load, more transactions and CPU (see :func:`transaction_interval_ms`)."""
CONNECT_OFFSET_FLUSH_INTERVAL_MS = 60_000
"""Connect's default ``offset.flush.interval.ms``, the interval of ``transaction.boundary =
interval`` when neither it nor ``transaction.boundary.interval.ms`` is set."""


DEFAULT_STOP_GRACE_MS = 5000
"""How long a stream's end waits for its copies' acknowledgements unless
``task.shutdown.graceful.timeout.ms`` is set: Connect's default for a task's graceful stop."""


def spec_for_flow(
    config_paths: Iterable[Path | str],
    flow_name: str,
    state_dir: Path | None = None,
    starting_offsets: str | None = None,
    base_dir: Path | None = None,
) -> MirrorSpec:
    """The mirror job's spec for ``flow_name`` (``S->T``) of the given flow files; relative file
    names in their settings are read from ``base_dir`` (None: the working directory)."""
    topology = load_topology(config_paths, base_dir=base_dir)
    flow = topology.flow(flow_name)
    validation.require_valid(topology, f"so flow {flow_name} does not run")
    if not flow.enabled:
        raise MirrorflowError(
            f"flow {flow_name} is not enabled in {', '.join(map(str, config_paths))}",
            f"set {flow_name}.enabled = true (`mirrorflow plan` shows the enabled flows)",
        )
    source_consumer = flow.client_config("source.consumer", label="mirror")
    reset = source_consumer.get("auto.offset.reset", "earliest")
    location = str(flow.setting("offset-syncs.topic.location"))
    exactly_once = _exactly_once(flow, source_consumer)
    syncs_producer: Role = "source.producer" if location == "source" else "target.producer"
    return MirrorSpec(
        source=flow.source,
        target=flow.target,
        source_consumer=source_consumer,
        target_producer=flow.client_config("target.producer", label="mirror"),
        offset_syncs_producer=flow.client_config(syncs_producer, label="offset-syncs"),
        source_client=flow.client_config("source.producer", librdkafka=True, label="mirror"),
        target_client=flow.client_config("target.producer", librdkafka=True, label="mirror"),
        source_admin=flow.client_config("source.admin", librdkafka=True, label="mirror"),
        target_admin=flow.client_config("target.admin", librdkafka=True, label="mirror"),
        should_replicate=flow.should_replicate_topic,
        remote_topic=flow.remote_topic,
        replicate_config=flow.config_property_filter.should_replicate_config_property,
        replicate_source_default=flow.config_property_filter.should_replicate_source_default,
        sync_configs_enabled=bool(flow.setting("sync.topic.configs.enabled")),
        sync_configs_interval_s=float(flow.numeric_setting("sync.topic.configs.interval.seconds")),
        should_replicate_group=flow.should_replicate_group,
        sync_acls_enabled=bool(flow.setting("sync.topic.acls.enabled")),
        sync_acls_interval_s=float(flow.numeric_setting("sync.topic.acls.interval.seconds")),
        sync_acls_remove=bool(flow.setting("sync.topic.acls.remove.enabled")),
        acl_ledger_topic=f"mirrorflow-acls.{flow.source}.internal",
        replication_factor=int(flow.numeric_setting("replication.factor")),
        heartbeats_topic=flow.policy.heartbeats_topic(),
        is_heartbeats_topic=flow.policy.is_heartbeats_topic,
        emit_heartbeats=bool(flow.setting("emit.heartbeats.enabled")),
        heartbeats_interval_s=float(flow.numeric_setting("emit.heartbeats.interval.seconds")),
        refresh_topics_enabled=bool(flow.setting("refresh.topics.enabled")),
        refresh_topics_interval_s=float(flow.numeric_setting("refresh.topics.interval.seconds")),
        heartbeats_replication_factor=int(
            flow.numeric_setting("heartbeats.topic.replication.factor")
        ),
        emit_offset_syncs=bool(flow.setting("emit.offset-syncs.enabled")),
        offset_syncs_topic=flow.policy.offset_syncs_topic(
            flow.target if location == "source" else flow.source
        ),
        offset_syncs_location=location,
        offset_syncs_replication_factor=int(
            flow.numeric_setting("offset-syncs.topic.replication.factor")
        ),
        max_offset_lag=int(flow.numeric_setting("offset.lag.max")),
        offset_flush_interval_ms=_worker_int(
            flow, "offset.flush.interval.ms", DEFAULT_OFFSET_FLUSH_INTERVAL_MS
        ),
        stop_grace_ms=_worker_int(flow, "task.shutdown.graceful.timeout.ms", DEFAULT_STOP_GRACE_MS),
        flow_dir=str(state_dir / f"{flow.source}-{flow.target}") if state_dir else "",
        starting_offsets=starting_offsets or reset,
        # an explicit start (--starting-offsets) applies to every partition
        starting_offsets_group=""
        if starting_offsets
        else str(flow.setting(configdefs.STARTING_OFFSETS_GROUP) or ""),
        exactly_once=exactly_once,
        transaction_interval_ms=transaction_interval_ms(flow),
        transform=flow_transform(flow),
        provenance=bool(flow.setting(configdefs.PROVENANCE)),
        offsets_topic=offsets_topic(flow.source),
        offsets_partitions=_worker_int(flow, "offset.storage.partitions", OFFSETS_TOPIC_PARTITIONS),
        offsets_replication_factor=_worker_int(flow, "offset.storage.replication.factor", 3),
        target_consumer=flow.client_config("target.consumer", librdkafka=True, label="mirror"),
        source_consumer_client=flow.client_config(
            "source.consumer", librdkafka=True, label="mirror"
        ),
        offset_map_topic=map_topic(flow.source),
        checkpoints_topic=flow.policy.checkpoints_topic(flow.source),
        checkpoints_replication_factor=int(
            flow.numeric_setting("checkpoints.topic.replication.factor")
        ),
        emit_checkpoints_enabled=bool(flow.setting("emit.checkpoints.enabled")),
        emit_checkpoints_interval_s=float(
            flow.numeric_setting("emit.checkpoints.interval.seconds")
        ),
        refresh_groups_enabled=bool(flow.setting("refresh.groups.enabled")),
        refresh_groups_interval_s=float(flow.numeric_setting("refresh.groups.interval.seconds")),
        sync_group_offsets_enabled=bool(flow.setting("sync.group.offsets.enabled")),
        sync_group_offsets_interval_s=float(
            flow.numeric_setting("sync.group.offsets.interval.seconds")
        ),
        checkpoint_topic=flow.checkpoint_topic,
        reverse_checkpoints_enabled=bool(flow.setting("emit.reverse.checkpoints.enabled")),
        reverse_map_topic=map_topic(flow.target),
        # provenance mode: the identity policy cannot trace a copy back, the header does
        reverse_remote_topic=(
            (lambda topic: flow.policy.format_remote_topic(flow.target, topic))
            if flow.setting(configdefs.PROVENANCE)
            else flow.reverse_remote_topic
        ),
    )


def _worker_setting(flow: Flow, name: str) -> str | None:
    """A worker setting of the flow's herder as MirrorMaker 2 builds it
    (``MirrorMakerConfig.workerConfig``): the top-level ``name`` if MirrorMaker 2 takes it from
    there (:data:`~mirrorflow.mm2.configdefs.WORKER_TOP_LEVEL_PREFIXES`), which it puts over the
    target's, else ``<target>.name``. ``validate`` warns about a top-level one it ignores and
    about a target's one a top-level one overrides."""
    if name.startswith(configdefs.WORKER_TOP_LEVEL_PREFIXES):
        top = flow.topology.props.get(name)
        if top is not None:
            return top.value.strip()
    cluster = flow.topology.cluster(flow.target).props.get(name)
    return cluster.value.strip() if cluster is not None else None


def transaction_interval_ms(flow: Flow) -> int:
    """How often the exactly-once flow ``flow`` commits once caught up (0: each batch as soon as
    it is copied), from the Connect source-connector settings MirrorMaker 2 hands its connector
    (``S->T.transaction.boundary``, ``S->T.transaction.boundary.interval.ms``; never the top
    level, which MirrorMaker 2 drops): ``poll`` commits each batch, ``interval`` every
    ``transaction.boundary.interval.ms``, else the target worker's ``offset.flush.interval.ms``,
    else Connect's 60 s; unset, mirrorflow's :data:`DEFAULT_TRANSACTION_INTERVAL_MS`. (``validate``
    refuses other values, ``connector`` too: MirrorMaker 2's connector defines no boundaries.)"""
    boundary = flow.originals.get("transaction.boundary")
    if boundary is None:
        return DEFAULT_TRANSACTION_INTERVAL_MS
    if boundary.value.strip().lower() == "poll":
        return 0
    interval = flow.originals.get("transaction.boundary.interval.ms")
    if interval is not None:
        return int(interval.value.strip())
    return _worker_int(flow, "offset.flush.interval.ms", CONNECT_OFFSET_FLUSH_INTERVAL_MS)


def _worker_int(flow: Flow, name: str, default: int) -> int:
    value = _worker_setting(flow, name)
    try:
        return default if value is None else int(value)
    except ValueError:
        raise MirrorflowError(f"{name} = {value!r} is not a whole number") from None


def _exactly_once(flow: Flow, source_consumer: dict[str, str]) -> bool:
    """Whether the target's worker enables exactly-once source support, as MM2 reads it."""
    mode = (_worker_setting(flow, "exactly.once.source.support") or "disabled").lower()
    if mode != "enabled":
        return False
    if source_consumer.get("isolation.level") != "read_committed":
        raise MirrorflowError(
            f"{flow.target}.exactly.once.source.support = enabled, but flow {flow.name} reads "
            f"{flow.source} with isolation.level = "
            f"{source_consumer.get('isolation.level', 'read_uncommitted')}: aborted "
            "transactions would be copied",
            f"set {flow.source}.consumer.isolation.level = read_committed "
            f"(or {flow.name}.consumer.isolation.level), as MirrorMaker 2 requires",
        )
    return True


def flow_transform(flow: Flow) -> RecordTransform | None:
    """The flow's record transforms (see :mod:`mirrorflow.mm2.transforms`)."""
    try:
        return compile_transforms(
            flow.values,
            str(flow.setting(configdefs.RECORD_FILTER) or ""),
            (flow.source, flow.target) if flow.setting(configdefs.PROVENANCE) else None,
            heartbeats_predicate(flow.policy),
            {
                "key": str(flow.setting(configdefs.RECORD_KEY) or ""),
                "value": str(flow.setting(configdefs.RECORD_VALUE) or ""),
            },
        )
    except TransformError as exc:
        raise MirrorflowError(f"flow {flow.name}: {exc.key}: {exc.problem}", exc.fix) from None
