"""The idle flow's doorbell on a real cluster: it wakes on the next record, with the source
permissions MirrorMaker 2 needs (READ and DESCRIBE on the topics, nothing on any group)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AclOperation, ResourceType

from mirrorflow.runtime.driver import Doorbell
from tests.conftest import allow, create_topics
from tests.mirror_harness import wait_for

pytestmark = [pytest.mark.kafka]


def test_the_doorbell_rings_on_a_new_record_for_a_principal_without_group_acls(sandbox, topic_name):
    cluster = sandbox["primary"]
    topic = topic_name("bell")
    create_topics(cluster, topic, partitions=2)
    allow(cluster, "bob", ResourceType.TOPIC, topic, AclOperation.READ, AclOperation.DESCRIBE)
    bell = Doorbell(cluster.client_config("bob"), "primary->secondary")
    positions = {(topic, 0): 0, (topic, 1): 0}
    try:
        for _ in range(3):  # nothing there: it waits, and its group's refusal is no failure
            assert not bell.wait(positions, 0.5)
            assert bell.error is None, bell.error
        producer = Producer(cluster.client_config())
        producer.produce(topic, b"wake up", partition=1)
        assert producer.flush(30) == 0
        assert wait_for(lambda: bell.wait(positions, 1.0), 30, "the doorbell", interval=0)
        assert bell.error is None
    finally:
        bell.close()
