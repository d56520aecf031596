"""``plan`` reads live clusters and explains, per flow, every topic and group it would take."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from mirrorflow.config.topology import load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.plan import build_plan
from tests.conftest import create_topics

pytestmark = pytest.mark.kafka


def _flow_file(path: Path, sandbox, lines: list[str], **overrides: dict[str, str]) -> Path:
    text = ["clusters = primary, secondary"]
    for alias in ("primary", "secondary"):
        config = {**sandbox[alias].java_client_config(), **overrides.get(alias, {})}
        text += [f"{alias}.{k} = {v}" for k, v in config.items()]
    path.write_text("\n".join([*text, *lines]) + "\n")
    return path


def _commit(cluster, group: str, topic: str) -> None:
    consumer = Consumer({**cluster.client_config(), "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        consumer.close()


def test_plan_lists_included_excluded_internal_and_cyclic_topics_and_groups(
    sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    orders, existing, scratch = topic_name("orders"), topic_name("orders"), topic_name("tmp")
    users, internal, cyclic = topic_name("users"), f"__{topic_name('x')}", f"secondary.{orders}"
    create_topics(primary, orders, partitions=3)
    create_topics(primary, existing, scratch, users, internal, cyclic)
    create_topics(secondary, f"primary.{existing}", partitions=2)
    app, console, idle = topic_name("app"), f"console-consumer-{topic_name()}", topic_name("idle")
    _commit(primary, app, orders)
    _commit(primary, console, orders)
    _commit(primary, idle, users)
    path = _flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        [
            "primary->secondary.enabled = true",
            "primary->secondary.topics = orders-.*, tmp-.*, secondary\\\\..*, __.*",
            "primary->secondary.topics.exclude = tmp-.*",
            "primary->secondary.record.filter = value IS NOT NULL",
        ],
    )
    plan = build_plan(load_topology([path]), timeout=10)
    [flow] = plan.flows
    assert flow.flow == "primary->secondary"
    topics = {t.topic: t for t in flow.topics}
    assert (topics[orders].partitions, topics[orders].remote) == (3, f"primary.{orders}")
    assert topics[orders].remote_partitions is None
    assert topics[existing].remote_partitions == 2
    left_out = {item.name: item.reason for item in flow.topics_left_out}
    assert left_out[scratch] == "excluded by topics.exclude pattern tmp-.*"
    assert left_out[users] == "not included by topics = orders-.*, tmp-.*, secondary\\..*, __.*"
    assert left_out[internal] == "internal topic (never replicated)"
    assert left_out[cyclic] == "cycle: it already came from secondary"
    assert app in flow.groups
    groups_left_out = {item.name: item.reason for item in flow.groups_left_out}
    assert groups_left_out[console] == "excluded by groups.exclude pattern console-consumer-.*"
    assert groups_left_out[idle] == "no committed offsets on a topic the topic filter accepts"
    text = plan.render()
    assert f"    {orders}  [3 partitions] -> primary.{orders} (to be created)" in text
    assert f"    {cyclic}: cycle: it already came from secondary" in text
    assert "  records transformed: record.filter: value IS NOT NULL\n" in text
    assert flow.application == "secondary"  # the target site's, by default
    assert "  runs in: mirror__secondary (one Spark application)\n" in text


def test_plan_names_an_unreachable_cluster(sandbox, tmp_path):
    path = _flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary->secondary.enabled = true"],
        secondary={"bootstrap.servers": "127.0.0.1:1"},
    )
    with pytest.raises(MirrorflowError, match=r"cannot reach cluster secondary at 127\.0\.0\.1:1"):
        build_plan(load_topology([path]), timeout=3)


def test_plan_names_the_cluster_whose_credentials_fail(sandbox, tmp_path):
    jaas = sandbox["primary"].java_client_config()["sasl.jaas.config"]
    wrong = jaas.replace(sandbox["primary"].passwords["admin"], "not-the-password")
    path = _flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary->secondary.enabled = true"],
        primary={"sasl.jaas.config": wrong},
    )
    with pytest.raises(MirrorflowError, match="cannot reach cluster primary") as caught:
        build_plan(load_topology([path]), timeout=5)
    assert "credentials" in caught.value.hint
    assert "not-the-password" not in str(caught.value)
