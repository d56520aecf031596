"""Remote topics on the target: created before the first copy, grown, never shrunk or deleted.

Follows MirrorMaker 2's ``computeAndCreateTopicPartitions``: a missing remote topic is created
with the source's partition count, the flow's ``replication.factor`` and the source topic's
replicable (non-default, non-sensitive, not excluded) configs; a remote topic with fewer
partitions than its source is increased. MirrorMaker 2's internal single-partition compacted
topics (heartbeats, offset syncs) are created here too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication import admin_helper, clients
from mirrorflow.replication.offset_map import OFFSET_MAP_TOPIC_CONFIG

if TYPE_CHECKING:
    from mirrorflow.replication.spec import MirrorSpec

ADMIN_TIMEOUT_S = 30.0


class ClusterAdmin:
    """An admin client of one cluster that names the cluster and principal in its errors.

    Authentication failures reach librdkafka's error callback, not the failing call, so they
    are collected here and end a metadata request at once instead of after its timeout. A
    metadata answer tells :mod:`~mirrorflow.replication.clients` that the cluster answers.

    ACL requests and the listing of consumer groups, whose answers librdkafka can crash the
    process on, run in a helper process (:mod:`~mirrorflow.replication.admin_helper`); they take
    and return what ``AdminClient``'s methods of the same names do.
    """

    def __init__(self, alias: str, config: dict[str, str]) -> None:
        self.alias = alias
        self.principal = client_principal(config)
        self.auth_error: KafkaError | None = None
        self._config = config
        self.client = clients.admin(alias, config, on_error=self._on_error)
        self._helper = admin_helper.helper(alias, config)
        self.describe_acls = self._helper.describe_acls
        self.create_acls = self._helper.create_acls
        self.delete_acls = self._helper.delete_acls
        self.list_consumer_groups = self._helper.list_consumer_groups

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in _AUTH_ERRORS:
            self.auth_error = error

    def metadata(self):
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while True:
            try:
                metadata = self.client.list_topics(timeout=2)
            except KafkaException as exc:
                self.client.poll(0.1)  # serves the error callback
                if self.auth_error is not None:
                    raise cluster_error(
                        self, "connecting", KafkaException(self.auth_error)
                    ) from None
                if time.monotonic() > deadline:
                    # A new client next time, as a restart of the job would make: one kept
                    # failing with "Broker transport failure" for minutes after its broker
                    # restarted and answered every other client.
                    self.client = clients.admin(self.alias, self._config, on_error=self._on_error)
                    raise cluster_error(self, "listing topics", exc) from None
            else:
                clients.answered(self.alias)
                return metadata


_AUTHORIZATION_ERRORS = (
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)
_AUTH_ERRORS = (  # never retried: trying again does not mend them
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._SSL,  # a TLS handshake refused: a certificate, a truststore
    *_AUTHORIZATION_ERRORS,
)


def client_principal(config: dict[str, str]) -> str:
    """Who a librdkafka client config logs in as, for messages."""
    return config.get("sasl.username") or config.get("sasl.kerberos.principal") or "(no SASL user)"


def refused(exc: Exception) -> bool:
    """Whether a failed admin call was refused (authentication or authorisation)."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    return err is not None and err.code() in _AUTH_ERRORS


def unauthorized(err: KafkaError | None) -> bool:
    """Whether a client error is an authorisation failure (a missing ACL)."""
    return err is not None and err.code() in _AUTHORIZATION_ERRORS


def refusal(
    cluster: str, principal: str, action: str, text: str, needs: str | None = None
) -> MirrorflowError:
    """The one line of a refusal: the cluster, the principal it refused, what was being done and,
    when known, the operation and resource that needs (an ACL to grant)."""
    if needs:
        return MirrorflowError(
            f"cluster {cluster} refused principal {principal} while {action}, which needs "
            f"{needs}: {text}",
            f"add that ACL for User:{principal} on {cluster}",
        )
    return MirrorflowError(
        f"cluster {cluster} refused principal {principal} while {action}: {text}",
        f"check the credentials and ACLs of {principal} on {cluster}",
    )


def config_source(entry: ConfigEntry) -> int:
    """Where a described config's value comes from: a :class:`ConfigSource`'s value, the number
    confluent-kafka's C client sets there (ConfigEntry annotates it as the enum)."""
    return cast(int, entry.source)


def cluster_error(
    admin: ClusterAdmin,
    action: str,
    exc: Exception,
    needs: str | None = None,
    principal: str | None = None,
) -> MirrorflowError:
    """A clear error for a failed admin call: authorisation, reachability, or other.

    ``needs`` names the ACL the call needs (e.g. ``ALTER_CONFIGS on topic t``), said when the
    cluster refused it; ``principal`` is the client's if it is not the admin client's."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    code = err.code() if err else None
    text = _text(err) if err else str(exc)
    if code in _AUTH_ERRORS:
        needs = needs if code in _AUTHORIZATION_ERRORS else None
        return refusal(admin.alias, principal or admin.principal, action, text, needs)
    if code in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN) or (
        err is not None and err.retriable()  # e.g. a leader moving after a broker restart
    ):
        return did_not_answer(admin.alias, action, text)
    return MirrorflowError(f"cluster {admin.alias}: {action} failed: {text}")


def did_not_answer(alias: str, action: str, text: str) -> ClusterUnreachable:
    """Cluster ``alias`` did not answer while ``action``: the one line every such error reads."""
    return ClusterUnreachable(
        f"cluster {alias} did not answer while {action}: {text}",
        f"check {alias}.bootstrap.servers and that the cluster is up",
    )


def _text(err: KafkaError) -> str:
    """The error's text, with its name where librdkafka gives none (``ConsumerGroupDescribe: ``)."""
    text = err.str().strip()
    return text if text and not text.endswith(":") else f"{text} {err.name()}".strip()


def ensure_internal_topic(
    admin: ClusterAdmin,
    topic: str,
    replication_factor: int,
    setting: str,
    partitions: int = 1,
    config: dict[str, str] | None = None,
) -> None:
    """Create a compacted internal topic (heartbeats, offset syncs: one partition) if missing,
    with ``config`` besides."""
    metadata = admin.metadata()
    if topic in metadata.topics:
        return
    _check_replication_factor(admin, metadata, replication_factor, setting)
    settings = {"cleanup.policy": "compact", **(config or {})}
    new = NewTopic(topic, partitions, replication_factor, config=settings)
    _create(admin, [new])


def _check_replication_factor(admin: ClusterAdmin, metadata, factor: int, setting: str) -> None:
    brokers = len(metadata.brokers)
    if factor > brokers:
        raise MirrorflowError(
            f"{setting}={factor} but cluster {admin.alias} has {brokers} broker(s)",
            f"set {setting} to at most {brokers} in the flow configuration",
        )


def _create(admin: ClusterAdmin, topics: list[NewTopic]) -> None:
    for name, future in admin.client.create_topics(topics, request_timeout=ADMIN_TIMEOUT_S).items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise cluster_error(
                    admin, f"creating topic {name}", exc, f"CREATE on topic {name}"
                ) from None


class RemoteTopics:
    """Keeps every replicated source topic's remote topic present and at least as wide."""

    def __init__(
        self,
        source: ClusterAdmin,
        target: ClusterAdmin,
        should_replicate: Callable[[str], bool],
        remote_name: Callable[[str], str],
        replication_factor: int,
        replicate_config: Callable[[str], bool],
        flow: str,
    ) -> None:
        self.source, self.target = source, target
        self.should_replicate, self.remote_name = should_replicate, remote_name
        self.replication_factor, self.replicate_config = replication_factor, replicate_config
        self.flow = flow
        self.partitions: dict[str, int] = {}  # remote topic -> partitions known to exist
        self.source_partitions: dict[str, int] = {}  # replicated source topic -> partitions
        self.max_message_bytes: dict[str, int] = {}

    def prepare(self, limits: bool = True) -> dict[str, str]:
        """Source topic -> remote topic for every replicated topic, remote topics made ready,
        and :attr:`max_message_bytes` of each new one read; with ``limits``, of every one read
        again: an admin or a config sync may have changed a remote topic's limit since (a
        stream's producer must then start again with batches that fit it: KAFKA-8350)."""
        source_topics = {
            name: len(meta.partitions)
            for name, meta in self.source.metadata().topics.items()
            if self.should_replicate(name)
        }
        mapping = {name: self.remote_name(name) for name in source_topics}
        stale = {s for s, r in mapping.items() if self.partitions.get(r, -1) < source_topics[s]}
        if stale:
            self._create_or_grow({s: source_topics[s] for s in stale}, mapping)
        known = [remote for source, remote in mapping.items() if source not in stale]
        if known and limits:
            self.read_limits(known)
        self.source_partitions = source_topics
        return mapping

    def read_limits(self, remotes: list[str]) -> None:
        """Read the ``max.message.bytes`` of ``remotes`` (remote topics that exist) again into
        :attr:`max_message_bytes`."""
        self.max_message_bytes.update(self._max_message_bytes(remotes))

    def _create_or_grow(self, counts: dict[str, int], mapping: dict[str, str]) -> None:
        target_meta = self.target.metadata()
        missing = [s for s in counts if mapping[s] not in target_meta.topics]
        if missing:
            _check_replication_factor(
                self.target, target_meta, self.replication_factor, f"{self.flow}.replication.factor"
            )
            configs = self._replicable_configs(missing)
            _create(
                self.target,
                [
                    NewTopic(mapping[s], counts[s], self.replication_factor, config=configs[s])
                    for s in missing
                ],
            )
        grow = [
            NewPartitions(mapping[s], counts[s])
            for s in counts
            if s not in missing and len(target_meta.topics[mapping[s]].partitions) < counts[s]
        ]
        if grow:
            for name, future in self.target.client.create_partitions(grow).items():
                try:
                    future.result()
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.INVALID_PARTITIONS:
                        raise cluster_error(
                            self.target,
                            f"adding partitions to {name}",
                            exc,
                            f"ALTER on topic {name}",
                        ) from None
        self.read_limits([mapping[s] for s in counts])
        for s in counts:
            self.partitions[mapping[s]] = counts[s]

    def _replicable_configs(self, topics: list[str]) -> dict[str, dict[str, str]]:
        """Non-default, non-sensitive, non-read-only, not excluded source topic configs."""
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
        result = {}
        for resource, future in self.source.client.describe_configs(resources).items():
            try:
                entries: dict[str, ConfigEntry] = future.result()
            except KafkaException as exc:
                needs = f"DESCRIBE_CONFIGS on topic {resource.name}"
                raise cluster_error(
                    self.source, f"describing {resource.name}", exc, needs
                ) from None
            result[resource.name] = {
                name: entry.value
                for name, entry in entries.items()
                if config_source(entry) == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
                and entry.value is not None  # (a topic's own config has one)
                and not entry.is_sensitive
                and not entry.is_read_only
                and self.replicate_config(name)
            }
        return result

    def _max_message_bytes(self, remotes: list[str]) -> dict[str, int]:
        """``max.message.bytes`` of each remote topic (retried while a new topic propagates).

        A topic the target created but still does not know after ``ADMIN_TIMEOUT_S`` is the
        target not answering (:class:`~mirrorflow.errors.ClusterUnreachable`: the refresh runs
        again, the flow fails only after its retry timeout): an overloaded broker can take that
        long to learn its controller's new topics, as in a mesh creating hundreds at once."""
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in remotes]
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while True:
            try:
                return {
                    resource.name: int(future.result()["max.message.bytes"].value)
                    for resource, future in self.target.client.describe_configs(resources).items()
                }
            except KafkaException as exc:
                unknown = exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                if unknown and time.monotonic() > deadline:
                    raise did_not_answer(
                        self.target.alias,
                        f"describing {', '.join(remotes)}",
                        f"created, but still unknown to it after {ADMIN_TIMEOUT_S:.0f}s",
                    ) from None
                if not unknown:
                    needs = f"DESCRIBE_CONFIGS on topics {', '.join(remotes)}"
                    raise cluster_error(self.target, f"describing {remotes}", exc, needs) from None
                time.sleep(0.2)


def write_records(
    producer,
    topic: str,
    records: Iterable[tuple[bytes, bytes | None]],
    *,
    cluster: str,
    principal: str,
    what: str,
    hint: str,
    error: type[MirrorflowError] = MirrorflowError,
    timeout_s: float = ADMIN_TIMEOUT_S,
    abandon: Callable[[], bool] | None = None,
) -> None:
    """Write ``(key, value)`` records to partition 0 of one of mirrorflow's internal topics and
    wait until every one is acknowledged.

    A refusal raises the one line naming ``cluster``, ``principal`` and WRITE on ``topic``; any
    other failure (or a timeout) raises ``error`` saying ``what`` failed, with ``hint``. Once
    ``abandon()`` says so (the flow was paused), it returns without waiting more: the records
    stay with the producer, which sends them if the cluster answers.
    """
    failures: list[KafkaError] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failures.append(err)

    for key, value in records:
        while True:
            try:
                producer.produce(topic, value, key, partition=0, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
            except KafkaException as exc:  # refused at once: the topic failed before
                failures.append(exc.args[0])
                break
        if failures:
            break
    deadline = time.monotonic() + timeout_s
    while True:
        wait = deadline - time.monotonic()
        remaining = producer.flush(max(0.0, wait if abandon is None else min(wait, 0.5)))
        if not remaining or failures or wait <= 0.5 or abandon is None:
            break
        if abandon():
            return
    if failures and unauthorized(failures[0]):
        raise refusal(cluster, principal, what, failures[0].str(), f"WRITE on topic {topic}")
    if failures or remaining:
        cause = failures[0].str() if failures else f"not acknowledged within {timeout_s:.0f} s"
        raise error(f"{what} on {cluster} failed: {cause}", hint)


def ensure_flow_topics(spec: MirrorSpec, admins: dict[str, ClusterAdmin]) -> None:
    """Create the internal topics the flow ``spec`` writes, those it needs, where they are
    missing (by alias in ``admins``): its offset syncs (on the cluster
    ``offset-syncs.topic.location`` names), heartbeats, positions (Connect's offsets topic),
    offset map and checkpoints, each with its MirrorMaker 2 replication-factor setting."""
    # (wanted, cluster, topic, replication factor, its setting, partitions, configs)
    internal = [
        (
            spec.emit_offset_syncs,
            spec.offset_syncs_cluster,
            spec.offset_syncs_topic,
            spec.offset_syncs_replication_factor,
            "offset-syncs.topic.replication.factor",
            1,
            None,
        ),
        (
            spec.emit_heartbeats,
            spec.target,
            spec.heartbeats_topic,
            spec.heartbeats_replication_factor,
            "heartbeats.topic.replication.factor",
            1,
            None,
        ),
        (
            True,
            spec.target,
            spec.offsets_topic,
            spec.offsets_replication_factor,
            "offset.storage.replication.factor",
            spec.offsets_partitions,
            None,
        ),
        (
            True,
            spec.target,
            spec.offset_map_topic,
            spec.checkpoints_replication_factor,
            "checkpoints.topic.replication.factor",
            1,
            OFFSET_MAP_TOPIC_CONFIG,
        ),
        (
            spec.emit_checkpoints_enabled,
            spec.target,
            spec.checkpoints_topic,
            spec.checkpoints_replication_factor,
            "checkpoints.topic.replication.factor",
            1,
            None,
        ),
    ]
    for wanted, cluster, topic, factor, setting, partitions, configs in internal:
        if wanted:
            ensure_internal_topic(admins[cluster], topic, factor, setting, partitions, configs)
