"""The online plan: what each enabled flow would replicate now, and what it leaves out and why.

For every enabled flow the plan lists the source cluster's topics (as MM2's admin client does)
and decides each one with MM2's rule, naming the remote topic, its partition count and whether
it already exists on the target; it lists the source's consumer groups and decides them as
``MirrorCheckpointConnector`` does (the group filter, then committed offsets on at least one
topic the topic filter accepts). Everything left out comes with the reason. Clusters are reached
through the flows' own admin settings, translated for librdkafka, with short timeouts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from mirrorflow.config.topology import Flow, Topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.spec import flow_transform


@dataclass
class TopicPlan:
    topic: str
    partitions: int
    remote: str
    remote_partitions: int | None  # None: the remote topic does not exist yet


@dataclass
class LeftOut:
    name: str
    reason: str


@dataclass
class FlowPlan:
    flow: str
    policy: str
    topics: list[TopicPlan] = field(default_factory=list)
    topics_left_out: list[LeftOut] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    groups_left_out: list[LeftOut] = field(default_factory=list)
    # the flow's record transforms (mirrorflow.mm2.transforms), "" when it copies unchanged
    records: str = ""
    # the Spark application (mirror DAG mirror__<application>) that runs it
    application: str = ""


@dataclass
class Plan:
    flows: list[FlowPlan]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def render(self) -> str:
        """The plan as text for a terminal."""
        if not self.flows:
            return "no enabled flows (set <source>-><target>.enabled = true)\n"
        lines: list[str] = []
        for plan in self.flows:
            lines.append(f"{plan.flow}  ({plan.policy})")
            if plan.application:
                lines.append(f"  runs in: mirror__{plan.application} (one Spark application)")
            if plan.records:
                lines.append(f"  records transformed: {plan.records}")
            lines.append(f"  topics replicated ({len(plan.topics)}):")
            for t in plan.topics:
                remote = (
                    f"exists, {t.remote_partitions} partitions"
                    if t.remote_partitions is not None
                    else "to be created"
                )
                lines.append(f"    {t.topic}  [{t.partitions} partitions] -> {t.remote} ({remote})")
            lines += _left_out("topics left out", plan.topics_left_out)
            lines.append(f"  groups checkpointed ({len(plan.groups)}): {', '.join(plan.groups)}")
            lines += _left_out("groups left out", plan.groups_left_out)
        return "\n".join(lines) + "\n"


def _left_out(title: str, items: list[LeftOut]) -> list[str]:
    return [f"  {title} ({len(items)}):", *(f"    {i.name}: {i.reason}" for i in items)]


class _Clusters:
    """One admin client per cluster and settings, with errors that name the cluster."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._admins: dict[tuple, tuple[AdminClient, list[str]]] = {}

    def admin(self, alias: str, config: dict[str, str]) -> tuple[AdminClient, list[str]]:
        key = (alias, tuple(sorted(config.items())))
        if key not in self._admins:
            errors: list[str] = []
            settings = {
                **config,
                "socket.connection.setup.timeout.ms": int(self.timeout * 1000),
                "error_cb": lambda err: errors.append(err.str()),
                "log_level": 0,
            }
            self._admins[key] = (clients.admin(alias, settings, quiet=True), errors)
        return self._admins[key]

    def topics(self, alias: str, config: dict[str, str]) -> dict[str, int]:
        """Topic name -> partition count on the cluster."""
        admin, errors = self.admin(alias, config)
        try:
            metadata = admin.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise self._error(alias, config, errors, exc) from None
        return {name: len(t.partitions) for name, t in metadata.topics.items() if not t.error}

    def groups(self, alias: str, config: dict[str, str]) -> list[str]:
        admin, errors = self.admin(alias, config)
        try:
            listing = admin.list_consumer_groups(request_timeout=self.timeout).result()
        except KafkaException as exc:
            raise self._error(alias, config, errors, exc) from None
        return sorted(g.group_id for g in listing.valid)

    def committed_topics(
        self, alias: str, config: dict[str, str], group: str, topics: dict[str, int]
    ) -> set[str]:
        """Which of ``topics`` (name -> partitions) ``group`` has committed offsets on.

        Read by a consumer of the group, not the admin API, whose offset listing crashes the
        process on a NOT_COORDINATOR answer (confluentinc/librdkafka#5040)."""
        _admin, errors = self.admin(alias, config)
        partitions = [TopicPartition(t, p) for t, n in sorted(topics.items()) for p in range(n)]
        if not partitions:
            return set()
        settings = {**config, "group.id": group, "enable.auto.commit": False}
        consumer = clients.consumer(alias, settings, quiet=True)
        try:
            committed = consumer.committed(partitions, timeout=self.timeout)
        except KafkaException as exc:
            raise self._error(alias, config, errors, exc) from None
        finally:
            consumer.close()
        return {tp.topic for tp in committed if tp.offset >= 0}

    def _error(self, alias: str, config: dict, errors: list[str], exc: KafkaException) -> Exception:
        error: KafkaError = exc.args[0]
        self.admin(alias, config)[0].poll(0)  # serve the error callbacks: the real cause
        detail = errors[-1] if errors else error.str()
        hint = connection_hint(alias, detail)
        return MirrorflowError(
            f"cannot reach cluster {alias} at {config.get('bootstrap.servers', '?')}: {detail}",
            hint,
        )


def connection_hint(alias: str, detail: str) -> str:
    """What to check when a client of cluster ``alias`` could not connect with ``detail``."""
    lowered = detail.lower()
    if "certificate verify failed" in lowered:
        return (
            f"{alias}'s certificate is not trusted: check {alias}'s ssl.truststore.* (it must "
            "hold the CA that signed the brokers' certificates)"
        )
    if "alert certificate" in lowered or "alert bad certificate" in lowered:
        return (
            f"{alias} refused the client certificate: check {alias}'s ssl.keystore.* (a "
            "certificate signed by a CA its brokers trust)"
        )
    if any(w in lowered for w in ("authentication", "sasl", "ssl handshake")):
        return f"check the credentials configured for {alias} (sasl.jaas.config, ssl.*)"
    return f"check that {alias}'s brokers are up and bootstrap.servers is right"


def build_plan(topology: Topology, timeout: float = 10.0) -> Plan:
    """The plan of every enabled flow, read from the live clusters."""
    clusters = _Clusters(timeout)
    return Plan([_flow_plan(flow, clusters) for flow in topology.flows])


def _flow_plan(flow: Flow, clusters: _Clusters) -> FlowPlan:
    source_admin = flow.client_config("source.admin", librdkafka=True)
    target_admin = flow.client_config("target.admin", librdkafka=True)
    transform = flow_transform(flow)
    plan = FlowPlan(
        flow.name,
        type(flow.policy).__name__,
        records=transform.description if transform else "",
        application=flow.mirror_application,
    )
    source_topics = clusters.topics(flow.source, source_admin)
    target_topics = clusters.topics(flow.target, target_admin)
    for topic in sorted(source_topics):
        reason = flow.why_not_replicated(topic)
        if reason:
            plan.topics_left_out.append(LeftOut(topic, reason))
            continue
        remote = flow.remote_topic(topic)
        plan.topics.append(
            TopicPlan(topic, source_topics[topic], remote, target_topics.get(remote))
        )
    checkpoints = flow.setting("emit.checkpoints.enabled")
    for group in clusters.groups(flow.source, source_admin):
        reason = flow.group_filter.why_not(group)
        if reason is None and not checkpoints:
            reason = "emit.checkpoints.enabled = false: no checkpoints for this flow"
        if reason is None:
            replicated = {
                t: n
                for t, n in source_topics.items()
                if flow.topic_filter.should_replicate_topic(t)
            }
            consumed = clusters.committed_topics(flow.source, source_admin, group, replicated)
            if not consumed:
                reason = "no committed offsets on a topic the topic filter accepts"
        if reason:
            plan.groups_left_out.append(LeftOut(group, reason))
        else:
            plan.groups.append(group)
    return plan
