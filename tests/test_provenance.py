"""Provenance mode (issue 26): same topic names on both sides of active/active. Each copy carries
a header naming the cluster its record was first written on, and no flow copies a record to that
cluster, so the identity policy may run on a cycle: every record once on each side, none looping.
A group fails over and back losing nothing (it may read the other side's records again: no
single offset is exact in a topic written on both sides).
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from confluent_kafka import Producer

from mirrorflow.config import validation
from mirrorflow.config.topology import load_topology
from mirrorflow.dr import steps
from mirrorflow.dr.failback import FailbackRequest
from mirrorflow.dr.failback import run_all as fail_back
from mirrorflow.dr.failover import FailoverRequest
from mirrorflow.dr.failover import run_all as fail_over
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.transforms import ORIGIN_HEADER
from mirrorflow.paths import write_private
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime import jobs
from tests.conftest import create_topics
from tests.mirror_harness import read_topic, start_mirror, stop_job, wait_for, write_flow_file
from tests.test_checkpoints import consume_and_commit, read_as_group
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


def test_an_identity_cycle_validates_only_when_every_flow_on_it_marks_the_origin(tmp_path):
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
    with pytest.raises(MirrorflowError, match="a drill of a->b is not supported in provenance"):
        steps.refuse_provenance_mode(spec_for_flow([path], "a->b"), "a drill")


@pytest.mark.kafka
@pytest.mark.spark
def test_same_name_active_active_copies_each_record_once_each_side_and_fails_over_and_back(
    sandbox, topic_name, tmp_path, monkeypatch
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    sides = {"primary": primary, "secondary": secondary}
    t, group = topic_name("orders"), topic_name("billing")
    for cluster in sides.values():
        create_topics(cluster, t, partitions=2)
    written = {
        "primary": produce_keyed(primary, t, "p", range(400)),
        "secondary": produce_keyed(secondary, t, "s", range(400)),
    }
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        list(sides),
        active_active(
            PROVENANCE,
            f"topics = {t}",
            f"groups = {group}",
            "emit.checkpoints.interval.seconds = 1",
            "refresh.groups.interval.seconds = 1",
        ),
    )
    state = tmp_path / "state"
    flows = state / "flows"
    monkeypatch.setenv("MIRRORFLOW_STATE", str(state))
    started = [
        start_mirror(config, flow, flows, tmp_path / f"{flow.split('->')[1]}.log") for flow in FLOWS
    ]

    def keys_on(cluster) -> list[bytes]:
        return [r[1] for records in read_topic(cluster, t).values() for r in records]

    def settled(every: set[bytes]) -> None:
        """Both sides hold every record once, and a few batches later still nothing more."""
        for cluster in sides.values():
            wait_for(lambda c=cluster: len(keys_on(c)) >= len(every), 180, "both sides' records")
        time.sleep(6)
        for alias, cluster in sides.items():
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

    try:
        # Writes on both sides while both flows run.
        written["primary"] |= produce_keyed(primary, t, "p", range(400, 600))
        written["secondary"] |= produce_keyed(secondary, t, "s", range(400, 600))
        settled(written["primary"] | written["secondary"])

        # A group reads part of the primary's topic, both sides' records mixed, then fails over,
        # a producer no fence names writing on meanwhile (as the reverse flow's heartbeats do):
        # the catch-up waits for what was written before it began, not for a moving end.
        consumed = consume_and_commit(primary, t, group, {0: 250, 1: 170})
        stop_writing = threading.Event()
        live: set[bytes] = set()

        def write_on() -> None:
            producer = Producer({**primary.client_config(), "enable.idempotence": True})
            for i in itertools.count(1000):
                if stop_writing.wait(0.05):
                    break
                producer.produce(t, b"v", b"p%d" % i, partition=i % 2)
                assert producer.flush(30) == 0
                live.add(b"p%d" % i)

        writer = threading.Thread(target=write_on, daemon=True)
        writer.start()
        try:
            fail_over(
                FailoverRequest(
                    flow=FLOWS[0],
                    flow_files=(str(config),),
                    run_id="failover-1",
                    mode="planned",
                    catch_up_timeout_s=60,
                    state_dir=str(flows),
                ),
                log=lambda _line: None,
            )
        finally:
            stop_writing.set()
            writer.join()
        assert len(live) > 10, live
        assert jobs.held(flows / "primary-secondary")
        every = written["primary"] | written["secondary"]
        read = read_as_group(secondary, t, group)
        assert len(read) == len(set(read))
        assert set(read) >= every - consumed, "a record the group had not read is missing"
        again = len(set(read) & consumed)  # the other side's records between the two offsets
        print(f"failover: {len(every - consumed)} to read, {again} read again")
        # the live records written after the cut reach the secondary once the flow resumes
        written["primary"] |= live

        # On the secondary: the group reads on, and producers write there.
        consumed |= consume_and_commit(secondary, t, group, {0: 100, 1: 100})
        written["secondary"] |= produce_keyed(secondary, t, "s", range(600, 700))
        fail_back(
            FailbackRequest(
                flow=FLOWS[0],
                flow_files=(str(config),),
                run_id="failback-1",
                state_dir=str(flows),
            ),
            log=lambda _line: None,
        )
        assert not jobs.held(flows / "primary-secondary")
        every = written["primary"] | written["secondary"]
        # the reverse flow copies the secondary's new records; then the group reads on
        wait_for(lambda: len(keys_on(primary)) >= len(every), 120, "the secondary's records")
        read = read_as_group(primary, t, group)
        assert len(read) == len(set(read))
        assert set(read) >= every - consumed, "a record the group had not read is missing"
        print(f"failback: {len(every - consumed)} to read, {len(set(read) & consumed)} again")

        # Both flows run again: both sides' writes reach the other side once.
        written["primary"] |= produce_keyed(primary, t, "p", range(600, 650))
        written["secondary"] |= produce_keyed(secondary, t, "s", range(700, 750))
        settled(written["primary"] | written["secondary"])
        for job in started:
            assert job.poll() is None, "a job ended"
    finally:
        for job in started:
            stop_job(job)
