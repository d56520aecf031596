"""Consumer failover on real clusters: checkpoints, exact translation and group offset sync.

A group consumes part of a topic on the source and stops; the mirror job checkpoints it and
commits the translated offsets into the target's group; a consumer of that group on the target
then receives exactly the records it had not consumed.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from mirrorflow.mm2.formats import Checkpoint
from mirrorflow.replication import group_offsets_client
from mirrorflow.replication.checkpoint_stores import read_checkpoints
from mirrorflow.replication.checkpoint_task import GroupCheckpoints
from mirrorflow.replication.offset_map import OffsetMap
from mirrorflow.replication.positions import SourceOffsetReader
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.replication.topics import ClusterAdmin
from tests.conftest import create_topics
from tests.mirror_harness import (
    ROOT,
    flow_file,
    start_mirror,
    stop_job,
    wait_for,
    watermarks,
    write_flow_file,
)
from tests.mm2_oracle import shared as mm2_oracle
from tests.test_mirror_job import EXACTLY_ONCE, produce_transactions

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

FLOW = "primary->secondary"
BACK = "secondary->primary"


def checkpoint_lines(group: str, flow: str | None = FLOW) -> list[str]:
    return [
        f"{flow}.groups = {group}" if flow else f"groups = {group}",
        "emit.checkpoints.interval.seconds = 1",
        "refresh.groups.interval.seconds = 1",
        "sync.group.offsets.enabled = true",
        "sync.group.offsets.interval.seconds = 1",
    ]


def produce_keys(cluster, topic: str, partitions: int, keys: range) -> set[bytes]:
    producer = Producer({**cluster.client_config(), "enable.idempotence": True, "linger.ms": 20})
    for i in keys:
        while True:
            try:
                producer.produce(topic, key=b"k%d" % i, value=b"v", partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0
    return {b"k%d" % i for i in keys}


def consume_and_commit(
    cluster, topic: str, group: str, counts: dict[int, int], by: str = "key"
) -> set[bytes]:
    """A consumer of ``group`` reads the next ``counts[p]`` records of each partition ``p`` of
    ``topic`` (from the group's committed offset, else the beginning), commits exactly what it
    read, and leaves; returns the keys it read."""
    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    read: set[bytes] = set()
    commits = []
    committed = wait_for(
        lambda: committed_or_none(consumer, [TopicPartition(topic, p) for p in counts]),
        60,
        f"the coordinator of group {group}",
    )
    starts = {tp.partition: max(tp.offset, 0) for tp in committed}
    for partition, count in counts.items():
        consumer.assign([TopicPartition(topic, partition, starts[partition])])
        seen, deadline, last = 0, time.monotonic() + 60, -1
        while seen < count and time.monotonic() < deadline:
            for msg in consumer.consume(count - seen, 1.0):
                if msg.error() is None:
                    read.add(getattr(msg, by)())
                    seen, last = seen + 1, msg.offset()
        assert seen == count, f"read {seen} of {count} records of partition {partition}"
        commits.append(TopicPartition(topic, partition, last + 1))
    consumer.commit(offsets=commits, asynchronous=False)
    consumer.close()
    return read


def committed_or_none(consumer, partitions: list[TopicPartition]):
    """The consumer's committed offsets, or None while the group's coordinator moves or loads
    (a new cluster's does)."""
    try:
        return consumer.committed(partitions, timeout=30)
    except KafkaException as exc:
        if exc.args[0].retriable() or exc.args[0].code() == KafkaError.NOT_COORDINATOR:
            return None
        raise


def read_as_group(
    cluster, topic: str, group: str, timeout: float = 120, by: str = "key"
) -> list[bytes]:
    """What a consumer of ``group`` reads of ``topic`` from the group's committed offsets to
    the end (a partition without a committed offset reads nothing: ``latest``)."""
    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "isolation.level": "read_committed",
        }
    )
    metadata = consumer.list_topics(topic, timeout=10).topics[topic]
    parts = [TopicPartition(topic, p) for p in metadata.partitions]
    listed = wait_for(lambda: committed_or_none(consumer, parts), 60, "the coordinator")
    committed = {tp.partition: tp.offset for tp in listed}
    assert all(o >= 0 for o in committed.values()), f"no committed offset: {committed}"
    consumer.assign([TopicPartition(topic, p, o) for p, o in committed.items()])
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in committed}
    keys: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            if msg.error() is None:
                keys.append(getattr(msg, by)())
        done = all(
            tp.offset >= ends[tp.partition] for tp in consumer.position(list(consumer.assignment()))
        )
        if done:
            break
    consumer.close()
    return keys


def target_group_offsets(cluster, group: str, topic: str) -> dict[tuple[str, int], int]:
    """``group``'s committed offsets of ``topic`` (through a consumer of the group: the admin
    API's offset listing can crash the process, confluentinc/librdkafka#5040)."""
    consumer = Consumer({**cluster.client_config(), "group.id": group})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = [TopicPartition(topic, p) for p in metadata.partitions]
        listed = (committed_or_none(consumer, parts) or []) if parts else []
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset for tp in listed if tp.offset >= 0}


def delete_group(cluster, group: str) -> None:
    admin = AdminClient(cluster.client_config())
    admin.delete_consumer_groups([group], request_timeout=30)[group].result(30)


def groups_on(cluster) -> set[str]:
    admin = AdminClient(cluster.client_config())
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result().valid}


def translate_cli(config, group: str, flow: str = FLOW) -> list[dict]:
    command = ["translate", str(config), "--flow", flow, "--group", group, "--json"]
    result = subprocess.run(
        [sys.executable, "-m", "mirrorflow.cli", *command],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def synced(config, target, group: str, remote: str, partitions: int, flow: str = FLOW):
    """Wait until every partition is translated exactly, checkpointed, and committed on the
    target as translated; return the translation."""

    def ready():
        rows = translate_cli(config, group, flow)
        offsets = target_group_offsets(target, group, remote)
        if len(rows) == partitions and all(
            r["exactness"] == "exact"
            and r["checkpoint"] == r["translated"]
            and offsets.get((remote, r["partition"])) == r["translated"]
            for r in rows
        ):
            return rows
        return None

    return wait_for(ready, 180, f"group {group} checkpointed and synced on {flow}", interval=2)


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_failed_over_group_reads_exactly_the_records_it_had_not_consumed(
    sandbox, topic_name, tmp_path, mode
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group = topic_name("orders"), topic_name("billing")
    remote = f"primary.{t}"
    create_topics(primary, t, partitions=2)
    # Transactions with aborted ones: commit markers and aborted records leave gaps in the
    # source offsets that a translation must not fall into.
    keys = produce_transactions(primary, t, 2, range(30), 40)
    consumed = consume_and_commit(primary, t, group, {0: 211, 1: 122})
    lines = checkpoint_lines(group)  # the source is read read_committed by default (issue 27)
    if mode == "exactly-once":
        lines += EXACTLY_ONCE
    config = flow_file(tmp_path, sandbox, t, *lines)
    job = start_mirror(config, FLOW, tmp_path / "state", tmp_path / "job.log")
    try:
        rows = synced(config, secondary, group, remote, 2)

        # The Java client's RemoteClusterUtils reads the same offsets from the checkpoints.
        java = mm2_oracle().remote_translate(secondary.java_client_config(), "primary", group)
        assert {k: v[0] for k, v in java.items()} == {
            (remote, r["partition"]): r["translated"] for r in rows
        }

        read = read_as_group(secondary, remote, group)
        assert len(read) == len(set(read)), "a record was read twice"
        assert set(read) == keys - consumed

        # The group rewinds on the source: the checkpoint follows (MirrorMaker 2's rule), but
        # the target's idle group, further on, is never moved backwards.
        at_end = target_group_offsets(secondary, group, remote)
        rewinder = Consumer({**primary.client_config(), "group.id": group})
        rewinder.commit(offsets=[TopicPartition(t, p, 0) for p in (0, 1)], asynchronous=False)
        rewinder.close()
        spec = spec_for_flow([config], FLOW)
        wait_for(
            lambda: all(
                c.upstream_offset == 0
                for (g, _t, _p), c in read_checkpoints(spec).latest.items()
                if g == group
            ),
            60,
            "the rewound checkpoints",
        )
        time.sleep(3)  # three group offset syncs
        assert target_group_offsets(secondary, group, remote) == at_end

        # The group is deleted, on the source first, then on the target (as a DR drill's
        # restore does): the job stops checkpointing and syncing it, and never commits it
        # on the target again (it did a moment later: issue 24).
        delete_group(primary, group)
        delete_group(secondary, group)
        time.sleep(6)  # six checkpoint runs and group offset syncs
        assert target_group_offsets(secondary, group, remote) == {}
        assert group not in groups_on(secondary)
    finally:
        stop_job(job)


def test_a_group_active_on_the_target_is_never_touched_and_a_far_behind_group_is_exact(
    sandbox, topic_name, tmp_path
):
    """A group a million records behind translates exactly, also after the mirror job is
    killed mid-copy; a group with members on the target keeps its own offsets."""
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, behind, active = topic_name("clicks"), topic_name("reports"), topic_name("live")
    remote = f"primary.{t}"
    create_topics(primary, t, partitions=2)
    early = produce_keys(primary, t, 2, range(0, 2000))
    consumed = consume_and_commit(primary, t, behind, {0: 600, 1: 400})
    consume_and_commit(primary, t, active, {0: 300, 1: 200})
    later = produce_keys(primary, t, 2, range(2000, 1_002_000))
    lines = [*checkpoint_lines(f"{behind}|{active}"), "offset.lag.max = 100"]
    config = flow_file(tmp_path, sandbox, t, *lines)
    state, log = tmp_path / "state", tmp_path / "job.log"

    # A member of the active group on the target, subscribed and polling.
    member = Consumer(
        {**secondary.client_config(), "group.id": active, "enable.auto.commit": False}
    )
    job = start_mirror(config, FLOW, state, log, "--max-records-per-batch", "200000")
    try:
        wait_for(lambda: remote in member.list_topics(timeout=5).topics, 120, "the remote topic")
        member.subscribe([remote])
        member.poll(1)
        time.sleep(8)  # some batches copied
        os.killpg(job.pid, signal.SIGKILL)  # mid-copy: some records are copied twice
        job.wait(30)
        job = start_mirror(config, FLOW, state, log, "--max-records-per-batch", "200000")
        rows = synced(config, secondary, behind, remote, 2)
        assert sum(r["committed"] for r in rows) == len(consumed)
        member.poll(1)
        assert target_group_offsets(secondary, active, remote) == {}  # never touched
        assert "has members on secondary" in log.read_text()
        ends = {p: end for p, (_start, end) in watermarks(primary, t, [0, 1]).items()}
        wait_for(lambda: copied_to(config, t, ends), 300, "every record copied")
    finally:
        member.close()
        stop_job(job)

    read = Counter(read_as_group(secondary, remote, behind, timeout=300))
    twice = {k for k, n in Counter(read_all_keys(secondary, remote)).items() if n > 1}
    assert set(read) == (early | later) - consumed  # nothing lost
    assert {k for k, n in read.items() if n > 1} <= twice  # repeats only of double copies


def copied_to(config, topic: str, ends: dict[int, int]) -> bool:
    """Whether the flow's positions in ``topic`` reached ``ends`` (partition -> end offset)."""
    spec = spec_for_flow([config], FLOW)
    reader = SourceOffsetReader(
        spec.target_consumer, spec.target_admin, spec.offsets_topic, "primary"
    )
    try:
        positions = {p: last + 1 for (t, p), last in reader.read_to_end().items() if t == topic}
    finally:
        reader.close()
    return all(positions.get(p, 0) >= end for p, end in ends.items())


def read_all_keys(cluster, topic: str) -> list[bytes]:
    consumer = Consumer(
        {**cluster.client_config(), "group.id": "unused", "enable.auto.commit": False}
    )
    metadata = consumer.list_topics(topic, timeout=10).topics[topic]
    parts = [TopicPartition(topic, p, 0) for p in metadata.partitions]
    ends = {tp.partition: consumer.get_watermark_offsets(tp)[1] for tp in parts}
    consumer.assign(parts)
    keys: list[bytes] = []
    while True:
        for msg in consumer.consume(5000, 0.5):
            if msg.error() is None:
                keys.append(msg.key())
        if all(tp.offset >= ends[tp.partition] for tp in consumer.position(parts)):
            break
    consumer.close()
    return keys


def test_a_group_failed_over_and_back_resumes_on_the_source_exactly(sandbox, topic_name, tmp_path):
    """Failback: a group consumes on primary, fails over to secondary and consumes the copies
    there; the opposite flow checkpoints it back (translated with the forward flow's map), and
    on primary it reads exactly the records it had consumed on neither cluster."""
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group, local = topic_name("ledger"), topic_name("audit"), topic_name("local")
    remote = f"primary.{t}"
    create_topics(primary, t, partitions=2)
    create_topics(secondary, local)
    keys = produce_keys(primary, t, 2, range(4000))
    consumed = consume_and_commit(primary, t, group, {0: 500, 1: 300})
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "secondary"],
        [
            f"{FLOW}.enabled = true",
            f"{FLOW}.topics = {t}",
            f"{BACK}.enabled = true",
            f"{BACK}.topics = {local}",
            *checkpoint_lines(group, flow=None),
        ],
    )
    job = start_mirror(config, FLOW, tmp_path / "state", tmp_path / "forward.log")
    try:
        synced(config, secondary, group, remote, 2)
    finally:
        stop_job(job)
    consumed |= consume_and_commit(secondary, remote, group, {0: 400, 1: 900})  # failed over

    job = start_mirror(config, BACK, tmp_path / "state", tmp_path / "back.log")
    try:
        rows = synced(config, primary, group, t, 2, flow=BACK)
        assert {r["source_topic"] for r in rows} == {remote}
    finally:
        stop_job(job)
    read = read_as_group(primary, t, group)
    assert len(read) == len(set(read)), "a record was read twice"
    assert set(read) == keys - consumed


def test_a_compacted_source_topic_translates_exactly(sandbox, topic_name, tmp_path):
    """Compaction leaves gaps in the source offsets; a group resumes after them exactly."""
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group = topic_name("profiles"), topic_name("crm")
    remote = f"primary.{t}"
    compacted = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": "100",
    }
    admin = AdminClient(primary.client_config())
    admin.create_topics([NewTopic(t, 1, 1, config=compacted)])[t].result()
    producer = Producer(primary.client_config())

    def key(i: int) -> bytes:
        """Even records share 20 keys, so compaction removes all but the last of each; odd
        records and the rolls have keys of their own and stay: gaps all along the offsets."""
        return b"k%d" % (i % 40) if i < 2000 and i % 2 == 0 else b"u%d" % i

    def write(values) -> None:
        for i in values:
            producer.produce(t, key=key(i), value=b"v%d" % i, partition=0)
        assert producer.flush(30) == 0

    last = {key(i): b"v%d" % i for i in range(2000)}
    compacted_originals = set(last.values())

    def survivors() -> set[bytes] | None:
        """The topic's values once the log cleaner has compacted it fully (else None): only
        then is it final, as no later record shares a key with an earlier one."""
        write([next(rolls)])  # a new record rolls the segment, so the cleaner can go on
        consumer = Consumer({**primary.client_config(), "group.id": f"{group}-peek"})
        consumer.assign([TopicPartition(t, 0, 0)])
        end = consumer.get_watermark_offsets(TopicPartition(t, 0), timeout=10)[1]
        found: dict[int, bytes] = {}
        while not found or max(found) + 1 < end:
            batch = [m for m in consumer.consume(3000, 3.0) if m.error() is None]
            if not batch:
                break
            found |= {m.offset(): m.value() for m in batch}
        consumer.close()
        originals = {v for o, v in found.items() if o < 2000}
        return set(found.values()) if originals == compacted_originals else None

    write(range(2000))
    rolls = itertools.count(2000)
    time.sleep(1)
    values = wait_for(survivors, 120, "the log cleaner to compact the topic", interval=5)
    consumed = consume_and_commit(primary, t, group, {0: len(values) // 2}, by="value")

    config = flow_file(tmp_path, sandbox, t, *checkpoint_lines(group))
    job = start_mirror(config, FLOW, tmp_path / "state", tmp_path / "job.log")
    try:
        synced(config, secondary, group, remote, 1)
    finally:
        stop_job(job)
    read = read_as_group(secondary, remote, group, by="value")
    assert len(read) == len(set(read)), "a record was read twice"
    assert set(read) == values - consumed


def test_exactly_once_a_far_behind_group_fails_over_with_nothing_lost_or_repeated_after_sigkill(
    sandbox, topic_name, tmp_path
):
    """Exactly-once: the job is killed mid-copy and restarted; the offset map, written in the
    copies' transactions, still translates a group 300,000 records behind exactly."""
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group = topic_name("payments"), topic_name("settlement")
    remote = f"primary.{t}"
    create_topics(primary, t, partitions=2)
    keys = produce_keys(primary, t, 2, range(0, 1000))
    consumed = consume_and_commit(primary, t, group, {0: 300, 1: 200})
    keys |= produce_keys(primary, t, 2, range(1000, 301_000))
    config = flow_file(tmp_path, sandbox, t, *checkpoint_lines(group), *EXACTLY_ONCE)
    state, log = tmp_path / "state", tmp_path / "job.log"
    job = start_mirror(config, FLOW, state, log, "--max-records-per-batch", "40000")
    try:
        wait_for(lambda: "batch 2:" in log.read_text(), 180, "two batches copied")
        os.killpg(job.pid, signal.SIGKILL)  # between or inside batches
        job.wait(30)
        job = start_mirror(config, FLOW, state, log, "--max-records-per-batch", "40000")
        ends = {p: end for p, (_start, end) in watermarks(primary, t, [0, 1]).items()}
        wait_for(lambda: copied_to(config, t, ends), 300, "every record copied")
        synced(config, secondary, group, remote, 2)
    finally:
        stop_job(job)
    assert len(read_all_keys(secondary, remote)) == len(keys)  # each committed copy once
    read = read_as_group(secondary, remote, group, timeout=300)
    assert len(read) == len(set(read)), "a record was read twice"
    assert set(read) == keys - consumed


def test_with_the_source_away_a_group_keeps_its_last_checkpoints(tmp_path, monkeypatch):
    """Emergency: the source does not answer, so it cannot say that a group is gone: the
    group's last checkpoints stay in what the group offset sync commits."""
    monkeypatch.setattr(group_offsets_client, "COORDINATOR_WAIT_S", 2.0)
    with socket.socket() as away:
        away.bind(("127.0.0.1", 0))  # bound, never listening: connections refused
        config = tmp_path / "mm2.properties"
        config.write_text(
            "clusters = primary, secondary\n"
            f"primary.bootstrap.servers = 127.0.0.1:{away.getsockname()[1]}\n"
            "secondary.bootstrap.servers = 127.0.0.1:9\n"
            f"{FLOW}.enabled = true\n"
            "emit.reverse.checkpoints.enabled = false\n"  # the offset fetch is what fails
        )
        spec = spec_for_flow([config], FLOW)
        admins = {
            spec.source: ClusterAdmin(spec.source, spec.source_admin),
            spec.target: ClusterAdmin(spec.target, spec.target_admin),
        }
        positions = {("orders", 0): 40}
        tool = GroupCheckpoints(spec, admins, OffsetMap(), lambda: positions, producer=False)
        tool.groups = ["billing"]
        kept = Checkpoint("billing", "primary.orders", 0, 30, 28, "")
        tool.latest[("billing", "primary.orders", 0)] = kept
        assert tool.still_on_source("billing")
        assert tool.snapshot() == {("billing", "primary.orders", 0): kept}
