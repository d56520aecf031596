"""The Spark mirror job against real clusters: MirrorMaker 2's replication semantics."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from mirrorflow.mm2.formats import Heartbeat
from mirrorflow.replication.positions import SourceOffsetReader, offsets_topic
from mirrorflow.runtime import launch
from tests.conftest import create_topics
from tests.mirror_harness import (
    copied,
    distinct,
    flow_file,
    mirror_command,
    offset_syncs,
    produce,
    progress,
    read_topic,
    run_mirror_once,
    start_mirror,
    stop_job,
    topic_names,
    wait_for,
    write_flow_file,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_records_are_copied_byte_for_byte_per_partition_and_in_order(sandbox, topic_name, tmp_path):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    orders, users, skipped = topic_name("orders"), topic_name("users"), topic_name("scratch")
    create_topics(primary, orders, partitions=3)
    create_topics(primary, users, partitions=2)
    create_topics(primary, skipped)
    create_topics(primary, f"{orders}.internal", f"__{users}")
    produce(primary, orders, 3, 300)
    produce(primary, users, 2, 120)
    produce(primary, skipped, 1, 10)
    produce(primary, f"{orders}.internal", 1, 5)
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "secondary"],
        [
            "primary->secondary.enabled = true",
            f"primary->secondary.topics = {orders}, {users}, {skipped}, "
            f"{orders}.internal, __{users}",
            f"primary->secondary.topics.exclude = {skipped}, .*\\.internal, __.*",
        ],
    )
    run_mirror_once(config, "primary->secondary", tmp_path / "state")

    for topic in (orders, users):
        source, target = read_topic(primary, topic), read_topic(secondary, f"primary.{topic}")
        assert copied(target) == copied(source), topic
    # progress.json (the UI's flow page, the health model) ends at the positions copied to,
    # a short second run's too (its one small batch is over well within progress.json's pace)
    produce(primary, users, 2, 4, start=120)
    run_mirror_once(config, "primary->secondary", tmp_path / "state")
    report = progress(tmp_path / "state")
    for topic, partitions, count in ((orders, 3, 300), (users, 2, 124)):
        every = {str(p): count // partitions for p in range(partitions)}
        assert report["source_end_offsets"][topic] == every, report
        assert report["source_positions"][topic] == every, report
    remote = topic_names(secondary)
    assert f"primary.{skipped}" not in remote, "an excluded topic was replicated"
    assert not {f"primary.{orders}.internal", f"primary.__{users}"} & remote, (
        "internal topic copied"
    )

    syncs = offset_syncs(primary, "mm2-offset-syncs.secondary.internal")
    mine = [s for s in syncs if s.topic in (orders, users)]
    assert {(s.topic, s.partition) for s in mine} == {(orders, p) for p in range(3)} | {
        (users, p) for p in range(2)
    }
    for sync in mine:  # every sync pairs a record with the offset of its copy
        source = {r[0]: r[1:] for r in read_topic(primary, sync.topic)[sync.partition]}
        target = {
            r[0]: r[1:] for r in read_topic(secondary, f"primary.{sync.topic}")[sync.partition]
        }
        assert target[sync.downstream_offset] == source[sync.upstream_offset]


def test_heartbeats_go_to_the_target_only_and_come_back_over_the_reverse_flow(sandbox, tmp_path):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "secondary"],
        [
            "primary->secondary.enabled = true",
            "primary->secondary.topics = nothing-at-all",
            "secondary->primary.enabled = true",
            "secondary->primary.topics = nothing-at-all",
        ],
    )
    started = int(time.time() * 1000)

    def heartbeats(cluster, topic: str) -> list[Heartbeat]:
        if topic not in topic_names(cluster):
            return []
        records = read_topic(cluster, topic).get(0, [])
        return [h for r in records if (h := Heartbeat.from_record(r[1], r[2])) is not None]

    def of_flow(beats: list[Heartbeat]) -> list[Heartbeat]:
        return [
            h
            for h in beats
            if (h.source_cluster_alias, h.target_cluster_alias) == ("primary", "secondary")
            and h.timestamp >= started
        ]

    run_mirror_once(config, "primary->secondary", tmp_path / "state")
    assert of_flow(heartbeats(secondary, "heartbeats")), "no heartbeat of the flow on its target"
    assert not of_flow(heartbeats(primary, "heartbeats")), (
        "the flow wrote heartbeats into its source (MirrorMaker 2 needs no WRITE there)"
    )
    # The reverse flow replicates the target's heartbeats back: proof that both directions run.
    run_mirror_once(config, "secondary->primary", tmp_path / "state")
    assert of_flow(heartbeats(primary, "secondary.heartbeats"))


def test_active_active_flows_do_not_loop_and_forwarding_prefixes_each_hop(
    sandbox, topic_name, tmp_path
):
    primary, secondary, tertiary = sandbox["primary"], sandbox["secondary"], sandbox["tertiary"]
    t = topic_name("events")
    create_topics(primary, t, partitions=2)
    create_topics(secondary, t, partitions=2)
    produce(primary, t, 2, 40)
    produce(secondary, t, 2, 30)
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "secondary", "tertiary"],
        [
            "primary->secondary.enabled = true",
            "secondary->primary.enabled = true",
            "secondary->tertiary.enabled = true",
            f"topics = {t}|.*\\.{t}",
        ],
    )
    state = tmp_path / "state"
    for _ in range(2):  # a second round would copy the copies back, if cycles were not stopped
        run_mirror_once(config, "primary->secondary", state)
        run_mirror_once(config, "secondary->primary", state)
    run_mirror_once(config, "secondary->tertiary", state)

    assert f"primary.{t}" in topic_names(secondary) and f"secondary.{t}" in topic_names(primary)
    assert not {f"primary.secondary.{t}", f"secondary.primary.{t}"} & (
        topic_names(primary) | topic_names(secondary)
    ), "a flow sent a topic back to the cluster it came from"
    assert copied(read_topic(tertiary, f"secondary.primary.{t}")) == copied(read_topic(primary, t))
    assert copied(read_topic(tertiary, f"secondary.{t}")) == copied(read_topic(secondary, t))


def test_identity_policy_keeps_topic_names_one_way(sandbox, topic_name, tmp_path):
    primary, tertiary = sandbox["primary"], sandbox["tertiary"]
    t = topic_name("ledger")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 25)
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "tertiary"],
        [
            "primary->tertiary.enabled = true",
            f"primary->tertiary.topics = {t}",
            "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
        ],
    )
    run_mirror_once(config, "primary->tertiary", tmp_path / "state")
    assert copied(read_topic(tertiary, t)) == copied(read_topic(primary, t))
    assert f"primary.{t}" not in topic_names(tertiary)


def test_new_topics_and_partitions_are_picked_up_live_and_a_sigkill_loses_nothing(
    sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    base = topic_name("live")
    first, later = f"{base}-a", f"{base}-b"
    create_topics(primary, first, partitions=2)
    produce(primary, first, 2, 200)
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "secondary"],
        [
            "primary->secondary.enabled = true",
            f"primary->secondary.topics = {base}-.*",
            "primary->secondary.refresh.topics.interval.seconds = 2",  # MM2's default: 600
        ],
    )
    state, log = tmp_path / "state", tmp_path / "mirror.log"
    job = start_mirror(config, "primary->secondary", state, log)
    try:
        wait_for(
            lambda: (
                sum(map(len, read_topic(secondary, f"primary.{first}").values())) >= 200
                if f"primary.{first}" in topic_names(secondary)
                else False
            ),
            120,
            "the first copy",
        )
        create_topics(primary, later, partitions=1)
        produce(primary, later, 1, 50)
        admin = AdminClient(primary.client_config())
        admin.create_partitions([NewPartitions(first, 3)])[first].result()
        produce(primary, first, 3, 300, start=200)
        wait_for(lambda: f"primary.{later}" in topic_names(secondary), 60, "the new topic's remote")
        wait_for(
            lambda: sum(map(len, read_topic(secondary, f"primary.{later}").values())) >= 50,
            60,
            "the new topic's records",
        )
        # The running stream took the new topic and partition in and went on: no batch (a Spark
        # job) and no new stream since the flow first caught up.
        wait_for(
            lambda: (
                len(read_topic(secondary, f"primary.{first}")) == 3
                and sum(map(len, read_topic(secondary, f"primary.{first}").values())) >= 500
            ),
            60,
            "the new partition's records",
        )
        text = log.read_text()
        since = text[text.index("primary->secondary: caught up; copying continuously") :]
        assert not re.search(r"primary->secondary batch \d+:", since), since[-3000:]
        assert since.count("copying continuously") == 1, since
        assert re.search(rf"new partitions join the stream \(.*{re.escape(later)}", since), since
        time.sleep(2)
        os.killpg(job.pid, signal.SIGKILL)  # the driver dies mid-stream, no clean shutdown
        job.wait(30)
        produce(primary, first, 3, 100, start=500)
        job = start_mirror(config, "primary->secondary", state, log)

        def complete():
            target = read_topic(secondary, f"primary.{first}")
            return len(target) == 3 and all(
                distinct(target[p]) >= distinct(source)
                for p, source in read_topic(primary, first).items()
            )

        wait_for(complete, 120, "every record, including those produced while the job was down")
        # at-least-once: the batch the SIGKILL interrupted may be copied twice, never lost
        wait_for(
            lambda: (
                distinct(read_topic(secondary, f"primary.{later}")[0])
                >= distinct(read_topic(primary, later)[0])
            ),
            60,
            "every record of the topic created while the job ran",
        )
        (tmp_path / "stop").touch()
    finally:
        stop_job(job)
    for sync in offset_syncs(primary, "mm2-offset-syncs.secondary.internal"):
        if sync.topic != first:
            continue
        source = {r[0]: r[1:] for r in read_topic(primary, first)[sync.partition]}
        target = {r[0]: r[1:] for r in read_topic(secondary, f"primary.{first}")[sync.partition]}
        assert target[sync.downstream_offset] == source[sync.upstream_offset]


def test_a_wrong_password_stops_the_job_at_once_naming_cluster_and_principal(sandbox, tmp_path):
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "secondary"],
        ["primary->secondary.enabled = true"],
    )
    text = config.read_text().replace(sandbox["secondary"].passwords["admin"], "not-the-password")
    config.write_text(text)
    result = subprocess.run(
        mirror_command(config, "primary->secondary", tmp_path / "state", "--once"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = result.stdout + result.stderr  # spark-submit merges the driver's stderr into stdout
    assert result.returncode == 2, output[-3000:]
    error = next(line for line in output.splitlines() if line.startswith("mirrorflow: error:"))
    assert "secondary" in error and "admin" in error
    assert "not-the-password" not in output


def test_a_principal_without_write_acls_on_the_target_stops_the_job_naming_cluster_and_principal(
    sandbox, topic_name, tmp_path
):
    t = topic_name("denied")
    create_topics(sandbox["primary"], t, partitions=2)
    produce(sandbox["primary"], t, 2, 20)
    # Admin creates the remote topic; the copies go through alice, who has no ACLs on secondary.
    alice = sandbox["secondary"].java_client_config("alice")["sasl.jaas.config"]
    config = flow_file(
        tmp_path,
        sandbox,
        t,
        f"secondary.producer.sasl.jaas.config = {alice}",
        "emit.heartbeats.enabled = false",
    )
    result = subprocess.run(
        mirror_command(config, "primary->secondary", tmp_path / "state", "--once"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    error = next(line for line in output.splitlines() if line.startswith("mirrorflow: error:"))
    assert "cluster secondary refused principal alice" in error, error
    assert sandbox["secondary"].passwords["alice"] not in output


def test_a_record_too_large_for_the_target_stops_the_flow_naming_topic_partition_and_offset(
    sandbox, topic_name, tmp_path
):
    """The remote topic takes records of at most 2,000 bytes, far less than the copier's
    producer batches (Kafka's producer splits a batch the broker refuses into batches of its
    own ``batch.size``, forever when that is above the topic's limit: KAFKA-8350). The 3,000
    records that fit are all copied; the one that does not stops the flow, named."""
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("blobs")
    create_topics(primary, t)
    admin = AdminClient(secondary.client_config())
    remote = NewTopic(f"primary.{t}", 1, 1, config={"max.message.bytes": "2000"})
    admin.create_topics([remote])[remote.topic].result(30)
    producer = Producer(primary.client_config())
    big = 3_000
    for i in range(big + 2):
        producer.produce(t, key=b"k%d" % i, value=b"x" * (5000 if i == big else 100))
    producer.flush(30)
    config = flow_file(tmp_path, sandbox, t)
    result = subprocess.run(
        mirror_command(config, "primary->secondary", tmp_path / "state", "--once"),
        capture_output=True,
        text=True,
        timeout=240,
        env=launch.job_environment(),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    error = next(line for line in output.splitlines() if line.startswith("mirrorflow: error:"))
    assert f"{t}-0@{big}" in error and "max.message.bytes" in error
    copied_keys = [r[1] for r in read_topic(secondary, f"primary.{t}")[0]]
    assert set(copied_keys) == {b"k%d" % i for i in range(big)}, output[-3000:]


def produce_transactions(cluster, topic: str, partitions: int, txns: range, size: int) -> set:
    """Transactions of ``size`` records over ``partitions``; every fifth one is aborted.
    Returns the keys of the committed records."""

    def new_producer() -> Producer:
        producer = Producer({**cluster.client_config(), "transactional.id": f"src-{topic}"})
        producer.init_transactions(30)
        return producer

    producer = new_producer()
    committed = set()
    for txn in txns:
        keys = [f"{txn}-{i}".encode() for i in range(size)]
        for attempt in range(3):
            producer.begin_transaction()
            for i, key in enumerate(keys):
                producer.produce(topic, key=key, value=key * 4, partition=i % partitions)
            if txn % 5 != 4:
                producer.commit_transaction(30)
                committed |= set(keys)
                break
            try:
                # Written first (abort_transaction drops what is still queued): the aborted
                # records are in the log, as a DR copy reading read_uncommitted would see them.
                assert producer.flush(30) == 0
                producer.abort_transaction(30)
                break
            except KafkaException:
                # A broker an earlier test restarted may still be loading its transactions. The
                # aborted records are not committed either way: a new producer with the same
                # transactional.id aborts what this one left open, and the data set stays the same.
                if attempt == 2:
                    raise
                producer = new_producer()
    return committed


EXACTLY_ONCE = [
    "secondary.exactly.once.source.support = enabled",
    "offset.storage.replication.factor = 1",
]


@pytest.mark.parametrize("restarted", ["secondary", "primary"], ids=["target", "source"])
@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_broker_restart_mid_run_loses_no_record_and_duplicates_none_in_exactly_once_mode(
    mode, restarted, sandbox, topic_name, tmp_path
):
    from mirrorflow.devtools import sandbox as sandbox_mod

    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("restart")
    create_topics(primary, t, partitions=2)
    expected = produce_transactions(primary, t, 2, range(0, 10), 200)
    config = flow_file(
        tmp_path,
        sandbox,
        t,
        *(EXACTLY_ONCE if mode == "exactly-once" else []),
    )

    def copies() -> list:
        return [r[1] for rs in read_topic(secondary, f"primary.{t}").values() for r in rs]

    job = start_mirror(
        config,
        "primary->secondary",
        tmp_path / "state",
        tmp_path / "job.log",
        "--max-records-per-batch",
        "500",
    )
    try:
        wait_for(lambda: f"primary.{t}" in topic_names(secondary), 120, "the first copies")
        sandbox_mod.down(sandbox.directory, [restarted])
        if restarted == "secondary":
            expected |= produce_transactions(primary, t, 2, range(10, 15), 200)
        time.sleep(5)
        sandbox_mod.up([restarted], sandbox.directory)
        expected |= produce_transactions(primary, t, 2, range(15, 20), 200)
        wait_for(lambda: set(copies()) >= expected, 180, "every record after the restart")
        assert job.poll() is None, "the job gave up during the restart"
    finally:
        stop_job(job)
    keys = copies()
    assert set(keys) == expected, "aborted records were copied"
    if mode == "exactly-once":
        assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} records copied twice"


def test_exactly_once_copies_each_committed_record_once_despite_sigkill(
    sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("payments")
    create_topics(primary, t, partitions=3)
    expected = produce_transactions(primary, t, 3, range(40), 250)
    config = flow_file(tmp_path, sandbox, t, *EXACTLY_ONCE)
    state, log = tmp_path / "state", tmp_path / "job.log"
    job = start_mirror(config, "primary->secondary", state, log, "--max-records-per-batch", "600")
    try:
        wait_for(lambda: f"primary.{t}" in topic_names(secondary), 120, "the first copies")
        os.killpg(job.pid, signal.SIGKILL)  # between or inside small batches
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    run_mirror_once(config, "primary->secondary", state)
    keys = [r[1] for records in read_topic(secondary, f"primary.{t}").values() for r in records]
    assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} records copied twice"
    assert set(keys) == expected

    # Spark's own progress lost: every batch replays, and only the positions committed on
    # the target with the copies keep them from being copied again.
    shutil.rmtree(state)
    run_mirror_once(config, "primary->secondary", state)
    again = [r[1] for records in read_topic(secondary, f"primary.{t}").values() for r in records]
    assert sorted(again) == sorted(keys)


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_sigterm_to_mirrorflow_mirror_stops_the_flow_after_its_current_batch(
    mode, sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("graceful")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 3000)
    config = flow_file(tmp_path, sandbox, t, *(EXACTLY_ONCE if mode == "exactly-once" else []))
    log = open(tmp_path / "mirror.log", "wb")  # noqa: SIM115
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mirrorflow.cli",
            "mirror",
            str(config),
            "--flow",
            "primary->secondary",
            "--state-dir",
            str(tmp_path / "state"),
            "--master",
            "local[2]",
            "--max-records-per-batch",
            "500",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=launch.job_environment(),
    )
    try:
        wait_for(lambda: f"primary.{t}" in topic_names(secondary), 120, "the first copies")
        job.send_signal(signal.SIGTERM)
        assert job.wait(150) == 0
    finally:
        if job.poll() is None:
            job.kill()
        log.close()
    output = (tmp_path / "mirror.log").read_text(errors="replace")
    assert "stop requested" in output
    after_stop = output[output.index("stop requested") :]
    assert not re.search(r"primary->secondary batch \d+:", after_stop), (
        "a batch began after the stop"
    )
    assert "Traceback" not in output
    # Whatever was copied before the stop is whole: every copy is a record of the source,
    # in the source's order, from the start of each partition.
    source = read_topic(primary, t)
    for p, records in read_topic(secondary, f"primary.{t}").items():
        assert copied({p: records})[p] == copied(source)[p][: len(records)]


def test_a_caught_up_exactly_once_flow_commits_once_per_transaction_boundary_interval(
    sandbox, topic_name, tmp_path
):
    """``S->T.transaction.boundary = interval``: records arriving in a trickle (20 a second)
    reach the target in one transaction per interval, not one per batch as they arrive, and
    each exactly once. (Unset, the interval is 100 ms.) A producer fenced by another of the
    flow's transactional ids does not stop the flow that holds the lease."""
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("paced")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 10)
    config = flow_file(
        tmp_path,
        sandbox,
        t,
        *EXACTLY_ONCE,
        "primary->secondary.transaction.boundary = interval",
        "primary->secondary.transaction.boundary.interval.ms = 1000",
    )
    log = tmp_path / "mirror.log"
    job = start_mirror(config, "primary->secondary", tmp_path / "state", log)
    remote = f"primary.{t}"

    def count() -> int:
        if remote not in topic_names(secondary):
            return 0
        return sum(len(records) for records in read_topic(secondary, remote).values())

    try:
        wait_for(lambda: count() == 10, 180, "the first records")  # caught up from here on
        # Each copy as it reaches the target, before its commit (read_uncommitted), and once its
        # transaction commits (read_committed): when each consumer first returned it.
        readers = {
            level: Consumer(
                {
                    **secondary.client_config(),
                    "group.id": f"{t}-{level}",
                    "isolation.level": level,
                    "fetch.wait.max.ms": 10,
                    "enable.auto.commit": False,
                }
            )
            for level in ("read_uncommitted", "read_committed")
        }
        for reader in readers.values():
            reader.assign(
                [
                    TopicPartition(
                        remote, p, reader.get_watermark_offsets(TopicPartition(remote, p), 30)[1]
                    )
                    for p in range(2)
                ]
            )
        seen: dict[str, dict[bytes, float]] = {level: {} for level in readers}

        def watch(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for level, reader in readers.items():
                    for msg in reader.consume(100, 0.01):
                        if msg.error() is None:
                            seen[level].setdefault(msg.key(), time.monotonic())

        trickle = Producer({**primary.client_config(), "enable.idempotence": True})
        for i in range(100):  # 5 s
            trickle.produce(t, b"v%d" % i, b"k%d" % i, partition=i % 2)
            trickle.poll(0)
            watch(0.05)
        assert trickle.flush(30) == 0
        wait_for(lambda: count() == 110, 60, "the trickle")
        watch(2.0)
        for reader in readers.values():
            reader.close()
        # Each record is copied into the open transaction as it arrives, not planned and
        # copied once the interval is over: most are on the target long before their
        # transaction commits (by half the interval on average); copied after the interval,
        # each would appear uncommitted only just before its commit.
        uncommitted, committed = seen["read_uncommitted"], seen["read_committed"]
        assert len(uncommitted) == len(committed) == 100, (len(uncommitted), len(committed))
        early = sorted(committed[key] - uncommitted[key] for key in committed)
        assert early[50] > 0.2, early
        # Another producer of the driver's transactional id starts (as an earlier holder's copy
        # task that Spark retried after it woke would): it fences the job's producer. The job
        # still holds the flow's lease, so it starts its producers again and copies on: the
        # flow does not stop, and nothing is copied twice.
        fencer = Producer(
            {
                **secondary.client_config(),
                "transactional.id": "mirrorflow-primary->secondary-driver",
            }
        )
        fencer.init_transactions(30)
        produce(primary, t, 2, 20, start=110)
        wait_for(lambda: count() == 130, 120, "the records after the fence")
        assert job.poll() is None, log.read_text()[-3000:]
        assert "fenced by another producer" in log.read_text(), log.read_text()[-3000:]
    finally:
        stop_job(job)
    # Each batch's commit: its line's time. Caught up, a batch takes what arrives into its
    # transaction until the commit is due (1 s after the last), then commits.
    commits = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for line in log.read_text(errors="replace").splitlines()
        if re.search(r"INFO mirrorflow\.mirror: primary->secondary batch \d+: [1-9]", line)
    ]
    gaps = [later - earlier for earlier, later in itertools.pairwise(commits[1:7])]
    assert len(gaps) >= 4, commits  # the trickle took 5 s: a commit a second
    # 1 s apart (unpaced: 0.05). A commit is due 1 s after the last one's start, and its line
    # is written at its end: one commit slowed by a busy machine shortens the next gap by as
    # much (0.76 s after 1.23 in a full suite), while the mean over the gaps stays 1 s.
    assert sum(gaps) / len(gaps) >= 0.9, gaps
    assert min(gaps) >= 0.5, gaps
    source = read_topic(primary, t)
    assert copied(read_topic(secondary, remote)) == copied(source)


def test_offset_syncs_include_every_one_mirrormaker_2_would_write_and_all_are_exact(
    sandbox, topic_name, tmp_path
):
    """Transactions leave gaps (commit markers) in the source offsets; MirrorMaker 2's rule then
    syncs after each gap, and every ``offset.lag.max`` records otherwise."""
    from mirrorflow.mm2.offset_syncs import PartitionSyncState

    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("ledger")
    create_topics(primary, t, partitions=2)
    producer = Producer({**primary.client_config(), "transactional.id": f"{t}-writer"})
    producer.init_transactions(30)
    for txn in range(6):
        producer.begin_transaction()
        for i in range(40):
            producer.produce(
                t, key=b"k%d" % i, value=b"txn %d record %d" % (txn, i), partition=i % 2
            )
        producer.commit_transaction(30)
    config = flow_file(
        tmp_path,
        sandbox,
        t,
        "primary->secondary.offset.lag.max = 7",
        "primary.consumer.isolation.level = read_committed",
    )
    run_mirror_once(config, "primary->secondary", tmp_path / "state")

    source, target = read_topic(primary, t), read_topic(secondary, f"primary.{t}")
    assert copied(target) == copied(source)
    syncs = [
        s for s in offset_syncs(primary, "mm2-offset-syncs.secondary.internal") if s.topic == t
    ]
    for p in source:
        upstream = [r[0] for r in source[p]]
        downstream = [r[0] for r in target[p]]
        due = PartitionSyncState(max_offset_lag=7).update_batch(upstream, downstream)
        expected = {(upstream[i], downstream[i]) for i in due}
        written = {(s.upstream_offset, s.downstream_offset) for s in syncs if s.partition == p}
        assert len(expected) > 6, "the gaps should make syncs due"
        assert expected <= written, f"partition {p}: missing {sorted(expected - written)[:5]}"
        exact = dict(zip(upstream, downstream, strict=True))
        assert all(exact[up] == down for up, down in written), f"partition {p}: inexact sync"
        assert (upstream[-1], downstream[-1]) in written, "the last copy's sync was held back"


def test_an_unreachable_target_is_retried_with_backoff_and_logged_until_it_answers(
    sandbox, topic_name, tmp_path
):
    from mirrorflow.devtools import sandbox as sandbox_mod

    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("patient")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 200)
    config = flow_file(tmp_path, sandbox, t)
    log = tmp_path / "job.log"
    sandbox_mod.down(sandbox.directory, ["secondary"])
    try:
        job = start_mirror(config, "primary->secondary", tmp_path / "state", log)
        wait_for(
            lambda: "cluster secondary did not answer" in log.read_text(errors="replace"),
            120,
            "the job to log that the target does not answer",
        )
        retry = next(ln for ln in log.read_text().splitlines() if "retrying in" in ln)
        assert "secondary.bootstrap.servers" in retry, retry
        assert job.poll() is None, "the job gave up instead of retrying"
    finally:
        sandbox_mod.up(["secondary"], sandbox.directory)
    try:
        wait_for(
            lambda: (
                f"primary.{t}" in topic_names(secondary)
                and copied(read_topic(secondary, f"primary.{t}")) == copied(read_topic(primary, t))
            ),
            180,
            "every record once the target answers",
        )
    finally:
        stop_job(job)


def test_an_idle_flow_runs_no_spark_job_and_a_new_record_starts_a_batch(
    sandbox, topic_name, tmp_path
):
    """Batch after batch (``--no-continuous``; a stream's own idle and trickle are in
    test_continuous.py): idle, no batch runs; a new record starts one at once."""
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("idle")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 20)
    config = flow_file(tmp_path, sandbox, t)
    state, log = tmp_path / "state", tmp_path / "mirror.log"
    job = start_mirror(config, "primary->secondary", state, log, "--no-continuous")
    try:
        wait_for(lambda: progress(state).get("records", 0) >= 20, 120, "the first 20 records")
        batches = progress(state)["batches"]
        time.sleep(6)  # idle: heartbeats go on, but no batch, hence no Spark job, runs
        assert progress(state)["batches"] == batches, "batches ran with nothing to copy"
        produce(primary, t, 2, 1, start=20)
        wait_for(lambda: progress(state).get("records", 0) >= 21, 60, "the new record's copy")
        assert progress(state)["batches"] == batches + 1
    finally:
        stop_job(job)
    assert sum(map(len, read_topic(secondary, f"primary.{t}").values())) == 21


def test_a_trickle_is_copied_in_the_driver_without_a_spark_job_and_a_large_batch_by_spark(
    sandbox, topic_name, tmp_path
):
    """Small at-least-once batches (``--no-continuous``) run the copier's tasks in the driver's
    JVM: no Spark job (as Spark's own event log shows), the same copies, positions and exact
    offset syncs."""
    from mirrorflow.mm2.offset_syncs import PartitionSyncState

    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("trickle")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 400)  # the first batch: more than the local limit
    config = flow_file(tmp_path, sandbox, t, "primary->secondary.offset.lag.max = 3")
    state, log, events = tmp_path / "state", tmp_path / "mirror.log", tmp_path / "events"
    events.mkdir()
    spark_events = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",
    }
    job = start_mirror(
        config, "primary->secondary", state, log, "--local-batch-max-records", "100",
        "--no-continuous", conf=spark_events,
    )  # fmt: skip
    try:
        wait_for(lambda: progress(state).get("records", 0) >= 400, 120, "the first 400 records")
        assert progress(state)["local_batches"] < progress(state)["batches"]
        for i in range(400, 406):  # a trickle: one record at a time, each copied alone
            produce(primary, t, 2, 1, start=i)
            wait_for(lambda i=i: progress(state).get("records", 0) > i, 60, f"record {i}")
        done = progress(state)
    finally:
        stop_job(job)
    assert done["local_batches"] >= 6, done
    jobs = sum(  # Spark 4 rolls its event log: a directory of events_<n>_<app> files
        path.read_text().count('"Event":"SparkListenerJobStart"')
        for path in events.rglob("*")
        if path.is_file()
    )
    assert jobs == done["batches"] - done["local_batches"] >= 1, (jobs, done)
    assert "(in the driver)" in log.read_text()

    source, target = read_topic(primary, t), read_topic(secondary, f"primary.{t}")
    assert copied(target) == copied(source)  # keys, values, headers, timestamps, order
    reader = SourceOffsetReader(
        secondary.client_config(), secondary.client_config(), offsets_topic("primary"), "primary"
    )
    try:  # every position written, after the copies: the last offset of each partition
        stored = {p: o for (topic, p), o in reader.read_to_end().items() if topic == t}
    finally:
        reader.close()
    assert stored == {p: rs[-1][0] for p, rs in source.items()}
    syncs = [
        s for s in offset_syncs(primary, "mm2-offset-syncs.secondary.internal") if s.topic == t
    ]
    for p in source:
        upstream = [r[0] for r in source[p]]
        downstream = [r[0] for r in target[p]]
        exact = dict(zip(upstream, downstream, strict=True))
        written = {(s.upstream_offset, s.downstream_offset) for s in syncs if s.partition == p}
        assert all(exact[up] == down for up, down in written), f"partition {p}: inexact sync"
        due = PartitionSyncState(max_offset_lag=3).update_batch(upstream, downstream)
        expected = {(upstream[i], downstream[i]) for i in due}
        assert expected <= written, f"partition {p}: missing {sorted(expected - written)[:5]}"
        assert (upstream[-1], downstream[-1]) in written, "the last copy's sync was held back"


def test_positions_of_a_mirrorflow_0_job_are_migrated_once_into_the_offsets_topic(
    sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name("legacy")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 300)  # 150 per partition
    # What mirrorflow 0.x left: Spark's checkpoint of a flow that copied offsets 0..99 of each
    # partition (batch 1 was planned, never committed: its records were not all copied).
    legacy = tmp_path / "state" / "primary-secondary" / "checkpoint"
    (legacy / "offsets").mkdir(parents=True)
    (legacy / "commits").mkdir()
    for batch, end in ((0, 100), (1, 140)):
        (legacy / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0}\n' + json.dumps({t: {"0": end, "1": end}}) + "\n"
        )
    (legacy / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    config = flow_file(tmp_path, sandbox, t)
    run_mirror_once(config, "primary->secondary", tmp_path / "state")
    target = read_topic(secondary, f"primary.{t}")
    source = read_topic(primary, t)
    for p in (0, 1):
        assert copied({p: target[p]})[p] == copied({p: source[p]})[p][100:], p
    assert not legacy.exists()
    assert list(legacy.parent.glob("checkpoint.migrated-*"))
    reader = SourceOffsetReader(
        secondary.client_config(), secondary.client_config(), offsets_topic("primary"), "primary"
    )
    try:
        assert {k: v for k, v in reader.read_to_end().items() if k[0] == t} == {
            (t, 0): 149,
            (t, 1): 149,
        }
    finally:
        reader.close()
