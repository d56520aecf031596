"""MirrorMaker 2 4.3.1 and ``mirrorflow sync`` beside each other: one source, one flow file, two
targets, the same remote topics.

MirrorMaker 2 (dedicated mode, from Maven Central) runs ``primary->secondary``; mirrorflow syncs
``primary->tertiary`` of the same file. Both create their remote topic from the same initial
source by their own means (MirrorMaker 2 at its start, mirrorflow by the mirror job's
:class:`~mirrorflow.replication.topics.RemoteTopics`); then the source changes (configs,
partitions) and each syncs. Compared per remote topic: the topic's own configs
(DYNAMIC_TOPIC_CONFIG), the partition count and the LITERAL topic ACLs (principal, host,
operation, permission); what mirrorflow adds beyond MirrorMaker 2 (PREFIXED topic ACLs for the
remote prefix, the flow's groups' ACLs) must be exactly the documented extras.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
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
    ResourcePatternType,
    ResourceType,
)

from mirrorflow.cli import main
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.replication.topics import ClusterAdmin, RemoteTopics
from mirrorflow.runtime import jvm
from tests.mirror_harness import topic_names, wait_for, write_flow_file
from tests.test_sync import create, overrides, partitions

pytestmark = pytest.mark.kafka

TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
OP = AclOperation
HOST = "192.0.2.7"  # a host other than "*": MirrorMaker 2 keeps it


def change_configs(cluster, topic: str, set_: dict[str, str], delete: tuple[str, ...] = ()) -> None:
    """Set and delete (back to the default) topic configs by incremental alter."""
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in set_.items()
    ] + [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    admin = AdminClient(cluster.client_config())
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def create_acls(cluster, bindings: list[tuple]) -> None:
    """Create ACLs given as (resource type, name, pattern, principal, host, operation,
    permission)."""
    admin = AdminClient(cluster.client_config())
    for future in admin.create_acls([AclBinding(*b) for b in bindings]).values():
        future.result(timeout=30)


def acls_of(cluster, principals: set[str]) -> set[tuple]:
    """The cluster's ACLs of ``principals``: (resource type, pattern type, name, principal,
    host, operation, permission), as names."""
    any_acl = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, OP.ANY, AclPermissionType.ANY
    )
    admin = AdminClient(cluster.client_config())  # kept until the answer is in
    found = admin.describe_acls(any_acl).result(timeout=30)
    return {
        (
            b.restype.name,
            b.resource_pattern_type.name,
            b.name,
            b.principal,
            b.host,
            b.operation.name,
            b.permission_type.name,
        )
        for b in found
        if b.principal in principals
    }


def delete_acls(clusters, principals: set[str]) -> None:
    """Remove every ACL of ``principals`` (so none outlives the test)."""
    filters = [
        AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, p, None, OP.ANY, AclPermissionType.ANY
        )
        for p in sorted(principals)
    ]
    for cluster in clusters:
        admin = AdminClient(cluster.client_config())
        for future in admin.delete_acls(filters).values():
            future.result(timeout=30)


def remote_state(cluster, remote: str, principals: set[str]) -> dict:
    """What both sync on a remote topic: its own configs, its partition count, its LITERAL
    topic ACLs (principal, host, operation, permission)."""
    return {
        "configs": overrides(cluster, remote),
        "partitions": partitions(cluster, remote),
        "acls": {
            acl[3:]
            for acl in acls_of(cluster, principals)
            if acl[:3] == ("TOPIC", "LITERAL", remote)
        },
    }


def start_mirrormaker2(config: Path, workdir: Path) -> subprocess.Popen:
    """MirrorMaker 2 in dedicated mode for the target ``secondary`` (output to mm2.log)."""
    command = jvm.mirrormaker_command(config, "secondary", workdir)
    with open(workdir / "mm2.log", "ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop_mirrormaker2(mm2: subprocess.Popen) -> None:
    os.killpg(mm2.pid, signal.SIGTERM)
    try:
        mm2.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(mm2.pid, signal.SIGKILL)
        mm2.wait(30)


def test_mirrorflow_syncs_configs_partitions_and_topic_acls_as_mirrormaker2_does(
    sandbox, topic_name, tmp_path, capsys, request
):
    primary, secondary, tertiary = sandbox["primary"], sandbox["secondary"], sandbox["tertiary"]
    topic = topic_name("cmp")
    remote = f"primary.{topic}"  # on both targets: the same replication policy
    suffix = uuid.uuid4().hex[:6]
    a, b, c = (f"User:cmp-{suffix}-{n}" for n in "abc")
    principals = {a, b, c}
    group = f"cmp-{suffix}-group"
    request.addfinalizer(lambda: delete_acls((primary, secondary, tertiary), principals))

    # The source's initial state, from which both create their remote topic: 2 partitions, a
    # retention, a segment size the source resets to its default later, and two settings
    # MirrorMaker 2 never syncs (config.properties.exclude).
    create(
        primary,
        topic,
        2,
        {
            "retention.ms": "7200000",
            "segment.bytes": "10485760",
            "min.insync.replicas": "1",
            "message.timestamp.type": "LogAppendTime",
        },
    )
    create_acls(
        primary,
        [
            (TOPIC, topic, LITERAL, a, "*", OP.READ, ALLOW),
            (TOPIC, topic, LITERAL, a, "*", OP.WRITE, ALLOW),  # dropped: only the mirror writes
            (TOPIC, topic, LITERAL, b, "*", OP.ALL, ALLOW),  # becomes READ
            (TOPIC, topic, LITERAL, b, "*", OP.WRITE, DENY),  # DENY kept
            (TOPIC, topic, LITERAL, c, HOST, OP.READ, DENY),
            (TOPIC, topic, LITERAL, c, HOST, OP.DESCRIBE, ALLOW),
            (TOPIC, topic + "-other", LITERAL, a, "*", OP.READ, ALLOW),  # not replicated
            # mirrorflow's extras: the remote prefix, the flow's groups.
            (TOPIC, topic[:-3], PREFIXED, a, "*", OP.READ, ALLOW),
            (GROUP, group, LITERAL, a, "*", OP.ALL, ALLOW),  # becomes READ
            (GROUP, group, LITERAL, a, "*", OP.DELETE, ALLOW),  # not what a consumer needs
            (GROUP, group, LITERAL, b, "*", OP.READ, DENY),
        ],
    )
    # One flow file, both flows: MirrorMaker 2 runs the one into secondary, mirrorflow the one
    # into tertiary.
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "secondary", "tertiary"],
        [
            "primary->secondary.enabled = true",
            "primary->tertiary.enabled = true",
            "tertiary->secondary.emit.heartbeats.enabled = false",  # no other herder for MM2
            f"topics = {topic}",
            f"groups = cmp-{suffix}-.*",
            "sync.topic.configs.interval.seconds = 5",
            "sync.topic.acls.interval.seconds = 5",
            "refresh.topics.interval.seconds = 5",
            "status.storage.replication.factor = 1",
            "config.storage.replication.factor = 1",
            "plugin.discovery = service_load",
            "tasks.max = 1",
        ],
    )

    expected_configs = {
        "retention.ms": "3600000",
        "cleanup.policy": "compact,delete",
        "max.message.bytes": "2000000",
        # Not excluded: the default list names the broker setting log.message.timestamp.*.
        "message.timestamp.before.max.ms": "86400000",
        "unclean.leader.election.enable": "true",  # excluded: the target's own stays
    }
    expected_acls = {
        (a, "*", "READ", "ALLOW"),
        (b, "*", "READ", "ALLOW"),
        (b, "*", "WRITE", "DENY"),
        (c, HOST, "READ", "DENY"),
        (c, HOST, "DESCRIBE", "ALLOW"),
    }
    expected = {"configs": expected_configs, "partitions": 4, "acls": expected_acls}

    started = time.monotonic()
    mm2 = start_mirrormaker2(config, tmp_path)
    try:
        # mirrorflow creates its remote topic as the mirror job does, from the same state.
        spec = spec_for_flow([config], "primary->tertiary")
        RemoteTopics(
            ClusterAdmin("primary", spec.source_admin),
            ClusterAdmin("tertiary", spec.target_admin),
            spec.should_replicate,
            spec.remote_topic,
            spec.replication_factor,
            spec.replicate_config,
            spec.flow,
        ).prepare()
        wait_for(lambda: remote in topic_names(secondary), 90, "MirrorMaker 2's remote topic")
        created = {
            "MirrorMaker 2": overrides(secondary, remote),
            "mirrorflow": overrides(tertiary, remote),
        }
        initial = {"retention.ms": "7200000", "segment.bytes": "10485760"}
        assert created["MirrorMaker 2"] == created["mirrorflow"] == initial, created

        # The targets' own settings: one the source leaves at its default (deleted by the
        # sync), one the sync never touches.
        for target in (secondary, tertiary):
            change_configs(
                target, remote, {"segment.ms": "3600000", "unclean.leader.election.enable": "true"}
            )
        # The source changes: wider, a changed, two new and a reset setting.
        admin = AdminClient(primary.client_config())
        for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
            future.result(timeout=30)
        change_configs(
            primary,
            topic,
            {
                "retention.ms": "3600000",
                "cleanup.policy": "compact,delete",
                "max.message.bytes": "2000000",
                "message.timestamp.before.max.ms": "86400000",
            },
            delete=("segment.bytes",),
        )

        # MirrorMaker 2 syncs within its intervals (5 s); wait until its remote topic has it all.
        deadline, mm2_state = time.monotonic() + 90, {}
        while time.monotonic() < deadline:
            mm2_state = remote_state(secondary, remote, principals)
            if mm2_state == expected:
                break
            time.sleep(1)
    finally:
        stop_mirrormaker2(mm2)
    mm2_seconds = time.monotonic() - started

    # mirrorflow: `mirrorflow sync` of the same file, then a second run finds nothing.
    def sync(*args: str) -> list[dict]:
        code = main(["sync", str(config), "--flow", "primary->tertiary", "--json", *args])
        reports = json.loads(capsys.readouterr().out)
        assert code == 0 and all(r["failures"] == [] for r in reports), reports
        return reports

    sync()
    assert [r["changes"] for r in sync("--dry-run")] == [[], []]  # in sync
    mirrorflow_state = remote_state(tertiary, remote, principals)

    assert mirrorflow_state == mm2_state, (
        f"mirrorflow and MirrorMaker 2 disagree on {remote}: mirrorflow {mirrorflow_state}, "
        f"MirrorMaker 2 {mm2_state}"
    )
    log_tail = (tmp_path / "mm2.log").read_text(errors="replace")[-3000:]
    assert mm2_state == expected, (
        f"MirrorMaker 2 after {mm2_seconds:.0f}s: {mm2_state}; log:\n{log_tail}"
    )
    # Beyond MirrorMaker 2, exactly the documented extras, and only on mirrorflow's target.
    topic_acls = {("TOPIC", "LITERAL", remote)}
    extras = {acl for acl in acls_of(tertiary, principals) if acl[:3] not in topic_acls}
    assert extras == {
        ("TOPIC", "PREFIXED", f"primary.{topic[:-3]}", a, "*", "READ", "ALLOW"),
        ("GROUP", "LITERAL", group, a, "*", "READ", "ALLOW"),
        ("GROUP", "LITERAL", group, b, "*", "READ", "DENY"),
    }
    assert {acl for acl in acls_of(secondary, principals) if acl[:3] not in topic_acls} == set()
