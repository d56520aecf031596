"""Topic-config, partition and ACL sync of a flow, by MirrorMaker 2 4.x's rules, diff first.

MirrorMaker 2 (``MirrorSourceConnector.syncTopicConfigs`` and ``computeAndCreateTopicPartitions``)
applies, every ``sync.topic.configs.interval.seconds``, to each replicated topic whose remote topic
exists on the target:

* the source topic's configs that are neither read-only, sensitive, a static broker setting, nor
  excluded by ``config.properties.exclude`` (the ``config.property.filter.class``);
* by incremental alter: a config at its default on the source is **deleted** on the target (the
  target's own default applies) unless ``use.defaults.from = source``; any other is **set** to
  the source's value;
* partition counts are raised to the source's, never lowered; topics are never deleted.

and, every ``sync.topic.acls.interval.seconds`` (``syncTopicAcls``), creates on the target the
source's LITERAL topic ACLs of replicated topics, named as their remote topics, ALLOW WRITE
dropped, ALLOW ALL turned into ALLOW READ, DENY kept; nothing is ever deleted. What a failover
needs and MirrorMaker 2 lacks, :class:`AclSync` adds: PREFIXED topic ACLs whose prefix some
replicated topic has, mapped to the remote prefix, and the consumer groups' ACLs (groups the
flow's ``groups`` filter passes: ALLOW READ and DESCRIBE, ALL turned into READ, DENY kept) so that
failed-over consumers are authorised on the target under their own group ids.

Every ACL the sync creates is recorded on the target, in the compacted topic
``mirrorflow-acls.<source>.internal``; with ``sync.topic.acls.remove.enabled = true`` (mirrorflow's
own setting, default false) an ACL it created is removed once the source no longer has the ACL
it came from. An ACL it did not create (there before, or made by someone else) is never removed.

mirrorflow computes the same result as a list of changes, compared with what the target holds
now, so a run shows what it would change before it changes anything (``dry_run``) and a second
run finds nothing to do. Settings the filter excludes (``min.insync.replicas``, the throttles,
...) are never touched on the target.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields, replace

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    ResourcePatternType,
    ResourceType,
)

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.scheduler import TaskFailed
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topic_reader import TopicReader
from mirrorflow.replication.topics import (
    ADMIN_TIMEOUT_S,
    ClusterAdmin,
    cluster_error,
    config_source,
    ensure_internal_topic,
    refusal,
    write_records,
)

log = logging.getLogger("mirrorflow.mirror")

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


@dataclass(frozen=True)
class AclChange:
    """An ACL binding the sync creates on the target."""

    resource_type: str  # TOPIC or GROUP
    pattern: str  # LITERAL or PREFIXED
    name: str
    principal: str
    host: str
    operation: str
    permission: str
    kind: str = "acl"
    action: str = "create"  # or "remove" (an ACL the sync created whose source ACL is gone)

    @classmethod
    def of(cls, binding: AclBinding, name: str, operation: AclOperation | None = None) -> AclChange:
        # AclBinding converts its arguments to enums, but annotates its attributes as the
        # arguments (enum, str or int): the ignores are for those annotations.
        return cls(
            binding.restype.name,  # type: ignore[union-attr]
            binding.resource_pattern_type.name,  # type: ignore[union-attr]
            name,
            binding.principal,
            binding.host,
            (operation or binding.operation).name,  # type: ignore[union-attr]
            binding.permission_type.name,  # type: ignore[union-attr]
        )

    def binding(self) -> AclBinding:
        return AclBinding(
            ResourceType[self.resource_type],
            self.name,
            ResourcePatternType[self.pattern],
            self.principal,
            self.host,
            AclOperation[self.operation],
            AclPermissionType[self.permission],
        )

    def describe(self) -> str:
        verb = "remove " if self.action == "remove" else ""
        return (
            f"{verb}ACL {self.permission} {self.operation} {self.principal}@{self.host} on "
            f"{self.resource_type} {self.pattern} {self.name}"
        )

    def ledger_key(self) -> bytes:
        """The binding's key in the ledger of ACLs the sync created (its action left out)."""
        binding = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_KEY}
        return json.dumps(binding, sort_keys=True).encode()

    @classmethod
    def from_ledger_key(cls, key: bytes) -> AclChange:
        return cls(**json.loads(key))

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


@dataclass
class SyncReport:
    """What one sync of a flow found and did."""

    flow: str
    dry_run: bool
    what: str = "configs"  # "configs" (and partitions) or "acls"
    changes: list[Change | AclChange] = field(default_factory=list)
    applied: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        verb = "would change" if self.dry_run else "changed"
        if not self.changes:
            head = f"{self.flow} {self.what}: in sync, nothing to change"
        elif self.dry_run:
            head = f"{self.flow} {self.what}: {verb} {len(self.changes)} (dry run: nothing applied)"
        else:
            head = f"{self.flow} {self.what}: {verb} {self.applied} of {len(self.changes)}"
        return [
            head,
            *(f"  {c.describe()}" for c in self.changes),
            *(f"  note: {n}" for n in self.notes),
            *(f"  failed: {f}" for f in self.failures),
        ]

    def as_dict(self) -> dict[str, object]:
        return {
            "flow": self.flow,
            "what": self.what,
            "dry_run": self.dry_run,
            "changes": [c.as_dict() for c in self.changes],
            "applied": self.applied,
            "failures": self.failures,
            "notes": self.notes,
        }


class _FlowSync:
    """What both syncs share: the flow's spec, its source and target admin clients, a run
    (diff, then apply unless a dry run) and the mirror job's scheduled run."""

    what = ""

    def __init__(self, spec: MirrorSpec, admins: dict[str, ClusterAdmin] | None = None) -> None:
        """The sync of the flow ``spec`` describes, with the given admin clients (by cluster
        alias) or its own."""
        admins = admins or {
            spec.source: ClusterAdmin(spec.source, spec.source_admin),
            spec.target: ClusterAdmin(spec.target, spec.target_admin),
        }
        self.spec, self.flow = spec, spec.flow
        self.source, self.target = admins[spec.source], admins[spec.target]

    def diff(self, notes: list[str] | None = None) -> list:
        """Every change the sync would make now (``notes`` gets what it leaves alone)."""
        raise NotImplementedError

    def apply(self, changes: list) -> tuple[int, list[str]]:
        """Apply ``changes`` on the target; the number applied and one line per failure."""
        raise NotImplementedError

    def failure(self, doing: str, exc: KafkaException, needs: str) -> str:
        """The line of a change the target refused or failed while ``doing`` it (``needs``: the
        ACL it takes), for :meth:`apply`'s failures."""
        return str(cluster_error(self.target, doing, exc, needs))

    def run(self, dry_run: bool = False) -> SyncReport:
        """Compute the diff, and apply it unless ``dry_run``."""
        report = SyncReport(self.flow, dry_run, self.what)
        report.changes = list(self.diff(report.notes))
        if not dry_run and report.changes:
            report.applied, report.failures = self.apply(report.changes)
        return report

    def scheduled_run(self) -> None:
        """One run of the mirror job's periodic task: each applied change logged; a refusal
        fails the run (counted, logged, retried at the next interval) and never stops the
        copying, as in MirrorMaker 2."""
        try:
            report = self.run()
        except ClusterUnreachable:
            raise
        except MirrorflowError as exc:
            raise TaskFailed(str(exc)) from None
        verb = "tried to sync (see the failure)" if report.failures else "synced"
        for change in report.changes:
            log.info("%s: %s %s", self.flow, verb, change.describe())
        if report.failures:
            more = f" (and {len(report.failures) - 1} more)" if len(report.failures) > 1 else ""
            raise TaskFailed(report.failures[0] + more)


class TopicSync(_FlowSync):
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


_ALLOW, _DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
_GROUP_OPERATIONS = (AclOperation.READ, AclOperation.DESCRIBE)
# None matches any name, principal or host (AclBindingFilter's docstring), though the filter
# inherits AclBinding's annotations (str): the ignores are for those.
_ANY_ACL = AclBindingFilter(
    ResourceType.ANY,
    None,  # type: ignore[arg-type]
    ResourcePatternType.ANY,
    None,  # type: ignore[arg-type]
    None,  # type: ignore[arg-type]
    AclOperation.ANY,
    AclPermissionType.ANY,
)


class AclSync(_FlowSync):
    """The source's topic and group ACLs, as the flow's consumers need them on the target."""

    what = "acls"

    def diff(self, notes: list[str] | None = None) -> list[AclChange]:
        """The bindings the target lacks, then (if enabled) those the sync created whose source
        ACL is gone, in a stable order."""
        notes = notes if notes is not None else []
        source = _describe_acls(self.source)
        if source is None:
            notes.append(f"{self.source.alias} has no authorizer: no ACL to sync")
            return []
        target = _describe_acls(self.target) or []
        have = {AclChange.of(b, b.name) for b in target}
        replicated = [t for t in self.source.metadata().topics if self.spec.should_replicate(t)]
        wanted = {change for b in source if (change := self._mapped(b, replicated)) is not None}
        changes = sorted(wanted - have, key=lambda c: c.describe())
        # An ACL the sync created goes only when no source ACL maps to it any more, whatever
        # the flow's filters say now (narrowing them deletes nothing).
        still = {c for b in source if (c := self._mapped(b, replicated, filters=False)) is not None}
        gone = sorted((self._ledger() & have) - still, key=lambda c: c.describe())
        if gone and self.spec.sync_acls_remove:
            changes += [replace(c, action="remove") for c in gone]
        elif gone:
            notes.append(
                f"{len(gone)} ACLs this sync created have no source ACL any more; kept "
                f"(sync.topic.acls.remove.enabled = false)"
            )
        return changes

    def _ledger(self) -> set[AclChange]:
        """The ACLs the sync created on the target (and has not removed)."""
        reader = _AclLedgerReader(self.spec)
        try:
            reader.read_to_end()
        finally:
            reader.close()
        return reader.created

    def _mapped(
        self, binding: AclBinding, replicated: list[str], filters: bool = True
    ) -> AclChange | None:
        """The target's binding for a source binding, or None; ``filters``: only for the topics
        and groups the flow replicates."""
        allow, operation = binding.permission_type == _ALLOW, binding.operation
        pattern = binding.resource_pattern_type
        if binding.restype == ResourceType.TOPIC:
            if allow and operation == AclOperation.WRITE:
                return None  # only the mirror writes remote topics
            if pattern == ResourcePatternType.LITERAL:
                if filters and not self.spec.should_replicate(binding.name):
                    return None
            elif pattern == ResourcePatternType.PREFIXED:
                if filters and not any(t.startswith(binding.name) for t in replicated):
                    return None
            else:
                return None
            read = AclOperation.READ if allow and operation == AclOperation.ALL else None
            return AclChange.of(binding, self.spec.remote_topic(binding.name), read)
        if binding.restype == ResourceType.GROUP and pattern in (
            ResourcePatternType.LITERAL,
            ResourcePatternType.PREFIXED,
        ):
            if filters and not self.spec.should_replicate_group(binding.name):
                return None
            if allow and operation == AclOperation.ALL:
                return AclChange.of(binding, binding.name, AclOperation.READ)
            if allow and operation not in _GROUP_OPERATIONS:
                return None
            return AclChange.of(binding, binding.name)
        return None

    def apply(self, changes: list[AclChange]) -> tuple[int, list[str]]:
        applied, failures = 0, []
        ledger: list[tuple[bytes, bytes | None]] = []  # (key, value) records to write
        creates = [c for c in changes if c.action == "create"]
        removes = [c for c in changes if c.action == "remove"]
        self._ensure_ledger()
        if creates:
            futures = self.target.client.create_acls(
                [c.binding() for c in creates], request_timeout=ADMIN_TIMEOUT_S
            )
            for binding, future in futures.items():
                change = AclChange.of(binding, binding.name)
                try:
                    future.result()
                    applied += 1
                    ledger.append((change.ledger_key(), b"created"))
                except KafkaException as exc:
                    doing = f"creating ACL {change.describe()}"
                    failures.append(self.failure(doing, exc, "ALTER on the cluster"))
        for change in removes:
            binding = change.binding()
            exact = AclBindingFilter(
                binding.restype,
                binding.name,
                binding.resource_pattern_type,
                binding.principal,
                binding.host,
                binding.operation,
                binding.permission_type,
            )
            try:
                self.target.client.delete_acls([exact], request_timeout=ADMIN_TIMEOUT_S)[
                    exact
                ].result()
                applied += 1
                ledger.append((replace(change, action="create").ledger_key(), None))
            except KafkaException as exc:
                doing = f"removing ACL {change.describe()}"
                failures.append(self.failure(doing, exc, "ALTER on the cluster"))
        if ledger:
            self._record(ledger)
        return applied, failures

    def _ensure_ledger(self) -> None:
        ensure_internal_topic(
            self.target,
            self.spec.acl_ledger_topic,
            self.spec.checkpoints_replication_factor,
            "checkpoints.topic.replication.factor",
        )

    def _record(self, records: list[tuple[bytes, bytes | None]]) -> None:
        """Write the ledger: the ACLs created, and tombstones for those removed."""
        topic = self.spec.acl_ledger_topic
        write_records(
            clients.producer(
                self.target.alias,
                {**self.spec.target_client, "enable.idempotence": True, "acks": "all"},
            ),
            topic,
            records,
            cluster=self.target.alias,
            principal=self.target.principal,
            what=f"recording the ACLs the sync changed in {topic}",
            hint="check the target cluster; ACLs not recorded there are never removed by the sync",
        )


_NOT_KEY = ("kind", "action")


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


class _AclLedgerReader(TopicReader):
    """The ledger of ACLs the sync created: ``created`` after :meth:`read_to_end`."""

    def __init__(self, spec: MirrorSpec) -> None:
        topic = spec.acl_ledger_topic
        super().__init__(
            spec.target_consumer,
            spec.target_admin,
            topic,
            f"mirrorflow-{topic}",
            missing_ok=True,
            cluster=spec.target,
        )
        self.created: set[AclChange] = set()

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        change = AclChange.from_ledger_key(key)
        if value is None:
            self.created.discard(change)
        else:
            self.created.add(change)


def _describe_acls(admin: ClusterAdmin) -> list[AclBinding] | None:
    """Every ACL binding of the cluster; None when it has no authorizer.

    A principal without DESCRIBE on the cluster gets no error but an empty list, so an empty
    answer is checked against the principal's authorised operations on the cluster (which the
    cluster tells only a principal with DESCRIBE on it)."""
    try:
        acls = admin.client.describe_acls(_ANY_ACL, request_timeout=ADMIN_TIMEOUT_S).result()
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.SECURITY_DISABLED:
            return None
        raise cluster_error(admin, "describing ACLs", exc, "DESCRIBE on the cluster") from None
    if not acls:
        try:
            cluster = admin.client.describe_cluster(
                include_authorized_operations=True, request_timeout=ADMIN_TIMEOUT_S
            ).result()
        except KafkaException as exc:
            raise cluster_error(admin, "describing the cluster", exc) from None
        allowed = cluster.authorized_operations or ()
        if AclOperation.DESCRIBE not in allowed:
            raise refusal(
                admin.alias,
                admin.principal,
                "describing ACLs",
                "no ACL listed, and no DESCRIBE on the cluster",
                "DESCRIBE on the cluster",
            )
    return acls
