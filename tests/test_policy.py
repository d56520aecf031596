"""Replication policies name and recognise remote topics exactly as MirrorMaker 2 does."""

from __future__ import annotations

import pytest

from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.policy import (
    DefaultReplicationPolicy,
    IdentityReplicationPolicy,
    ReplicationPolicy,
    load_policy,
)


def _default(**config: str) -> DefaultReplicationPolicy:
    policy = DefaultReplicationPolicy()
    policy.configure({k.replace("_", "."): v for k, v in config.items()})
    return policy


def test_remote_topic_is_source_alias_separator_topic():
    assert _default().format_remote_topic("us-west", "orders") == "us-west.orders"
    custom = _default(replication_policy_separator="__")
    assert custom.format_remote_topic("us-west", "orders") == "us-west__orders"


@pytest.mark.parametrize(
    ("topic", "source"),
    [
        ("A.t", "A"),
        ("B.A.t", "B"),
        ("t", None),
        ("A.", None),  # Java's split drops the trailing empty part
        (".x", ""),  # ...but keeps a leading one
        ("A..b", "A"),
        ("..", None),
        ("", None),
    ],
)
def test_topic_source_follows_java_string_split(topic, source):
    assert _default().topic_source(topic) == source


def test_upstream_and_original_topic_follow_every_hop():
    policy = _default()
    assert policy.upstream_topic("B.A.orders") == "A.orders"
    assert policy.upstream_topic("A..b") == ".b"
    assert policy.upstream_topic("orders") is None
    assert policy.original_topic("C.B.A.orders") == "orders"


def test_an_empty_separator_splits_every_character_as_java_does():
    policy = _default(replication_policy_separator="")
    assert policy.topic_source("abc") == "a"
    assert policy.upstream_topic("abc") == "bc"


@pytest.mark.parametrize(
    ("topic", "expected"),
    [("heartbeats", True), ("A.heartbeats", True), ("B.A.heartbeats", True),
     ("A.heartbeats-x", False), ("myheartbeats", False)],
)  # fmt: skip
def test_heartbeats_topics_are_recognised_at_any_hop(topic, expected):
    assert _default().is_heartbeats_topic(topic) is expected


@pytest.mark.parametrize(
    ("topic", "internal"),
    [
        ("mm2-offset-syncs.B.internal", True),
        ("A.checkpoints.internal", True),
        ("B.A.checkpoints.internal", True),
        ("__consumer_offsets", True),
        (".hidden", True),
        ("mm2-configs.A.internal", True),
        ("orders.internal", False),  # MM2 4.x replicates user topics ending in .internal
        ("connect-offsets", False),
        ("orders", False),
    ],
)
def test_internal_topics_are_mm2s_own_and_double_underscore_or_dot_topics(topic, internal):
    assert _default().is_internal_topic(topic) is internal


def test_internal_topics_use_an_explicit_separator_unless_that_is_disabled():
    underscore = _default(replication_policy_separator="_")
    assert underscore.checkpoints_topic("A") == "A_checkpoints_internal"
    assert underscore.offset_syncs_topic("B") == "mm2-offset-syncs_B_internal"
    assert underscore.is_checkpoints_topic("A_checkpoints_internal")
    assert not underscore.is_checkpoints_topic("A.checkpoints.internal")
    dots = _default(
        replication_policy_separator="_",
        replication_policy_internal_topic_separator_enabled="false",
    )
    assert dots.checkpoints_topic("A") == "A.checkpoints.internal"
    assert dots.offset_syncs_topic("B") == "mm2-offset-syncs.B.internal"
    assert dots.heartbeats_topic() == "heartbeats"


def test_identity_policy_keeps_names_but_prefixes_heartbeats():
    policy = IdentityReplicationPolicy()
    policy.configure({"source.cluster.alias": "A"})
    assert policy.format_remote_topic("A", "orders") == "orders"
    assert policy.format_remote_topic("A", "heartbeats") == "A.heartbeats"
    assert policy.topic_source("orders") == "A"
    assert policy.topic_source("B.heartbeats") == "B"
    assert policy.upstream_topic("orders") == "orders"
    assert policy.original_topic("orders") == "orders"


def test_identity_policy_without_a_source_alias_sees_no_remote_topics():
    policy = IdentityReplicationPolicy()
    policy.configure({})
    assert policy.topic_source("orders") is None


def test_mm2_java_class_names_select_the_built_in_policies():
    prefix = "org.apache.kafka.connect.mirror."
    assert type(load_policy(prefix + "DefaultReplicationPolicy", {})) is DefaultReplicationPolicy
    identity = load_policy(prefix + "IdentityReplicationPolicy", {"source.cluster.alias": "A"})
    assert isinstance(identity, IdentityReplicationPolicy) and identity.source_alias == "A"


class UpperCasePolicy(ReplicationPolicy):
    """A custom policy: REMOTE topics are ``<SOURCE>_<topic>``."""

    def format_remote_topic(self, source_alias: str, topic: str) -> str:
        return f"{source_alias.upper()}_{topic}"

    def topic_source(self, topic: str) -> str | None:
        return topic.split("_")[0].lower() if "_" in topic else None

    def upstream_topic(self, topic: str) -> str | None:
        return topic.split("_", 1)[1] if "_" in topic else None


def test_custom_policies_load_by_python_dotted_path():
    policy = load_policy(f"{__name__}.UpperCasePolicy", {})
    assert policy.format_remote_topic("a", "t") == "A_t"
    assert policy.original_topic("B_A_t") == "t"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("com.example.MyPolicy", "is a Java class mirrorflow cannot run"),
        ("no.such.module.Policy", "is not an importable subclass of ReplicationPolicy"),
        (f"{__name__}.test_custom_policies_load_by_python_dotted_path", "not an importable"),
    ],
)
def test_unusable_policy_classes_are_refused_naming_the_setting(name, message):
    with pytest.raises(MirrorflowError, match=message) as caught:
        load_policy(name, {})
    assert caught.value.message.startswith(f"replication.policy.class = {name}")
