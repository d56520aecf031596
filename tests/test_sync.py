"""`mirrorflow sync`: remote topics' configs and partitions follow their sources by MirrorMaker 2
4.x's rules, shown as a diff first, on the sandbox's authorizer-enabled clusters."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from mirrorflow.cli import main
from tests.conftest import allow
from tests.dag_harness import finish, render_into_dags_folder, start_dag_test
from tests.mirror_harness import (
    alter_topic,
    flow_file,
    progress,
    start_mirror,
    stop_job,
    topic_names,
    wait_for,
)

pytestmark = pytest.mark.kafka


def create(cluster, topic: str, partitions: int, config: dict[str, str]) -> None:
    admin = AdminClient(cluster.client_config())
    for future in admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values():
        future.result(timeout=30)


def overrides(cluster, topic: str) -> dict[str, str]:
    """The topic's own settings (DYNAMIC_TOPIC_CONFIG) on a cluster."""
    admin = AdminClient(cluster.client_config())
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return {n: e.value for n, e in future.result(timeout=30).items() if e.source == 1}


def partitions(cluster, topic: str) -> int:
    admin = AdminClient(cluster.client_config())
    return len(admin.list_topics(topic, timeout=30).topics[topic].partitions)


NO_ACLS = "primary->secondary.sync.topic.acls.enabled = false"  # configs only


def sync(capsys, config, *args: str) -> tuple[int, list[dict]]:
    code = main(["sync", str(config), "--flow", "primary->secondary", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_sync_shows_the_diff_then_applies_mirrormaker2s_config_and_partition_rules(
    sandbox, topic_name, tmp_path, capsys
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("configs")
    remote = f"primary.{topic}"
    # The source: two settings of its own, 4 partitions. The remote topic as an older copy left
    # it: 2 partitions, an old retention, a segment size the source leaves at its default, and
    # min.insync.replicas, which MirrorMaker 2 never syncs (config.properties.exclude).
    create(primary, topic, 4, {"retention.ms": "3600000", "cleanup.policy": "compact,delete"})
    create(
        secondary,
        remote,
        2,
        {"retention.ms": "7200000", "segment.bytes": "10485760", "min.insync.replicas": "1"},
    )
    config = flow_file(tmp_path, sandbox, topic, NO_ACLS)

    code, (report,) = sync(capsys, config, "--dry-run")
    assert code == 0 and report["dry_run"] and report["applied"] == 0
    changes = {
        (c["kind"], c["action"], c["name"], c["before"], c["after"]) for c in report["changes"]
    }
    assert changes == {
        ("partitions", "increase", "", "2", "4"),
        ("config", "set", "retention.ms", "7200000", "3600000"),
        ("config", "set", "cleanup.policy", None, "compact,delete"),
        ("config", "delete", "segment.bytes", "10485760", None),
    }
    assert all(c["topic"] == remote for c in report["changes"])
    assert partitions(secondary, remote) == 2, "a dry run changed the partitions"
    assert overrides(secondary, remote)["retention.ms"] == "7200000", "a dry run changed a config"

    code, (report,) = sync(capsys, config)
    assert code == 0 and report["applied"] == 4 and report["failures"] == []
    assert partitions(secondary, remote) == 4
    assert overrides(secondary, remote) == {
        "retention.ms": "3600000",
        "cleanup.policy": "compact,delete",
        "min.insync.replicas": "1",  # excluded: the target's own setting is kept
    }
    # In sync: a second run finds nothing; a later change on the source is the only change.
    assert sync(capsys, config)[1][0]["changes"] == []
    alter_topic(primary, topic, {"retention.ms": "1800000"})
    code, (report,) = sync(capsys, config)
    assert [(c["name"], c["after"]) for c in report["changes"]] == [("retention.ms", "1800000")]
    assert overrides(secondary, remote)["retention.ms"] == "1800000"


def test_use_defaults_from_source_sets_the_sources_defaults_instead_of_deleting(
    sandbox, topic_name, tmp_path, capsys
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("defaults")
    create(primary, topic, 1, {})
    create(secondary, f"primary.{topic}", 1, {"segment.bytes": "10485760"})
    # Per flow: at top level MirrorMaker 2 drops it (`validate` says so).
    config = flow_file(
        tmp_path, sandbox, topic, "primary->secondary.use.defaults.from = source", NO_ACLS
    )
    code, (report,) = sync(capsys, config, "--dry-run")
    remote = f"primary.{topic}"  # (the heartbeats topic is replicated too)
    segment = [c for c in report["changes"] if (c["topic"], c["name"]) == (remote, "segment.bytes")]
    assert code == 0 and [(c["action"], c["after"]) for c in segment] == [("set", "1073741824")]


def test_a_missing_remote_topic_is_left_to_the_mirror_job_and_said_so(
    sandbox, topic_name, tmp_path, capsys
):
    topic = topic_name("not-yet")
    create(sandbox["primary"], topic, 1, {"retention.ms": "3600000"})
    config = flow_file(tmp_path, sandbox, topic, NO_ACLS)
    assert main(["sync", str(config), "--flow", "primary->secondary"]) == 0
    out = capsys.readouterr().out
    assert "nothing to change" in out
    assert f"note: primary.{topic} does not exist on secondary yet" in out


def test_a_principal_refused_by_the_target_fails_with_one_line_naming_it(
    sandbox, topic_name, tmp_path, capsys
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("refused")
    create(primary, topic, 1, {"retention.ms": "3600000"})
    create(secondary, f"primary.{topic}", 1, {})
    # alice may see the remote topic and its configs on the target, not alter them.
    ops = (AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS)
    allow(secondary, "alice", ResourceType.TOPIC, f"primary.{topic}", *ops)
    config = flow_file(tmp_path, sandbox, topic, NO_ACLS)
    admin_login = secondary.java_client_config()["sasl.jaas.config"]
    alice_login = secondary.java_client_config("alice")["sasl.jaas.config"]
    config.write_text(config.read_text().replace(admin_login, alice_login))
    code = main(["sync", str(config), "--flow", "primary->secondary"])
    captured = capsys.readouterr()
    assert code == 2
    assert "retention.ms (default) -> 3600000" in captured.out  # the diff, as always
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("mirrorflow: error: primary->secondary: cluster secondary refused ")
    assert "principal alice while altering the configs of primary." in line


@pytest.mark.spark
def test_the_running_mirror_job_syncs_configs_every_interval(sandbox, topic_name, tmp_path):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("live-configs")
    create(primary, topic, 2, {"retention.ms": "3600000"})
    config = flow_file(tmp_path, sandbox, topic, "sync.topic.configs.interval.seconds = 2", NO_ACLS)
    state, log = tmp_path / "state", tmp_path / "mirror.log"
    remote = f"primary.{topic}"
    job = start_mirror(config, "primary->secondary", state, log)
    try:
        wait_for(lambda: remote in topic_names(secondary), 120, "the remote topic")
        assert overrides(secondary, remote)["retention.ms"] == "3600000"  # created with it
        alter_topic(primary, topic, {"retention.ms": "1800000", "max.message.bytes": "2000000"})
        wait_for(
            lambda: overrides(secondary, remote).get("max.message.bytes") == "2000000",
            30,
            "the changed configs on the target",
        )
        assert overrides(secondary, remote)["retention.ms"] == "1800000"
        # The task's figures reach progress.json while the flow idles (every 10 s at most).
        wait_for(
            lambda: (
                progress(state).get("tasks", {}).get("sync-topic-configs", {}).get("runs", 0) >= 3
            ),
            60,
            "the task's runs in progress.json",
        )
        assert progress(state)["tasks"]["sync-topic-configs"]["failures"] == 0
    finally:
        stop_job(job)
    output = log.read_text(errors="replace")
    assert f"synced {remote}: max.message.bytes (default) -> 2000000" in output


def acl(cluster, kind, name, pattern, user, operation, permission=AclPermissionType.ALLOW):
    """Create one ACL binding on a sandbox cluster."""
    binding = AclBinding(kind, name, pattern, f"User:{user}", "*", operation, permission)
    admin = AdminClient(cluster.client_config())
    for future in admin.create_acls([binding]).values():
        future.result(timeout=30)


def test_acls_follow_mirrormaker2s_rules_plus_the_prefixed_and_group_acls_a_failover_needs(
    sandbox, topic_name, tmp_path, capsys
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic, other = topic_name("acls"), topic_name("acls-unreplicated")
    group, excluded = topic_name("group"), topic_name("group") + "-excluded"
    create(primary, topic, 1, {})
    create(primary, other, 1, {})
    lit, pre, op = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED, AclOperation
    TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
    acl(primary, TOPIC, topic, lit, "alice", op.READ)
    acl(primary, TOPIC, topic, lit, "alice", op.WRITE)  # dropped: only the mirror writes
    acl(primary, TOPIC, topic, lit, "bob", op.ALL)  # becomes READ
    acl(primary, TOPIC, topic, lit, "bob", op.WRITE, AclPermissionType.DENY)  # DENY kept
    acl(primary, TOPIC, other, lit, "alice", op.READ)  # not replicated: not synced
    acl(primary, TOPIC, topic[:-3], pre, "alice", op.DESCRIBE)  # mirrorflow: to the remote prefix
    acl(primary, GROUP, group, lit, "alice", op.READ)  # mirrorflow: consumers' groups
    acl(primary, GROUP, group, lit, "alice", op.DELETE)  # not what a consumer needs
    acl(primary, GROUP, excluded, lit, "alice", op.READ)  # excluded by the flow's groups filter
    config = flow_file(
        tmp_path,
        sandbox,
        topic,
        f"primary->secondary.groups = {group}.*",
        f"primary->secondary.groups.exclude = {excluded}",
    )
    code, (_configs, report) = sync(capsys, config, "--dry-run")
    expected = {
        ("TOPIC", "LITERAL", f"primary.{topic}", "User:alice", "READ", "ALLOW"),
        ("TOPIC", "LITERAL", f"primary.{topic}", "User:bob", "READ", "ALLOW"),
        ("TOPIC", "LITERAL", f"primary.{topic}", "User:bob", "WRITE", "DENY"),
        ("TOPIC", "PREFIXED", f"primary.{topic[:-3]}", "User:alice", "DESCRIBE", "ALLOW"),
        ("GROUP", "LITERAL", group, "User:alice", "READ", "ALLOW"),
    }

    def bindings(changes) -> set[tuple]:
        keys = ("resource_type", "pattern", "name", "principal", "operation", "permission")
        return {tuple(c[k] for k in keys) for c in changes}

    assert code == 0 and report["what"] == "acls" and bindings(report["changes"]) == expected
    target = AdminClient(secondary.client_config())
    filter_ = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, op.ANY, AclPermissionType.ANY
    )

    def on_target() -> set[tuple]:
        found = target.describe_acls(filter_).result(timeout=30)
        mine = [b for b in found if b.name.startswith((f"primary.{topic[:-3]}", group))]
        return {
            (
                b.restype.name,
                b.resource_pattern_type.name,
                b.name,
                b.principal,
                b.operation.name,
                b.permission_type.name,
            )
            for b in mine
        }

    assert on_target() == set(), "a dry run created ACLs"
    code, (_configs, report) = sync(capsys, config)
    assert code == 0 and report["applied"] == 5 and report["failures"] == []
    assert on_target() == expected
    assert sync(capsys, config)[1][1]["changes"] == []  # in sync: nothing more to create


def test_acls_the_sync_created_are_removed_with_their_source_acls_and_no_others(
    sandbox, topic_name, tmp_path, capsys
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic, user = topic_name("acl-removal"), topic_name("carol")
    remote = f"primary.{topic}"
    create(primary, topic, 1, {})
    lit, op = ResourcePatternType.LITERAL, AclOperation
    acl(primary, ResourceType.TOPIC, topic, lit, user, op.READ)
    acl(primary, ResourceType.TOPIC, topic, lit, user, op.DESCRIBE)
    acl(secondary, ResourceType.TOPIC, remote, lit, user, op.DESCRIBE)  # someone else's, before
    removal = "primary->secondary.sync.topic.acls.remove.enabled = true"
    only_mine = f"primary->secondary.groups = {user}"  # no other test's group ACLs
    config = flow_file(tmp_path, sandbox, topic, removal, only_mine)
    code, (_configs, report) = sync(capsys, config)
    assert code == 0 and [c["operation"] for c in report["changes"]] == ["READ"]

    target = AdminClient(secondary.client_config())

    def on_target() -> set[str]:
        pattern = AclBindingFilter(
            ResourceType.TOPIC, remote, lit, None, None, op.ANY, AclPermissionType.ANY
        )
        return {b.operation.name for b in target.describe_acls(pattern).result(timeout=30)}

    assert on_target() == {"READ", "DESCRIBE"}
    source = AdminClient(primary.client_config())
    gone = AclBindingFilter(
        ResourceType.TOPIC, topic, lit, None, None, op.ANY, AclPermissionType.ANY
    )
    source.delete_acls([gone])[gone].result(timeout=30)  # both source ACLs deleted

    code, (_configs, report) = sync(capsys, config, "--dry-run")
    assert [(c["action"], c["operation"]) for c in report["changes"]] == [("remove", "READ")]
    assert on_target() == {"READ", "DESCRIBE"}, "a dry run removed an ACL"
    code, (_configs, report) = sync(capsys, config)
    assert code == 0 and report["applied"] == 1 and report["failures"] == []
    assert on_target() == {"DESCRIBE"}  # only what the sync created is removed
    assert sync(capsys, config)[1][1]["changes"] == []

    # Without the setting, an ACL the sync created and whose source is gone is kept, and said so.
    acl(primary, ResourceType.TOPIC, topic, lit, user, op.READ)
    sync(capsys, config)
    source.delete_acls([gone])[gone].result(timeout=30)
    kept = flow_file(tmp_path, sandbox, topic, only_mine)
    code, (_configs, report) = sync(capsys, kept)
    assert report["changes"] == [] and "kept" in report["notes"][0]
    assert on_target() == {"READ", "DESCRIBE"}


@pytest.mark.airflow
def test_the_sync_dag_logs_the_diff_applies_it_and_a_dry_run_applies_nothing(
    sandbox, airflow_home, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("dag-configs")
    remote = f"primary.{topic}"
    create(primary, topic, 3, {"retention.ms": "3600000"})
    create(secondary, remote, 1, {})
    # Configs only: the DAG's checkpoint task has its own test (test_group_sync_dag.py).
    no_checkpoints = "primary->secondary.emit.checkpoints.enabled = false"
    config = flow_file(tmp_path, sandbox, topic, NO_ACLS, no_checkpoints)
    dag_file = render_into_dags_folder(config, "sync")
    assert dag_file.name == "sync__secondary.py"
    log = tmp_path / "dry-run.log"
    result = finish(start_dag_test(dag_file, tmp_path / "state", log, {"dry_run": True}), log)
    assert result == {"state": "success", "tasks": {"sync": ["success", 1]}}
    output = log.read_text()
    assert "primary->secondary configs: would change 2 (dry run: nothing applied)" in output
    assert f"{remote}: partitions 1 -> 3" in output
    assert partitions(secondary, remote) == 1 and "retention.ms" not in overrides(secondary, remote)
    log = tmp_path / "run.log"
    result = finish(start_dag_test(dag_file, tmp_path / "state", log), log)
    assert result == {"state": "success", "tasks": {"sync": ["success", 1]}}
    assert "primary->secondary configs: changed 2 of 2" in log.read_text()
    assert partitions(secondary, remote) == 3
    assert overrides(secondary, remote)["retention.ms"] == "3600000"
