"""The failback DAG (``failback__<source>__<target>``) run by a real Airflow (``dag.test()``) on
the sandbox clusters, after a planned failover (``mirrorflow.dr.failover``) and writes on the DR
cluster: the records written there come back and nothing else is copied (counted), the groups
resume on the old primary with nothing lost or repeated, the failover's fences are removed and the
flow resumes from its held positions without copying anything again; with the identity policy the
records written on the old primary after the cut are reported and kept in a side topic; dry runs
(the DAG's and ``mirrorflow failback --dry-run``) change nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AclOperation, ResourceType

from mirrorflow.dr import failback
from mirrorflow.dr.failover import FailoverRequest
from mirrorflow.dr.failover import run_all as failover
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime import jobs
from tests.conftest import allow, create_topics
from tests.dag_harness import render_into_dags_folder
from tests.mirror_harness import ROOT, flow_file, run_mirror_once
from tests.test_checkpoints import consume_and_commit, produce_keys, read_as_group
from tests.test_failover_dag import deny_acls, produce_as, run_dag

FLOW = "primary->secondary"
STEPS = list(failback.STEPS)  # the DAG's tasks, in order
IDENTITY = "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy"


def all_keys(cluster, topic: str) -> list[bytes]:
    """Every record's key in ``topic``, partition by partition."""
    consumer = Consumer(
        {**cluster.client_config(), "group.id": "reader", "enable.partition.eof": True}
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(metadata.partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        keys, done = [], {p for p in parts if ends[p] == 0}
        while len(done) < len(parts):
            msg = consumer.poll(5)
            assert msg is not None, f"{topic}: nothing more to read before its end"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                done.add(msg.partition())
                continue
            keys.append(msg.key())
    finally:
        consumer.close()
    return keys


def topic_exists(cluster, topic: str) -> bool:
    consumer = Consumer({**cluster.client_config(), "group.id": "reader"})
    try:
        return topic in consumer.list_topics(timeout=10).topics
    finally:
        consumer.close()


def the_report(state, kind: str = "failback") -> dict:
    """The only report of ``kind`` under ``state`` not seen yet (JSON, with the Markdown)."""
    (directory,) = [d for d in (state / "reports" / kind).iterdir() if not (d / "seen").exists()]
    (directory / "seen").touch()
    data = json.loads((directory / "report.json").read_text())
    data["markdown"] = (directory / "report.md").read_text()
    assert (directory / "report.html").read_text().startswith("<!doctype html>")
    return data


def fail_over(config, state, monkeypatch, **options) -> None:
    monkeypatch.setenv("MIRRORFLOW_STATE", str(state))
    failover(
        FailoverRequest(
            flow=FLOW,
            flow_files=(str(config),),
            run_id="failover-1",
            mode="planned",
            catch_up_timeout_s=60,
            state_dir=str(state / "flows"),
            **options,
        ),
        log=lambda _line: None,
    )
    the_report(state, "failover")  # seen


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.airflow
def test_a_failback_brings_back_what_was_written_on_the_dr_cluster_and_nothing_else(
    sandbox, airflow_home, topic_name, tmp_path, monkeypatch
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group, reports = topic_name("orders"), topic_name("billing"), topic_name("reports")
    remote, back = f"primary.{t}", f"secondary.{t}"
    create_topics(primary, t, partitions=2)
    allow(primary, "alice", ResourceType.TOPIC, t, AclOperation.WRITE, AclOperation.DESCRIBE)
    keys = produce_keys(primary, t, 2, range(100))
    consumed = consume_and_commit(primary, t, group, {0: 30, 1: 20})
    read_by_reports = consume_and_commit(primary, t, reports, {0: 15, 1: 25})
    config = flow_file(
        tmp_path,
        sandbox,
        t,
        f"{FLOW}.groups = {group}, {reports}",
        f"{FLOW}.sync.topic.acls.enabled = false",
    )
    state = tmp_path / "state"
    flows = state / "flows"
    run_mirror_once(config, FLOW, flows)
    fail_over(config, state, monkeypatch, fence_principals=("alice",))
    assert jobs.held(flows / "primary-secondary")
    spec = spec_for_flow([config], FLOW)
    held_at = flow_positions(spec)

    # During the failover: the group reads on the DR cluster, producers write there (30
    # records, on the DR cluster's own `t`), and a super user still writes 6 on the primary.
    consumed |= consume_and_commit(secondary, remote, group, {0: 10, 1: 10})
    # A second group reads only the primary's records there, never the DR cluster's own.
    read_by_reports |= consume_and_commit(secondary, remote, reports, {0: 5, 1: 5})
    create_topics(secondary, t, partitions=2)
    written = produce_keys(secondary, t, 2, range(1000, 1030))
    consumed |= consume_and_commit(secondary, t, group, {0: 5, 1: 5})
    late = produce_keys(primary, t, 2, range(2000, 2006))
    dag_file = render_into_dags_folder(config, "failback")

    # A dry run: everything computed, nothing changed.
    log = tmp_path / "dry-run.log"
    result = run_dag(dag_file, state, log, {"dry_run": True})
    output = log.read_text()
    tasks = {s: ["success", 1] for s in STEPS}
    tasks["fence-producers"] = tasks["set-aside"] = ["skipped", 1]
    assert result == {"state": "success", "tasks": tasks}, output
    assert f"would copy secondary {t}-0 offsets 0..14 (15 record(s)) to {back} on primary" in output
    assert f"would remove DENY WRITE on topic {t} of primary for User:alice" in output
    assert not topic_exists(primary, back)
    assert deny_acls(primary, t) == [("User:alice", "WRITE")]
    assert jobs.held(flows / "primary-secondary")
    data = the_report(state)
    assert data["dry_run"] is True and data["written_on_target"] == 30 and data["copied"] == 0
    assert data["changes"] and all(c["dry_run"] for c in data["changes"])
    assert all(c["what"].startswith("would") for c in data["changes"]), data["changes"]

    # The failback, with bob fenced on the DR cluster.
    log = tmp_path / "run.log"
    result = run_dag(dag_file, state, log, {"fence_principals": ["bob"]})
    output = log.read_text()
    assert result == {"state": "success", "tasks": {**tasks, "fence-producers": ["success", 1]}}, (
        output
    )
    assert deny_acls(secondary, t) == [("User:bob", "WRITE")]
    data = the_report(state)
    assert data["written_on_target"] == 30 and data["copied"] == 30, data["markdown"]
    assert "| copied back | **30 record(s)** |" in data["markdown"]
    # The failover's RPO, measured on the old primary by the preflight: nothing written up
    # to the cut was lost (alice was fenced, the flow caught up); the 6 came after it.
    measured = data["measured_rpo"]
    assert (measured["records"], measured["after_cut"]) == (0, 6), measured
    failover_report = json.loads(
        (state / "reports" / "failover" / "failover-1" / "report.json").read_text()
    )
    assert failover_report["measured_rpo"]["records"] == 0
    kinds = [c["kind"] for c in data["changes"]]
    for kind in ("fence-acl", "topic-created", "records-copied", "positions", "group-offsets"):
        assert kind in kinds, kinds
    assert kinds[-4:] == ["fence-removed", "fences-file", "hold-released", "unpaused"], kinds
    assert sorted(all_keys(primary, back)) == sorted(written), "copied back: exactly those"
    rows = {(r["topic"], r["partition"]): r["offset"] for r in data["targets"][group]}
    assert rows == {(t, 0): 40, (t, 1): 30, (back, 0): 5, (back, 1): 5}
    # The second group starts the copied-back topic at its first records.
    rows = {(r["topic"], r["partition"]): r["offset"] for r in data["targets"][reports]}
    assert rows == {(t, 0): 20, (t, 1): 30, (back, 0): 0, (back, 1): 0}
    assert deny_acls(primary, t) == []
    assert produce_as(primary, "alice", t, range(3000, 3002)) is None  # alice writes again
    late |= {b"k3000", b"k3001"}
    assert jobs.held(flows / "primary-secondary") is None
    assert not (flows / "primary-secondary" / jobs.PAUSED_FILE).exists()

    # The groups resume on the primary: nothing lost, nothing read twice; the second reads
    # every record written on the DR cluster during the failover, once.
    for name, before in ((group, consumed), (reports, read_by_reports)):
        again = read_as_group(primary, t, name) + read_as_group(primary, back, name)
        assert len(again) == len(set(again)) and not set(again) & before, f"{name}: read twice"
        assert before | set(again) == keys | written | late, f"{name}: lost records"

    # The flow resumes from its held positions: it copies the 8 records written on the primary
    # since the cut and nothing again; the copied-back topic does not go round.
    assert flow_positions(spec) == held_at
    run_mirror_once(config, FLOW, flows)
    copied = all_keys(secondary, remote)
    assert len(copied) == len(set(copied)) == 108, "a record was copied again"
    assert set(copied) == keys | late
    assert not topic_exists(secondary, f"primary.{back}")


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.airflow
def test_an_identity_failback_sets_aside_the_records_the_dr_cluster_never_had(
    sandbox, airflow_home, topic_name, tmp_path, monkeypatch
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group, audit = topic_name("orders"), topic_name("billing"), topic_name("audit")
    create_topics(primary, t, partitions=2)
    keys = produce_keys(primary, t, 2, range(40))
    config = flow_file(
        tmp_path,
        sandbox,
        t,
        IDENTITY,
        f"{FLOW}.groups = {group}, {audit}",
        f"{FLOW}.sync.topic.acls.enabled = false",
    )
    state = tmp_path / "state"
    flows = state / "flows"
    run_mirror_once(config, FLOW, flows)
    consume_and_commit(primary, t, group, {0: 20, 1: 20})
    consume_and_commit(primary, t, audit, {0: 20, 1: 20})  # reads nothing on the DR cluster
    fail_over(config, state, monkeypatch)

    # After the cut: 5 records on the primary never reach the DR cluster, 8 are written on the
    # DR cluster, of which the group reads 3.
    diverged = produce_keys(primary, t, 1, range(500, 505))  # all in partition 0
    written = produce_keys(secondary, t, 2, range(600, 608))
    consumed = consume_and_commit(secondary, t, group, {0: 2, 1: 1})
    side = f"{t}.diverged.cli__identity"

    # From a shell, a dry run first: it reports the 5 and changes nothing.
    command = [sys.executable, "-m", "mirrorflow.cli", "failback", str(config), "--flow", FLOW]
    env = {**os.environ, "MIRRORFLOW_STATE": str(state), "PYTHONPATH": str(ROOT)}
    options = ["--state-dir", str(flows), "--run-id", "cli__identity"]
    dry = subprocess.run(
        [*command, *options, "--dry-run"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"would set aside {t}-0 offsets 20..24 (5 record(s))" in dry.stdout
    assert not topic_exists(primary, side)
    assert len(all_keys(primary, t)) == 45
    assert jobs.held(flows / "primary-secondary")
    assert the_report(state)["diverged_records"] == 5

    dag_file = render_into_dags_folder(config, "failback")
    log = tmp_path / "run.log"
    result = run_dag(dag_file, state, log, {})
    output = log.read_text()
    tasks = {s: ["success", 1] for s in STEPS}
    tasks["fence-producers"] = tasks["unfence"] = ["skipped", 1]
    assert result == {"state": "success", "tasks": tasks}, output
    data = the_report(state)
    run_side = data["diverged"][0]["to"]
    assert run_side.startswith(f"{t}.diverged.")
    assert data["diverged_records"] == 5 and data["copied"] == 8 and data["written_on_target"] == 8
    assert f"`{run_side}`" in data["markdown"] and "| 20..24 | 5 |" in data["markdown"]
    assert sorted(all_keys(primary, run_side)) == sorted(diverged), "set aside"
    on_primary = all_keys(primary, t)
    assert len(on_primary) == len(set(on_primary)) == 53
    assert set(on_primary) == keys | diverged | written

    # The groups resume on the primary after what they read on the DR cluster, past the
    # records set aside.
    assert sorted(read_as_group(primary, t, group)) == sorted(written - consumed)
    assert sorted(read_as_group(primary, t, audit)) == sorted(written)

    # The flow resumes past the diverged records and the copies: nothing goes round.
    run_mirror_once(config, FLOW, flows)
    on_secondary = all_keys(secondary, t)
    assert len(on_secondary) == len(set(on_secondary)) == 48
    assert set(on_secondary) == keys | written
