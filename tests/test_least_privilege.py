"""Least privilege: a whole flow runs as a principal holding exactly the ACLs the table "Least
privilege" lists (docs/security.md), and a missing one fails in one line naming cluster,
principal, operation and resource.

The principal is a SCRAM user of its own (``mirror-<random>``) on both sandbox clusters, and the
flow's cluster aliases are new too (``src<random>``, ``dst<random>``), so its internal topics are
its own and created by the job with these ACLs, and no other test sees any of it.
"""

from __future__ import annotations

import secrets
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from mirrorflow.cli import main
from mirrorflow.devtools.sandbox import Cluster
from mirrorflow.mm2.formats import Checkpoint, Heartbeat
from mirrorflow.paths import write_private
from mirrorflow.runtime import launch
from tests.mirror_harness import (
    ROOT,
    mirror_command,
    offset_syncs,
    produce,
    progress,
    read_topic,
    run_mirror_once,
    start_mirror,
    stop_job,
    topic_names,
    wait_for,
    watermarks,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.BROKER
TXN = ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
Op = AclOperation


@dataclass(frozen=True)
class Grant:
    """One row of the "Least privilege" table (docs/security.md): ALLOW ``operations`` on a
    resource of the source or target."""

    feature: str
    side: str  # "source" or "target"
    resource: ResourceType
    name: str
    pattern: ResourcePatternType
    operations: tuple[AclOperation, ...]


def least_privilege(source: str, target: str, topics: str, groups: str) -> list[Grant]:
    """The "Least privilege" table (docs/security.md) for a flow ``source->target`` of the
    topics whose names start with ``topics`` and the groups whose names start with ``groups``."""
    remote = f"{source}.{topics}"
    return [
        Grant("copy", "source", TOPIC, topics, PREFIXED, (Op.READ, Op.DESCRIBE_CONFIGS)),
        Grant(
            "copy",
            "target",
            TOPIC,
            remote,
            PREFIXED,
            (Op.CREATE, Op.WRITE, Op.ALTER, Op.DESCRIBE_CONFIGS),
        ),
        Grant(
            "copy",
            "target",
            TOPIC,
            f"mm2-offsets.{source}.internal",
            LITERAL,
            (Op.CREATE, Op.READ, Op.WRITE),
        ),
        Grant(
            "copy",
            "target",
            TOPIC,
            f"mirrorflow-offset-map.{source}.internal",
            LITERAL,
            (Op.CREATE, Op.READ, Op.WRITE),
        ),
        Grant(
            "copy",
            "target",
            TOPIC,
            "mirrorflow-leases.internal",
            LITERAL,
            (Op.CREATE, Op.READ, Op.WRITE),
        ),
        Grant("copy", "target", TXN, f"mirrorflow-lease.{source}->{target}", LITERAL, (Op.WRITE,)),
        Grant(
            "offset syncs",
            "source",
            TOPIC,
            f"mm2-offset-syncs.{target}.internal",
            LITERAL,
            (Op.CREATE, Op.WRITE),
        ),
        Grant("heartbeats", "target", TOPIC, "heartbeats", LITERAL, (Op.CREATE, Op.WRITE)),
        Grant("config sync", "target", TOPIC, remote, PREFIXED, (Op.ALTER_CONFIGS,)),
        Grant("ACL sync", "source", CLUSTER, "kafka-cluster", LITERAL, (Op.DESCRIBE,)),
        Grant("ACL sync", "target", CLUSTER, "kafka-cluster", LITERAL, (Op.DESCRIBE, Op.ALTER)),
        Grant(
            "ACL sync",
            "target",
            TOPIC,
            f"mirrorflow-acls.{source}.internal",
            LITERAL,
            (Op.CREATE, Op.READ, Op.WRITE),
        ),
        Grant("checkpoints", "source", GROUP, groups, PREFIXED, (Op.DESCRIBE,)),
        Grant(
            "checkpoints",
            "source",
            TOPIC,
            f"mirrorflow-offset-map.{target}.internal",
            LITERAL,
            (Op.READ,),
        ),
        Grant(
            "checkpoints",
            "target",
            TOPIC,
            f"{source}.checkpoints.internal",
            LITERAL,
            (Op.CREATE, Op.READ, Op.WRITE),
        ),
        Grant("group offset sync", "target", GROUP, groups, PREFIXED, (Op.READ,)),
        Grant("group offset sync", "target", TOPIC, remote, PREFIXED, (Op.READ,)),
    ]


def exactly_once_grant(source: str, target: str) -> Grant:
    """What an exactly-once flow adds: its transactional ids."""
    return Grant(
        "exactly-once", "target", TXN, f"mirrorflow-{source}->{target}-", PREFIXED, (Op.WRITE,)
    )


def binding(user: str, resource: ResourceType, name: str, pattern, operation) -> AclBinding:
    return AclBinding(
        resource, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW
    )


def grant(cluster: Cluster, user: str, resource, name: str, pattern, *operations) -> None:
    admin = AdminClient(cluster.client_config())
    bindings = [binding(user, resource, name, pattern, op) for op in operations]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


def revoke(cluster: Cluster, user: str, resource, name: str, pattern, operation) -> None:
    admin = AdminClient(cluster.client_config())
    exact = AclBindingFilter(
        resource, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW
    )
    for future in admin.delete_acls([exact]).values():
        assert future.result(timeout=30), f"no ACL {operation.name} on {name} to revoke"


def acls_of(cluster: Cluster, principal: str | None = None) -> list[AclBinding]:
    everything = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        principal,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    admin = AdminClient(cluster.client_config())  # kept: its futures die with it
    return admin.describe_acls(everything).result(timeout=30)


def scram_user(clusters: list[Cluster], user: str) -> str:
    """A SCRAM-SHA-512 user on each cluster (no ACLs yet); returns its password."""
    password = secrets.token_urlsafe(18)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    for cluster in clusters:
        admin = AdminClient(cluster.client_config())
        upsert = UserScramCredentialUpsertion(user, info, password.encode())
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
    return password


def user_config(cluster: Cluster, user: str, password: str) -> dict[str, str]:
    return {
        "bootstrap.servers": cluster.bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
    }


def flow_file(
    path: Path, aliases: dict[str, Cluster], user: str, password: str, lines: list[str]
) -> Path:
    """A flow file whose every client logs in as ``user`` (SCRAM) to the clusters ``aliases``
    name."""
    login = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )
    text = [f"clusters = {', '.join(aliases)}"]
    for alias, cluster in aliases.items():
        text += [
            f"{alias}.bootstrap.servers = {cluster.bootstrap_servers}",
            f"{alias}.security.protocol = SASL_PLAINTEXT",
            f"{alias}.sasl.mechanism = SCRAM-SHA-512",
            f"{alias}.sasl.jaas.config = {login}",
        ]
    text += [
        "replication.factor = 1",
        "heartbeats.topic.replication.factor = 1",
        "offset.storage.replication.factor = 1",
        "offset.storage.partitions = 5",
        "checkpoints.topic.replication.factor = 1",
        "offset-syncs.topic.replication.factor = 1",
        *lines,
    ]
    return write_private(path, "\n".join(text) + "\n")


def set_configs(cluster: Cluster, topic: str, configs: dict[str, str]) -> None:
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()
        ],
    )
    admin = AdminClient(cluster.client_config())
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def overrides(cluster: Cluster, topic: str) -> dict[str, str]:
    admin = AdminClient(cluster.client_config())
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return {k: e.value for k, e in future.result(timeout=30).items() if not e.is_default}


def commit(cluster: Cluster, group: str, offsets: dict[tuple[str, int], int]) -> None:
    consumer = Consumer({**cluster.client_config(), "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()


def committed(cluster: Cluster, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({**cluster.client_config(), "group.id": group})
    try:
        listed = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in listed if tp.offset >= 0}


def checkpoints(cluster: Cluster, topic: str, group: str) -> dict[tuple[str, int], int]:
    """The latest checkpoint of ``group`` per target partition in ``topic``."""
    if topic not in topic_names(cluster):
        return {}
    latest = {}
    for _o, key, value, _h, _t in read_topic(cluster, topic).get(0, []):
        c = Checkpoint.from_record(key, value)
        if c.group == group:
            latest[(c.topic, c.partition)] = c.downstream_offset
    return latest


def heartbeats_from(cluster: Cluster, source: str, target: str, tail: int = 500) -> int:
    """How many of the last ``tail`` records of ``heartbeats`` are ``Heartbeat(source, target)``
    (the topic is shared with every other flow into the cluster)."""
    if "heartbeats" not in topic_names(cluster):
        return 0
    low, high = watermarks(cluster, "heartbeats", [0])[0]
    consumer = Consumer(
        {**cluster.client_config(), "group.id": "lp-heartbeats", "enable.partition.eof": True}
    )
    found = 0
    try:
        consumer.assign([TopicPartition("heartbeats", 0, max(low, high - tail))])
        while (msg := consumer.poll(10)) is not None and not msg.error():
            beat = Heartbeat.from_record(msg.key(), msg.value())
            found += (beat.source_cluster_alias, beat.target_cluster_alias) == (source, target)
    finally:
        consumer.close()
    return found


def tasks(state: Path, flow_dir: str) -> dict[str, dict]:
    return progress(state, flow_dir).get("tasks", {})


def assert_one_line_naming(error: str | None, *parts: str) -> None:
    assert error and "\n" not in error, error
    missing = [p for p in parts if p not in error]
    assert not missing, f"{missing} not in: {error}"


def test_a_whole_flow_runs_with_exactly_the_acls_readme_lists_and_a_missing_one_is_named(
    sandbox, tmp_path, capsys
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    sfx = uuid.uuid4().hex[:6]
    source, target, user = f"src{sfx}", f"dst{sfx}", f"mirror-{sfx}"
    flow, flow_dir = f"{source}->{target}", f"{source}-{target}"
    topics, groups = f"lp-{sfx}-", f"lpg-{sfx}-"
    orders, group = f"{topics}orders", f"{groups}billing"
    remote, checkpoints_topic = f"{source}.{orders}", f"{source}.checkpoints.internal"
    sides = {"source": primary, "target": secondary}

    password = scram_user([primary, secondary], user)
    for g in least_privilege(source, target, topics, groups):
        grant(sides[g.side], user, g.resource, g.name, g.pattern, *g.operations)
    admin = AdminClient(primary.client_config())
    # (retention well above the hour old the records are stamped: they stay on the source)
    new = NewTopic(orders, 2, 1, config={"retention.ms": "86400000"})
    admin.create_topics([new])[orders].result(30)
    produce(primary, orders, 2, 40)
    commit(primary, group, {(orders, 0): 15, (orders, 1): 12})  # a group, idle, to checkpoint
    # What the ACL sync copies: a consumer's ACLs on the topic and on its group.
    grant(primary, "alice", TOPIC, orders, LITERAL, Op.READ)
    grant(primary, "alice", GROUP, group, LITERAL, Op.READ)
    config = flow_file(
        tmp_path / "mm2.properties",
        {source: primary, target: secondary},
        user,
        password,
        [
            f"{flow}.enabled = true",
            f"{flow}.topics = {topics}.*",
            f"{flow}.groups = {groups}.*",
            "emit.heartbeats.interval.seconds = 1",
            "refresh.topics.interval.seconds = 2",
            "sync.topic.configs.interval.seconds = 2",
            "sync.topic.acls.interval.seconds = 2",
            "emit.checkpoints.interval.seconds = 1",
            "sync.group.offsets.enabled = true",
            "sync.group.offsets.interval.seconds = 1",
        ],
    )
    for cluster in (primary, secondary):  # the new user's credentials have reached the broker
        wait_for(
            lambda c=cluster: _can_connect(user_config(c, user, password)), 30, f"{user} login"
        )
    state, log = tmp_path / "state", tmp_path / "mirror.log"
    job = start_mirror(config, flow, state, log)
    try:
        # 1. Everything works with exactly these ACLs.
        wait_for(
            lambda: (
                remote in topic_names(secondary)
                and sum(hi for _lo, hi in watermarks(secondary, remote, [0, 1]).values()) == 40
            ),
            150,
            "the 40 records copied",
        )
        set_configs(primary, orders, {"max.message.bytes": "2000000"})
        admin.create_partitions([NewPartitions(orders, 3)])[orders].result(30)
        wait_for(
            lambda: overrides(secondary, remote).get("max.message.bytes") == "2000000",
            60,
            "the changed config synced",
        )
        wait_for(lambda: len(watermarks(secondary, remote, [0, 1, 2])) == 3, 60, "3 partitions")
        assert overrides(secondary, remote)["retention.ms"] == "86400000"

        def synced_acls() -> set:
            return {
                (b.restype, b.name, b.operation)
                for b in acls_of(secondary, "User:alice")
                if b.name in (remote, group)
            }

        wait_for(
            lambda: synced_acls() == {(TOPIC, remote, Op.READ), (GROUP, group, Op.READ)},
            60,
            "alice's ACLs synced",
        )
        expected = {(remote, 0): 15, (remote, 1): 12}
        wait_for(
            lambda: checkpoints(secondary, checkpoints_topic, group) == expected,
            60,
            "the group's checkpoints",
        )
        wait_for(
            lambda: committed(secondary, group, remote, 3) == {0: 15, 1: 12},
            60,
            "the group's offsets synced on the target",
        )
        assert heartbeats_from(secondary, source, target) > 0
        syncs_topic = f"mm2-offset-syncs.{target}.internal"
        wait_for(
            lambda: {s.topic for s in offset_syncs(primary, syncs_topic)} == {orders},
            60,
            "offset syncs on the source",
        )
        every = {
            "renew-lease",
            "heartbeats",
            "report-progress",
            "measure-lag",
            "refresh-topics",
            "expire-offset-map",
            "sync-topic-configs",
            "sync-topic-acls",
            "emit-checkpoints",
            "refresh-groups",
            "sync-group-offsets",
        }
        wait_for(
            lambda: (
                set(tasks(state, flow_dir)) == every
                and tasks(state, flow_dir)["sync-group-offsets"]["runs"] >= 3
            ),
            60,
            "the tasks' runs in progress.json",
        )
        assert {n: t["failures"] for n, t in tasks(state, flow_dir).items()} == dict.fromkeys(
            every, 0
        )
        assert progress(state, flow_dir)["state"] in ("RUNNING", "IDLE")

        # 2. A missing ACL fails its task in one line naming cluster, principal, operation and
        # resource, and the copying goes on; granted again, the task recovers.
        revoked = [
            ("source", CLUSTER, "kafka-cluster", LITERAL, Op.DESCRIBE),
            ("target", TOPIC, f"{source}.{topics}", PREFIXED, Op.ALTER_CONFIGS),
            ("source", GROUP, groups, PREFIXED, Op.DESCRIBE),
            ("target", TOPIC, "heartbeats", LITERAL, Op.WRITE),
        ]
        for side, *acl in revoked:
            revoke(sides[side], user, *acl)
        set_configs(primary, orders, {"retention.ms": "43200000"})  # a config to sync
        failing = {"sync-topic-acls", "sync-topic-configs", "emit-checkpoints", "heartbeats"}
        wait_for(
            lambda: all(tasks(state, flow_dir)[n]["last_error"] for n in failing),
            60,
            "the tasks' errors in progress.json",
        )
        errors = {n: tasks(state, flow_dir)[n]["last_error"] for n in failing}
        assert_one_line_naming(
            errors["sync-topic-acls"],
            f"cluster {source} refused principal {user} while describing ACLs",
            "DESCRIBE on the cluster",
        )
        assert_one_line_naming(
            errors["sync-topic-configs"],
            f"cluster {target} refused principal {user} while altering the configs of {remote}",
            f"ALTER_CONFIGS on topic {remote}",
        )
        assert_one_line_naming(
            errors["emit-checkpoints"],
            f"cluster {source} refused principal {user} while reading the offsets of group {group}",
            f"DESCRIBE on group {group}",
        )
        assert_one_line_naming(
            errors["heartbeats"],
            f"cluster {target} refused principal {user} while writing heartbeats to heartbeats",
            "WRITE on topic heartbeats",
        )
        for side, *acl in revoked:
            grant(sides[side], user, *acl)
        wait_for(
            lambda: overrides(secondary, remote).get("retention.ms") == "43200000",
            60,
            "the config synced once ALTER_CONFIGS is granted again",
        )
        wait_for(
            lambda: not any(tasks(state, flow_dir)[n]["last_error"] for n in failing),
            60,
            "the tasks recovered",
        )

        revoke(secondary, user, TOPIC, checkpoints_topic, LITERAL, Op.WRITE)
        commit(primary, group, {(orders, 0): 20})  # a checkpoint to write
        wait_for(
            lambda: tasks(state, flow_dir)["emit-checkpoints"]["last_error"],
            60,
            "the checkpoint task's error",
        )
        assert_one_line_naming(
            tasks(state, flow_dir)["emit-checkpoints"]["last_error"],
            f"cluster {target} refused principal {user} while writing checkpoints to "
            f"{checkpoints_topic}",
            f"WRITE on topic {checkpoints_topic}",
        )
        grant(secondary, user, TOPIC, checkpoints_topic, LITERAL, Op.WRITE)
        # The failover tools read the checkpoints: without READ, the same kind of line.
        revoke(secondary, user, TOPIC, checkpoints_topic, LITERAL, Op.READ)
        capsys.readouterr()
        assert main(["checkpoints", str(config), "--flow", flow]) == 2
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("mirrorflow: error:")]
        assert len(lines) == 1, err
        assert_one_line_naming(
            lines[0],
            f"mirrorflow: error: cluster {target} refused principal {user} while reading "
            f"{checkpoints_topic}",
            f"READ on topic {checkpoints_topic}",
        )
        grant(secondary, user, TOPIC, checkpoints_topic, LITERAL, Op.READ)
        wait_for(
            lambda: committed(secondary, group, remote, 3).get(0) == 20,
            60,
            "the group's new offset synced once WRITE is granted again",
        )

        # 3. A missing ACL the copying needs ends the flow, in one line.
        revoke(secondary, user, TOPIC, f"{source}.{topics}", PREFIXED, Op.CREATE)
        late = f"{topics}late"
        admin.create_topics([NewTopic(late, 1, 1)])[late].result(30)
        assert job.wait(90) == 2
    finally:
        stop_job(job)
        for cluster in (primary, secondary):
            _drop_acls(cluster, user, topics, groups)
    output = log.read_text(errors="replace")
    assert password not in output
    (error,) = [ln for ln in output.splitlines() if ln.startswith("mirrorflow: error:")]
    needs = f"CREATE on topic {source}.{late}"
    assert_one_line_naming(
        error, f"cluster {target} refused principal {user} while creating topic", needs
    )
    assert progress(state, flow_dir)["state"] == "FAILED"
    assert needs in progress(state, flow_dir)["error"]


def _can_connect(config: dict[str, str]) -> bool:
    try:
        AdminClient(config).list_topics(timeout=5)
        return True
    except Exception:  # not yet: the credentials are propagating
        return False


def _drop_acls(cluster: Cluster, user: str, topics: str, groups: str) -> None:
    """The test's ACLs: the principal's and those on its topics and groups (alice's, synced)."""
    mine = [
        b
        for b in acls_of(cluster)
        if b.principal == f"User:{user}" or topics in b.name or groups in b.name
    ]
    filters = [
        AclBindingFilter(
            b.restype,
            b.name,
            b.resource_pattern_type,
            b.principal,
            b.host,
            b.operation,
            b.permission_type,
        )
        for b in mine
    ]
    if filters:
        admin = AdminClient(cluster.client_config())
        for future in admin.delete_acls(filters).values():
            future.result(timeout=30)


def test_an_exactly_once_flow_needs_write_on_its_transactional_ids_too(sandbox, tmp_path):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    sfx = uuid.uuid4().hex[:6]
    source, target, user = f"xs{sfx}", f"xd{sfx}", f"mirror-{sfx}"
    flow, topics = f"{source}->{target}", f"lpx-{sfx}-"
    topic = f"{topics}payments"
    sides = {"source": primary, "target": secondary}
    password = scram_user([primary, secondary], user)
    copying = ("copy", "offset syncs")
    for g in least_privilege(source, target, topics, "-"):
        if g.feature in copying:
            grant(sides[g.side], user, g.resource, g.name, g.pattern, *g.operations)
    admin = AdminClient(primary.client_config())
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    produce(primary, topic, 2, 30)
    config = flow_file(
        tmp_path / "mm2.properties",
        {source: primary, target: secondary},
        user,
        password,
        [
            f"{flow}.enabled = true",
            f"{flow}.topics = {topics}.*",
            f"{target}.exactly.once.source.support = enabled",
            f"{source}.consumer.isolation.level = read_committed",
            "emit.heartbeats.enabled = false",
            "emit.checkpoints.enabled = false",
        ],
    )
    for cluster in (primary, secondary):
        wait_for(
            lambda c=cluster: _can_connect(user_config(c, user, password)), 30, f"{user} login"
        )
    try:
        # Without its transactional ids, the flow stops at its first transaction, in one line.
        result = subprocess.run(
            [*mirror_command(config, flow, tmp_path / "state", "--once")],
            capture_output=True,
            text=True,
            timeout=240,
            env=launch.job_environment(),
            cwd=ROOT,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 2, output[-3000:]
        (error,) = [ln for ln in output.splitlines() if ln.startswith("mirrorflow: error:")]
        assert_one_line_naming(
            error,
            f"cluster {target} refused principal {user} while starting a transaction",
            f"WRITE on transactional ids prefixed mirrorflow-{flow}-",
        )
        eos = exactly_once_grant(source, target)
        grant(secondary, user, eos.resource, eos.name, eos.pattern, *eos.operations)
        run_mirror_once(config, flow, tmp_path / "state")
    finally:
        for cluster in (primary, secondary):
            _drop_acls(cluster, user, topics, topics)
    remote = f"{source}.{topic}"
    assert {p: len(rs) for p, rs in read_topic(secondary, remote).items()} == {0: 15, 1: 15}
