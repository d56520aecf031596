"""Java consumers read mirrorflow's checkpoints: MirrorMaker 2's ``RemoteClusterUtils``.

Checkpoints encoded by :class:`mirrorflow.mm2.formats.Checkpoint` are written to a checkpoints
topic of a sandbox cluster, under an alias of this test's own, and read back with the real
``RemoteClusterUtils.translateOffsets`` (connect-mirror-client 4.3.1) through the test oracle.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from confluent_kafka import Producer

from mirrorflow.mm2.formats import Checkpoint
from mirrorflow.mm2.policy import DefaultReplicationPolicy
from tests.conftest import create_topics
from tests.mirror_harness import read_topic
from tests.mm2_oracle import Mm2Oracle, shared

pytestmark = pytest.mark.kafka

Offsets = dict[tuple[str, int], tuple[int, str]]


@pytest.fixture(scope="module")
def mm2() -> Mm2Oracle:
    return shared()


def last_checkpoints(checkpoints: Iterable[Checkpoint]) -> dict[str, Offsets]:
    """Per group, the last checkpoint of each downstream partition, in topic order:
    (topic, partition) -> (downstream offset, metadata)."""
    by_group: dict[str, Offsets] = {}
    for c in checkpoints:
        by_group.setdefault(c.group, {})[(c.topic, c.partition)] = (
            c.downstream_offset,
            c.metadata,
        )
    return by_group


def test_translate_offsets_reads_the_last_checkpoint_of_each_partition_of_the_group(
    mm2, sandbox, topic_name
):
    target = sandbox["secondary"]
    alias = topic_name("rcu")  # unique: no other test's (or MirrorMaker 2's) checkpoints
    checkpoints_topic = DefaultReplicationPolicy().checkpoints_topic(alias)
    create_topics(target, checkpoints_topic)
    orders, payments = f"{alias}.orders", f"{alias}.payments"
    group, other = "group-a", "group-b"
    written = [
        Checkpoint(group, orders, 0, 10, 8, "first"),
        Checkpoint(group, orders, 1, 20, 15, ""),
        Checkpoint(other, orders, 0, 99, 97, "other group"),
        Checkpoint(group, payments, 2, 5, 5, "x"),
        Checkpoint(group, orders, 0, 30, 25, "métadonnées ✓ 🚀"),  # replaces the first
        Checkpoint(other, payments, 2, 7, 6, ""),
    ]
    producer = Producer({**target.client_config(), "enable.idempotence": True})
    errors: list = []
    for c in written:
        producer.produce(
            checkpoints_topic,
            key=c.key(),
            value=c.value(),
            partition=0,
            on_delivery=lambda err, _msg: err and errors.append(err),
        )
    assert producer.flush(30) == 0 and not errors, errors

    # mirrorflow's reading of what is on the topic, and that it is what was meant.
    stored = [
        Checkpoint.from_record(key, value)
        for _, key, value, _, _ in read_topic(target, checkpoints_topic)[0]
    ]
    expected = last_checkpoints(stored)
    assert expected == {
        group: {
            (orders, 0): (25, "métadonnées ✓ 🚀"),
            (orders, 1): (15, ""),
            (payments, 2): (5, "x"),
        },
        other: {(orders, 0): (97, "other group"), (payments, 2): (6, "")},
    }

    props = target.java_client_config()
    assert mm2.remote_translate(props, alias, group) == expected[group]
    assert mm2.remote_translate(props, alias, other) == expected[other]
    assert mm2.remote_translate(props, alias, "no-such-group") == {}
    # The batch form (connect-mirror-client 4.x): groups whose whole id matches the pattern.
    assert mm2.remote_translate_pattern(props, alias, "group-.*") == expected
    assert mm2.remote_translate_pattern(props, alias, "group-a") == {group: expected[group]}
    assert mm2.remote_translate_pattern(props, alias, "group") == {}
