"""ACL sync of a flow: MirrorMaker 2 4.x's rules, and what a failover needs beyond them.

MirrorMaker 2, every ``sync.topic.acls.interval.seconds`` (``syncTopicAcls``), creates on the target
the source's LITERAL topic ACLs of replicated topics, named as their remote topics, ALLOW WRITE
dropped, ALLOW ALL turned into ALLOW READ, DENY kept; nothing is ever deleted. What a failover needs
and MirrorMaker 2 lacks, :class:`AclSync` adds: PREFIXED topic ACLs whose prefix some replicated
topic has, mapped to the remote prefix, and the consumer groups' ACLs (groups the flow's ``groups``
filter passes: ALLOW READ and DESCRIBE, ALL turned into READ, DENY kept) so that failed-over
consumers are authorised on the target under their own group ids.

Every ACL the sync creates is recorded on the target, in the compacted topic
``mirrorflow-acls.<source>.internal``; with ``sync.topic.acls.remove.enabled = true`` (mirrorflow's
own setting, default false) an ACL it created is removed once the source no longer has the ACL
it came from. An ACL it did not create (there before, or made by someone else) is never removed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from mirrorflow.replication import clients
from mirrorflow.replication.flow_sync import FlowSync
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topic_reader import TopicReader
from mirrorflow.replication.topics import (
    ADMIN_TIMEOUT_S,
    ClusterAdmin,
    cluster_error,
    ensure_internal_topic,
    refusal,
    write_records,
)


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


_ALLOW, _DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
_GROUP_OPERATIONS = (AclOperation.READ, AclOperation.DESCRIBE)
# None matches any name, principal or host (AclBindingFilter's docstring), though the filter
# inherits AclBinding's annotations (str): the ignores are for those.
EVERY_ACL = AclBindingFilter(
    ResourceType.ANY,
    None,  # type: ignore[arg-type]
    ResourcePatternType.ANY,
    None,  # type: ignore[arg-type]
    None,  # type: ignore[arg-type]
    AclOperation.ANY,
    AclPermissionType.ANY,
)


class AclSync(FlowSync):
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
            futures = self.target.create_acls(
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
                self.target.delete_acls([exact], request_timeout=ADMIN_TIMEOUT_S)[exact].result()
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
        acls = admin.describe_acls(EVERY_ACL, request_timeout=ADMIN_TIMEOUT_S).result()
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
