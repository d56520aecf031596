"""Provenance mode (issue 26): same topic names on both sides of active/active. Each copy carries
a header naming the cluster its record was first written on, and no flow copies a record to that
cluster, so the identity policy may run on a cycle: every record once on each side, none looping.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from mirrorflow.cli import main
from mirrorflow.config import validation
from mirrorflow.config.topology import load_topology
from mirrorflow.mm2.transforms import ORIGIN_HEADER
from mirrorflow.paths import write_private
from tests.conftest import create_topics
from tests.mirror_harness import read_topic, start_mirror, stop_job, wait_for, write_flow_file
from tests.test_failback_dag import IDENTITY

FLOWS = ("primary->secondary", "secondary->primary")
PROVENANCE = "provenance.header.enabled = true"


def active_active(*lines: str) -> list[str]:
    return [IDENTITY, *(f"{flow}.enabled = true" for flow in FLOWS), *lines]


def produce_keyed(cluster, topic: str, prefix: str, keys: range) -> set[bytes]:
    producer = Producer({**cluster.client_config(), "enable.idempotence": True})
    for i in keys:
        producer.produce(topic, b"v", b"%s%d" % (prefix.encode(), i), partition=i % 2)
    assert producer.flush(30) == 0
    return {b"%s%d" % (prefix.encode(), i) for i in keys}


def test_an_identity_cycle_validates_only_when_every_flow_on_it_marks_the_origin(tmp_path, capsys):
    head = [
        "clusters = a, b, c",
        *(f"{x}.bootstrap.servers = localhost:{n}" for n, x in enumerate("abc", 1)),
    ]
    cycle = [IDENTITY, "a->b.enabled = true", "b->a.enabled = true"]

    def errors(*lines: str) -> list[str]:
        path = write_private(tmp_path / "mm2.properties", "\n".join([*head, *lines]) + "\n")
        return [str(f) for f in validation.validate(load_topology([path]))]

    assert any("records loop forever" in f for f in errors(*cycle))
    half = errors(*cycle, "a->b.provenance.header.enabled = true")
    assert [f for f in half if "loop forever" in f] and all("b->a" in f for f in half), half
    assert errors(*cycle, PROVENANCE) == []
    # a full mesh: two paths between each pair, each record would land twice
    mesh = [
        IDENTITY,
        PROVENANCE,
        *(f"{s}->{t}.enabled = true" for s in "abc" for t in "abc" if s != t),
    ]
    warnings = errors(*mesh)
    assert warnings and all("reach" in w and "paths" in w for w in warnings), warnings

    path = write_private(tmp_path / "mm2.properties", "\n".join([*head, *cycle, PROVENANCE]) + "\n")
    for kind in ("failover", "failback"):
        code = main([kind, str(path), "--flow", "a->b", "--state-dir", str(tmp_path / "s")])
        assert code != 0
        assert "not supported in provenance mode" in capsys.readouterr().err


@pytest.mark.kafka
@pytest.mark.spark
def test_same_name_active_active_copies_each_record_once_to_each_side_and_nothing_loops(
    sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("orders")
    for cluster in (primary, secondary):
        create_topics(cluster, t, partitions=2)
    written = {
        "primary": produce_keyed(primary, t, "p", range(400)),
        "secondary": produce_keyed(secondary, t, "s", range(400)),
    }
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "secondary"],
        active_active(PROVENANCE, f"topics = {t}"),
    )
    jobs = [
        start_mirror(config, flow, tmp_path / "state", tmp_path / f"{flow.split('->')[1]}.log")
        for flow in FLOWS
    ]
    every = written["primary"] | written["secondary"]

    def keys_on(cluster) -> list[bytes]:
        return [r[1] for records in read_topic(cluster, t).values() for r in records]

    try:
        # Writes on both sides while both flows run.
        written["primary"] |= produce_keyed(primary, t, "p", range(400, 600))
        written["secondary"] |= produce_keyed(secondary, t, "s", range(400, 600))
        every = written["primary"] | written["secondary"]
        for cluster in (primary, secondary):
            wait_for(lambda c=cluster: len(keys_on(c)) >= len(every), 180, "both sides' records")
        time.sleep(6)  # several batches and heartbeats later, nothing more arrives
        for alias, cluster in (("primary", primary), ("secondary", secondary)):
            records = [r for part in read_topic(cluster, t).values() for r in part]
            keys = [r[1] for r in records]
            assert len(keys) == len(set(keys)) == len(every), f"{alias}: a record twice or looped"
            assert set(keys) == every
            for _offset, key, _value, headers, _ts in records:
                origins = [v for k, v in headers if k == ORIGIN_HEADER]
                if key in written[alias]:
                    assert origins == [], f"{alias}'s own record {key!r} came back"
                else:
                    other = "secondary" if alias == "primary" else "primary"
                    assert origins == [other.encode()], (key, headers)
            # heartbeats: both flows copy the heartbeats topic, and none comes back either
            for _offset, _key, _value, headers, _ts in (
                r for part in read_topic(cluster, "heartbeats").values() for r in part
            ):
                assert (ORIGIN_HEADER, alias.encode()) not in headers
        for job in jobs:
            assert job.poll() is None, "a job ended"
    finally:
        for job in jobs:
            stop_job(job)
