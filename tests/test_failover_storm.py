"""The case DR exists for: the source broker SIGKILLed (or frozen: SIGSTOP) while the site's
mirror job is copying a large batch of the flow, then the emergency failover through its DAG
(``dag.test()``), in both delivery modes.

The site job runs two flows into ``secondary``: ``primary->secondary`` (the one failed over) and
``tertiary->secondary``, which must copy throughout. The failover's ``stop-mirror`` must stop the
held flow within seconds although its batch in flight waits for a source that is gone (the job
cancels it: exactly once, its transactions are aborted; at least once, it keeps what was
acknowledged). Then a consumer group resumes on the target with nothing lost or repeated, and,
once the source is back, no record of the held flow reaches the target (its copies stay exactly
as they were at the cut) until the hold is released; released, the flow copies the rest, each
record once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import javaproperties
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import write_private
from mirrorflow.replication.checkpoint_stores import read_checkpoints
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime import jobs, jvm
from tests.conftest import create_topics
from tests.dag_harness import finish, render_into_dags_folder, start_dag_test
from tests.mirror_harness import end_offsets, start_mirror, stop_job, wait_for, write_flow_file
from tests.test_checkpoints import consume_and_commit, read_as_group
from tests.test_mirror_job import EXACTLY_ONCE

FLOW, OTHER = "primary->secondary", "tertiary->secondary"
PARTITIONS = 4
BACKLOG = 120_000  # records of 1 KiB: one batch of several seconds, in flight at the kill
# The source's fetch quota, per client, while the backlog is copied (a WAN link's bandwidth), so
# that the kill lands in its batch however fast the machine copies. A broker measures a client's
# rate over its quota's whole window (11 samples of 1 s) from the first fetch on, so a new client
# may take about 10 s of its quota at once before it is throttled: at 16 MiB/s every task's
# consumer took its 30 MiB partition unthrottled, and the batch once ended in 1.5 s, before the
# kill (a CI-like run). At 1 MiB/s each task took 10 MiB at once, then 1 MiB/s, and a busy run's
# throttled fetches once waited over the job's 10-s stall bound before an exactly-once batch had
# read the 10,000 records of its first Arrow batch: no copy appeared in 120 s (four tries). At
# 2 MiB/s each task takes 20 MiB at once, its first copies before any throttling, then 2 MiB/s
# for the rest: the batch is in flight for seconds after its first copies. The quota goes once
# the source is back, before the rest is copied.
FETCH_QUOTA = 2 * 1024 * 1024


def fetch_quota(cluster, scratch: Path, bytes_per_s: int | None) -> None:
    """Sets (or with None removes) the default ``consumer_byte_rate`` quota of every client of
    ``cluster``, with Kafka's own ``kafka-configs`` (``kafka.admin.ConfigCommand``)."""
    command_config = write_private(
        scratch / "admin.properties",
        javaproperties.dumps(cluster.java_client_config(), timestamp=False),
    )
    change = (
        ["--add-config", f"consumer_byte_rate={bytes_per_s}"]
        if bytes_per_s
        else ["--delete-config", "consumer_byte_rate"]
    )
    java = jvm.require_tool("java", "to run Kafka's kafka-configs")
    command = [java, "-cp", jvm.classpath("kafka"), "kafka.admin.ConfigCommand"]
    result = subprocess.run(
        [
            *command,
            *("--bootstrap-server", cluster.bootstrap_servers),
            *("--command-config", str(command_config)),
            *("--alter", "--entity-type", "clients", "--entity-default", *change),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def produce_bulk(cluster, topic: str, keys: range, size: int = 1024) -> set[bytes]:
    """Records ``k<i>`` of ``size`` bytes, round robin over the partitions, all acknowledged."""
    producer = Producer(
        {
            **cluster.client_config(),
            "enable.idempotence": True,
            "linger.ms": 50,
            "batch.size": 1_000_000,
        }
    )
    value = b"x" * size
    for i in keys:
        while True:
            try:
                producer.produce(topic, key=b"k%d" % i, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0
    return {b"k%d" % i for i in keys}


def committed_keys(cluster, topic: str, partitions: int) -> list[bytes]:
    """Every committed record's key of ``topic`` (read_committed), from the start."""
    stop = end_offsets(cluster, topic, partitions)
    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": "storm-probe",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    keys: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in stop if stop[p] > 0])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            keys += [m.key() for m in consumer.consume(5000, 0.5) if m.error() is None]
            at = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())}
            if all(at[p] >= stop[p] for p in at):
                return keys
        raise AssertionError(f"could not read {topic} to its end {stop}")
    finally:
        consumer.close()


def copied_and_checkpointed(spec, records: int, group: str) -> bool:
    """Whether the flow copied ``records`` and checkpointed ``group`` (not yet while its
    internal topics are being created)."""
    try:
        return sum(flow_positions(spec).values()) >= records and any(
            g == group for g, _t, _p in read_checkpoints(spec).latest
        )
    except MirrorflowError:
        return False


class SteadyProducer:
    """Writes ``s<i>`` records to a topic at ``rate`` per second on a thread; keeps the keys
    acknowledged."""

    def __init__(self, cluster, topic: str, rate: int = 50) -> None:
        self.producer = Producer({**cluster.client_config(), "enable.idempotence": True})
        self.topic, self.rate = topic, rate
        self.acked: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self.producer.produce(
                self.topic,
                key=b"s%d" % i,
                value=b"v",
                partition=i % 2,
                on_delivery=lambda err, msg: self.acked.add(msg.key()) if err is None else None,
            )
            self.producer.poll(0)
            i += 1
            time.sleep(1 / self.rate)

    def stop(self) -> set[bytes]:
        self._stop.set()
        self._thread.join(10)
        assert self.producer.flush(30) == 0
        return self.acked


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.parametrize(
    ("delivery", "fault"),
    [("exactly-once", "killed"), ("at-least-once", "killed"), ("exactly-once", "frozen")],
)
def test_an_emergency_failover_with_the_source_broker_killed_mid_batch(
    delivery, fault, sandbox, airflow_home, topic_name, tmp_path
):
    """``killed``: SIGKILL, connections refused. ``frozen``: SIGSTOP, connections open and
    unanswered (a hung broker, a partitioned network): every call waits out its timeout, the
    planning of a batch by Spark's Kafka source included; once the broker runs again, the
    requests it had pending are answered, and still nothing of the held flow is committed."""
    primary, secondary, tertiary = sandbox["primary"], sandbox["secondary"], sandbox["tertiary"]
    t, u, group = topic_name("orders"), topic_name("stock"), topic_name("app")
    remote, other_remote = f"primary.{t}", f"tertiary.{u}"
    create_topics(primary, t, partitions=PARTITIONS)
    create_topics(tertiary, u, partitions=2)
    keys = produce_bulk(primary, t, range(4000))
    consumed = consume_and_commit(primary, t, group, {0: 500, 1: 400, 2: 300, 3: 200})
    config = write_flow_file(
        tmp_path / "mm2.properties",
        sandbox,
        ["primary", "secondary", "tertiary"],
        [
            f"{FLOW}.enabled = true",
            f"{FLOW}.topics = {t}",
            f"{FLOW}.groups = {group}",
            f"{OTHER}.enabled = true",
            f"{OTHER}.topics = {u}",
            "emit.checkpoints.interval.seconds = 1",
            "sync.topic.configs.enabled = false",
            "sync.topic.acls.enabled = false",
            *(
                [*EXACTLY_ONCE, "tertiary.consumer.isolation.level = read_committed"]
                if delivery == "exactly-once"
                else []
            ),
        ],
    )
    spec = spec_for_flow([config], FLOW)
    assert spec.exactly_once == (delivery == "exactly-once")
    state = tmp_path / "state"
    flows = state / "flows"
    flow_dir = flows / "primary-secondary"
    job = start_mirror(config, [FLOW, OTHER], flows, tmp_path / "job.log")
    writer: SteadyProducer | None = None
    broker: int | None = None
    throttled = False
    try:
        wait_for(
            lambda: copied_and_checkpointed(spec, 4000, group),
            240,
            "the first copies and the group's checkpoint",
        )
        writer = SteadyProducer(tertiary, u)
        dag_file = render_into_dags_folder(config, "failover", FLOW)

        # A backlog held back until it is all on the source, so the flow copies it in one
        # batch of several seconds (under the source's fetch quota); the source broker is
        # killed while that batch runs.
        fetch_quota(primary, tmp_path, FETCH_QUOTA)
        throttled = True
        jobs.set_paused(flow_dir, True)
        wait_for(lambda: jobs.read_progress(flow_dir).get("state") == "PAUSED", 60, "PAUSED")
        keys |= produce_bulk(primary, t, range(4000, 4000 + BACKLOG))
        before = sum(end_offsets(secondary, remote, PARTITIONS).values())
        jobs.set_paused(flow_dir, False)
        wait_for(
            lambda: sum(end_offsets(secondary, remote, PARTITIONS).values()) > before,
            120,
            "the backlog's batch to start",
            interval=0.05,
        )
        broker = sandbox_mod.load(sandbox.directory)["primary"].pid
        if fault == "killed":
            sandbox_mod.kill(sandbox.directory, ["primary"])
        else:
            os.kill(broker, signal.SIGSTOP)
        killed_at = time.time()
        other_at_kill = sum(end_offsets(secondary, other_remote, 2).values())

        log = tmp_path / "failover.log"
        run = start_dag_test(dag_file, state, log, {"mode": "emergency", "group_pattern": group})
        result = finish(run, log, 300)
        failed_over_at = time.time()
        output = log.read_text()
        assert result["state"] == "success", output[-6000:]
        assert f"{FLOW} stopped (PAUSED) in its running mirror job" in output
        # The batch in flight at the kill ended early: cancelled by the hold, or given up once
        # its source gave no record for a while (the flow then retries, holding no Spark slot).
        job_log = (tmp_path / "job.log").read_text()
        ended = r"cancelling batch|batch \d+ failed: the open transactions|no records of \S+ from"
        assert re.search(ended, job_log), job_log[-4000:]

        # The other flow copied throughout: while the source was gone and the flow was held.
        assert sum(end_offsets(secondary, other_remote, 2).values()) > other_at_kill
        assert jobs.read_progress(flows / "tertiary-secondary")["state"] in ("RUNNING", "IDLE")

        # What the target holds of the held flow at the cut, and the group on the target.
        at_cut = end_offsets(secondary, remote, PARTITIONS)
        on_target = committed_keys(secondary, remote, PARTITIONS)
        assert len(on_target) == len(set(on_target)), "a record was copied twice"
        read = read_as_group(secondary, remote, group)
        first_read_s = time.time() - killed_at
        assert len(read) == len(set(read)), "the group read a record twice"
        assert not set(read) & consumed, "the group read again what it had read on primary"
        assert set(read) == set(on_target) - consumed, "the group missed copied records"
        print(
            f"{delivery}: failover DAG done {failed_over_at - killed_at:.1f}s after the kill; "
            f"group read {len(read)} records, done {first_read_s:.1f}s after it; "
            f"{len(on_target)} of {len(keys)} records on the target at the cut"
        )

        # The source comes back: nothing of the held flow reaches the target.
        if fault == "killed":
            sandbox_mod.up(["primary"], sandbox.directory)
        else:
            os.kill(broker, signal.SIGCONT)
        wait_for(lambda: sandbox_mod.load(sandbox.directory)["primary"].is_running(), 60, "primary")
        fetch_quota(primary, tmp_path, None)
        throttled = False
        time.sleep(15)  # a running flow would have copied from primary by now
        assert end_offsets(secondary, remote, PARTITIONS) == at_cut
        assert jobs.read_progress(flow_dir)["state"] == "PAUSED"

        # Released, the flow copies the rest, each record once.
        jobs.release(flow_dir)
        jobs.set_paused(flow_dir, False)
        # The target's end offsets first (cheap), then its committed records (a read of the
        # whole topic, 120 MiB): exactly once, markers take offsets too, so the first is a floor.
        wait_for(
            lambda: sum(end_offsets(secondary, remote, PARTITIONS).values()) >= len(keys),
            240,
            "the rest of the backlog",
            interval=1,
        )
        wait_for(
            lambda: len(set(committed_keys(secondary, remote, PARTITIONS))) == len(keys),
            120,
            "the rest of the backlog, committed",
            interval=3,
        )
        final = committed_keys(secondary, remote, PARTITIONS)
        assert len(final) == len(keys) and set(final) == keys, "lost or repeated records"
        acked = writer.stop()
        writer = None
        wait_for(
            lambda: acked <= set(committed_keys(secondary, other_remote, 2)),
            120,
            "the other flow's records",
            interval=2,
        )
    finally:
        if fault == "frozen" and broker is not None:
            os.kill(broker, signal.SIGCONT)
        if writer is not None:
            writer.stop()
        stop_job(job)
        if not sandbox_mod.load(sandbox.directory)["primary"].is_running():
            sandbox_mod.up(["primary"], sandbox.directory)
        if throttled:  # the sandbox's clusters serve the other tests
            fetch_quota(primary, tmp_path, None)
