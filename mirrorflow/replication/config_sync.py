"""Topic-config and partition sync of a flow, by MirrorMaker 2 4.x's rules, diff first (its ACL
sync: :mod:`mirrorflow.replication.acl_sync`; what both share:
:mod:`mirrorflow.replication.flow_sync`).

MirrorMaker 2 (``MirrorSourceConnector.syncTopicConfigs`` and ``computeAndCreateTopicPartitions``)
applies, every ``sync.topic.configs.interval.seconds``, to each replicated topic whose remote topic
exists on the target:

* the source topic's configs that are neither read-only, sensitive, a static broker setting, nor
  excluded by ``config.properties.exclude`` (the ``config.property.filter.class``);
* by incremental alter: a config at its default on the source is **deleted** on the target (the
  target's own default applies) unless ``use.defaults.from = source``; any other is **set** to
  the source's value;
* partition counts are raised to the source's, never lowered; topics are never deleted.

mirrorflow computes the same result as a list of changes, compared with what the target holds
now, so a run shows what it would change before it changes anything (``dry_run``) and a second
run finds nothing to do. Settings the filter excludes (``min.insync.replicas``, the throttles,
...) are never touched on the target.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    ResourceType,
)

from mirrorflow.replication.acl_sync import AclChange, AclSync
from mirrorflow.replication.flow_sync import FlowSync, SyncReport
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import (
    ADMIN_TIMEOUT_S,
    ClusterAdmin,
    cluster_error,
    config_source,
)

__all__ = ["AclChange", "AclSync", "Change", "FlowSync", "SyncReport", "TopicSync", "run_syncs"]

_SKIPPED_SOURCES = (ConfigSource.STATIC_BROKER_CONFIG.value,)


@dataclass(frozen=True)
class Change:
    """One change the sync makes on the target."""

    kind: str  # "config" or "partitions"
    action: str  # "set", "delete" (back to the target's default), "increase"
    topic: str  # the remote topic
    name: str = ""  # the config's name
    before: str | None = None  # the target's value now (None: its default)
    after: str | None = None  # the value it gets (None: its default)

    def describe(self) -> str:
        if self.kind == "partitions":
            return f"{self.topic}: partitions {self.before} -> {self.after}"
        if self.action == "delete":
            return f"{self.topic}: {self.name} {self.before} -> the target's default"
        return f"{self.topic}: {self.name} {self.before or '(default)'} -> {self.after}"

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


class TopicSync(FlowSync):
    """Topic configs and partition counts of one flow's remote topics, kept as the source's."""

    what = "configs"

    def diff(self, notes: list[str] | None = None) -> list[Change]:
        """Every change the sync would make now, partitions first, then configs by topic."""
        notes = notes if notes is not None else []
        source_meta, target_meta = self.source.metadata(), self.target.metadata()
        pairs = {}
        for name in sorted(source_meta.topics):
            if not self.spec.should_replicate(name):
                continue
            remote = self.spec.remote_topic(name)
            if remote in target_meta.topics:
                pairs[name] = remote
            else:
                notes.append(
                    f"{remote} does not exist on {self.target.alias} yet: the mirror job "
                    "creates it before copying to it"
                )
        changes = [
            Change("partitions", "increase", remote, before=str(have), after=str(want))
            for name, remote in pairs.items()
            if (have := len(target_meta.topics[remote].partitions))
            < (want := len(source_meta.topics[name].partitions))
        ]
        source_configs = _describe(self.source, list(pairs))
        target_configs = _describe(self.target, list(pairs.values()))
        for name, remote in pairs.items():
            changes += self._config_changes(remote, source_configs[name], target_configs[remote])
        return changes

    def _config_changes(
        self, remote: str, source: dict[str, ConfigEntry], target: dict[str, ConfigEntry]
    ) -> list[Change]:
        changes = []
        for name in sorted(source):
            entry = source[name]
            if (
                entry.is_read_only
                or entry.is_sensitive
                or config_source(entry) in _SKIPPED_SOURCES
                or not self.spec.replicate_config(name)
            ):
                continue
            current = target.get(name)
            # The target's entry when the topic overrides it there, else None.
            overridden = (
                current if current is not None and config_source(current) == _TOPIC else None
            )
            if config_source(entry) == _DEFAULT and not self.spec.replicate_source_default(name):
                if overridden is not None:
                    changes.append(Change("config", "delete", remote, name, overridden.value, None))
            elif overridden is None or overridden.value != entry.value:
                before = overridden.value if overridden is not None else None
                changes.append(Change("config", "set", remote, name, before, entry.value))
        return changes

    def apply(self, changes: list[Change]) -> tuple[int, list[str]]:
        """Apply ``changes`` on the target; the number applied and one line per failure."""
        applied, failures = 0, []
        grow = [
            NewPartitions(c.topic, int(c.after or 0)) for c in changes if c.kind == "partitions"
        ]
        if grow:
            futures = self.target.client.create_partitions(grow, request_timeout=ADMIN_TIMEOUT_S)
            for topic, future in futures.items():
                try:
                    future.result()
                    applied += 1
                except KafkaException as exc:
                    if exc.args[0].code() == KafkaError.INVALID_PARTITIONS:
                        applied += 1  # grown meanwhile (by the mirror job): as MM2, not an error
                    else:
                        doing = f"adding partitions to {topic}"
                        failures.append(self.failure(doing, exc, f"ALTER on topic {topic}"))
        by_topic: dict[str, list[Change]] = {}
        for change in changes:
            if change.kind == "config":
                by_topic.setdefault(change.topic, []).append(change)
        if by_topic:
            resources = [
                ConfigResource(
                    ResourceType.TOPIC,
                    topic,
                    incremental_configs=[
                        ConfigEntry(
                            c.name,
                            c.after,
                            incremental_operation=AlterConfigOpType.SET
                            if c.action == "set"
                            else AlterConfigOpType.DELETE,
                        )
                        for c in topic_changes
                    ],
                )
                for topic, topic_changes in by_topic.items()
            ]
            altered = self.target.client.incremental_alter_configs(
                resources, request_timeout=ADMIN_TIMEOUT_S
            )
            for resource, future in altered.items():
                try:
                    future.result()
                    applied += len(by_topic[resource.name])
                except KafkaException as exc:
                    doing = f"altering the configs of {resource.name}"
                    needs = f"ALTER_CONFIGS on topic {resource.name}"
                    failures.append(self.failure(doing, exc, needs))
        return applied, failures


_TOPIC = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
_DEFAULT = ConfigSource.DEFAULT_CONFIG.value


def _describe(admin: ClusterAdmin, topics: list[str]) -> dict[str, dict[str, ConfigEntry]]:
    """Each topic's configs as the cluster describes them."""
    if not topics:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
    result = {}
    futures = admin.client.describe_configs(resources, request_timeout=ADMIN_TIMEOUT_S)
    for resource, future in futures.items():
        try:
            result[resource.name] = future.result()
        except KafkaException as exc:
            raise cluster_error(
                admin,
                f"describing the configs of {resource.name}",
                exc,
                f"DESCRIBE_CONFIGS on topic {resource.name}",
            ) from None
    return result


def run_syncs(spec: MirrorSpec, dry_run: bool = False) -> tuple[list[SyncReport], list[str]]:
    """The flow's topic-config and ACL syncs, those it enables: their reports, and the keys
    (``sync.topic.configs.enabled``, ``sync.topic.acls.enabled``) of those it turns off."""
    reports, off = [], []
    for enabled, key, sync in (
        (spec.sync_configs_enabled, "sync.topic.configs.enabled", TopicSync),
        (spec.sync_acls_enabled, "sync.topic.acls.enabled", AclSync),
    ):
        if enabled:
            reports.append(sync(spec).run(dry_run=dry_run))
        else:
            off.append(key)
    return reports, off
