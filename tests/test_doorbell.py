"""The idle flow's doorbell on a real cluster: it wakes on the next record, with the source
permissions MirrorMaker 2 needs (READ and DESCRIBE on the topics, nothing on any group)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AclOperation, ResourceType

from mirrorflow.runtime.doorbell import Doorbell
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


def test_after_a_ring_the_doorbell_rings_at_once_for_records_already_waiting(sandbox, topic_name):
    """Issue 28: under a steady stream the engine stopped for exactly 1.0 s, 50 times in two
    minutes. While the flow copies after a ring, the doorbell's consumer went on fetching
    until its local queue was full, and librdkafka then put off that partition's next fetch by
    ``fetch.queue.backoff.ms`` (1 s): the next wait, at the flow's new positions, heard nothing
    for that second though records were waiting. It must ring at once whenever records are
    there."""
    cluster = sandbox["primary"]
    topic = topic_name("steady")
    create_topics(cluster, topic, partitions=1)
    producer = Producer({**cluster.client_config(), "linger.ms": 20})
    for i in range(6_000):  # 6 MiB: more than the doorbell's queue holds, many times over
        producer.produce(topic, b"v" * 1024, key=b"%d" % i, partition=0)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    bell = Doorbell(cluster.client_config(), "primary->secondary")
    waits = []
    try:
        for copied in range(0, 5_000, 1_000):  # each round: a ring, then a batch copying
            started = time.monotonic()
            assert bell.wait({(topic, 0): copied}, 10.0), f"no ring at {copied}"
            waits.append(round(time.monotonic() - started, 3))
            time.sleep(0.3)  # the batch, as records keep being fetched by the doorbell
    finally:
        bell.close()
    # The first ring opens a connection; every later one has its records waiting.
    assert max(waits[1:]) < 0.5, waits
