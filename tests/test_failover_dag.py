"""The failover DAG (``failover__<source>__<target>``) run by a real Airflow (``dag.test()``) on
the sandbox clusters: a planned failover with a running mirror job and a fenced producer ends
with RPO 0 and a group that resumes on the target with nothing lost or repeated, after a dry
run that changed nothing; an emergency failover with the source broker stopped commits the
stored checkpoints and estimates the RPO from the job's last observed end offsets, after
``mirrorflow failover`` (the same steps from a shell) failed to catch up, naming the records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.replication.checkpoints import read_checkpoints, run_group_sync
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime import jobs, launch
from tests.conftest import allow, create_topics
from tests.dag_harness import finish, render_into_dags_folder, start_dag_test
from tests.mirror_harness import (
    ROOT,
    flow_file,
    mirror_command,
    run_mirror_once,
    start_mirror,
    stop_job,
    wait_for,
)
from tests.test_checkpoints import (
    consume_and_commit,
    produce_keys,
    read_as_group,
    target_group_offsets,
)

FLOW = "primary->secondary"
STEPS = ["preflight", "fence-producers", "catch-up", "stop-mirror", "final-sync", "report"]


def produce_as(cluster, user: str, topic: str, keys: range) -> KafkaError | None:
    """Produce ``keys`` as ``user`` (not idempotent: WRITE on the topic is all it needs); the
    first delivery error, None when every record was written."""
    producer = Producer({**cluster.client_config(user), "acks": "all", "retries": 0})
    errors: list[KafkaError] = []
    for i in keys:
        producer.produce(
            topic,
            key=b"k%d" % i,
            value=b"v",
            partition=i % 2,
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(60) == 0
    return errors[0] if errors else None


def deny_acls(cluster, topic: str) -> list:
    admin = AdminClient(cluster.client_config())
    found = admin.describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.DENY,
        ),
        request_timeout=30,
    ).result()
    return sorted((a.principal, a.operation.name) for a in found)


def failover_cli(config: Path, state: Path, *options: str) -> subprocess.CompletedProcess:
    """``mirrorflow failover`` of the flow with ``options``, from a shell."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "mirrorflow.cli", "failover", str(config)),
            *("--flow", FLOW, "--state-dir", str(state / "flows"), *options),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MIRRORFLOW_STATE": str(state), "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )


def run_dag(dag_file: Path, state: Path, log: Path, conf: dict) -> dict:
    return finish(start_dag_test(dag_file, state, log, conf), log, 420)


def the_report(state: Path) -> tuple[dict, str, str]:
    """The only failover report under ``state`` written since the last call: JSON, md, html."""
    (directory,) = [
        d for d in (state / "reports" / "failover").iterdir() if not (d / "seen").exists()
    ]
    (directory / "seen").touch()
    data = json.loads((directory / "report.json").read_text())
    return data, (directory / "report.md").read_text(), (directory / "report.html").read_text()


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.airflow
def test_a_planned_failover_fences_producers_and_a_group_resumes_with_nothing_lost_or_repeated(
    sandbox, airflow_home, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group = topic_name("orders"), topic_name("billing")
    remote = f"primary.{t}"
    create_topics(primary, t, partitions=2)
    allow(primary, "alice", ResourceType.TOPIC, t, AclOperation.WRITE, AclOperation.DESCRIBE)
    keys = produce_keys(primary, t, 2, range(200))
    assert produce_as(primary, "alice", t, range(200, 220)) is None
    keys |= {b"k%d" % i for i in range(200, 220)}
    consumed = consume_and_commit(primary, t, group, {0: 60, 1: 40})
    config = flow_file(tmp_path, sandbox, t, f"{FLOW}.groups = {group}")
    state = tmp_path / "state"
    flows = state / "flows"
    job = start_mirror(config, FLOW, flows, tmp_path / "job.log")
    try:
        dag_file = render_into_dags_folder(config, "failover")

        # A dry run computes everything and changes nothing.
        log = tmp_path / "dry-run.log"
        result = run_dag(dag_file, state, log, {"dry_run": True, "fence_principals": ["alice"]})
        output = log.read_text()
        assert result == {"state": "success", "tasks": {s: ["success", 1] for s in STEPS}}, output
        assert f"would deny WRITE on topic {t} of primary to User:alice" in output
        assert "1 running mirror job(s) run it" in output
        assert f"group {group}: read on secondary from {remote}-0@" in output
        assert deny_acls(primary, t) == []
        assert target_group_offsets(secondary, group, remote) == {}
        assert jobs.held(flows / "primary-secondary") is None
        assert jobs.read_progress(flows / "primary-secondary")["state"] in ("RUNNING", "IDLE")
        assert job.poll() is None
        assert produce_as(primary, "alice", t, range(220, 230)) is None  # still allowed
        keys |= {b"k%d" % i for i in range(220, 230)}
        data, markdown, html = the_report(state)
        assert data["dry_run"] is True and "yes: nothing was changed" in markdown
        assert [c for c in data["changes"] if not c.startswith("would")] == []

        # The failover: alice fenced, the flow caught up and held, the group committed.
        log = tmp_path / "run.log"
        result = run_dag(dag_file, state, log, {"fence_principals": ["alice"]})
        output = log.read_text()
        assert result == {"state": "success", "tasks": {s: ["success", 1] for s in STEPS}}, output
        assert f"{FLOW} stopped (PAUSED) in its running mirror job" in output
        assert deny_acls(primary, t) == [("User:alice", "WRITE")]
        refused = produce_as(primary, "alice", t, range(1000, 1002))
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        fences = json.loads((state / "failover" / "primary-secondary" / "fences.json").read_text())
        assert {(f["principal"], f["topic"]) for f in fences} >= {("User:alice", t)}
        progress = jobs.read_progress(flows / "primary-secondary")
        assert progress["state"] == "PAUSED" and jobs.held(flows / "primary-secondary")
        assert job.poll() is None, "the job itself keeps running (its other flows would)"

        data, markdown, html = the_report(state)
        assert data["rpo"]["records"] == 0 and data["rpo"]["exact"] is True
        assert data["rpo"]["positions_at_cut"][t] == {"0": 115, "1": 115}  # all 230 records
        assert data["mode"] == "planned" and data["status"] == "success"
        assert [s["step"] for s in data["steps"]] == STEPS
        rows = data["targets"][group]
        assert {r["topic"] for r in rows} == {remote} and len(rows) == 2
        assert f"| `{remote}` | 0 |" in markdown and "**0 record(s)**" in markdown
        assert f"<code>{remote}</code>" in html
        assert f"group {group}: read on secondary from {remote}-0@" in output
        assert "failover report: " in output

        committed = target_group_offsets(secondary, group, remote)
        assert committed == {(remote, r["partition"]): r["offset"] for r in rows}
        read = read_as_group(secondary, remote, group)
        assert len(read) == len(set(read)), "a record was read twice"
        assert set(read) == keys - consumed, "lost records"
    finally:
        stop_job(job)


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.airflow
def test_an_emergency_failover_with_the_source_down_commits_checkpoints_and_estimates_rpo(
    sandbox, airflow_home, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group = topic_name("orders"), topic_name("billing")
    remote = f"primary.{t}"
    create_topics(primary, t, partitions=2)
    keys = produce_keys(primary, t, 2, range(100))
    consumed = consume_and_commit(primary, t, group, {0: 30, 1: 20})
    config = flow_file(
        tmp_path,
        sandbox,
        t,
        f"{FLOW}.groups = {group}",
        f"{FLOW}.sync.topic.configs.enabled = false",
    )
    state = tmp_path / "state"
    flows = state / "flows"
    run_mirror_once(config, FLOW, flows)
    spec = spec_for_flow([config], FLOW)
    run_group_sync(spec, {group}, sync_offsets=False)  # the job's checkpoints, now
    checkpoints = {
        (c.topic, c.partition): c.downstream_offset
        for (g, _t, _p), c in read_checkpoints(spec).latest.items()
        if g == group
    }
    assert sorted(checkpoints.values()) == [20, 30]

    # 21 more records the job observes but cannot copy: the first is larger than the remote
    # topic accepts, which stops the flow (nothing after it is copied).
    admin = AdminClient(secondary.client_config())
    resource = ConfigResource(
        ResourceType.TOPIC,
        remote,
        incremental_configs=[
            ConfigEntry("max.message.bytes", "1024", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    big = Producer(primary.client_config())
    big.produce(t, key=b"big", value=b"x" * 4000, partition=0)
    assert big.flush(30) == 0
    new = produce_keys(primary, t, 2, range(100, 120))
    stopped = subprocess.run(
        mirror_command(config, FLOW, flows, "--once"),
        capture_output=True,
        text=True,
        timeout=240,
        env=launch.job_environment(),
        cwd=ROOT,
    )
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    progress = jobs.read_progress(flows / "primary-secondary")
    assert progress["state"] == "FAILED"
    assert progress["source_end_offsets"][t] == {"0": 61, "1": 60}

    # From a shell, the same steps: the source is up, but the flow has not copied 21 records,
    # so a planned failover cannot catch up: it fails naming them, and reports it.
    cli = failover_cli(config, state, "--dry-run", "--catch-up-timeout", "3")
    assert cli.returncode == 2, cli.stdout + cli.stderr
    (error, hint) = cli.stderr.splitlines()
    assert error == (
        f"mirrorflow: error: failover of {FLOW} failed: {FLOW} did not catch up within 3s: "
        f"21 record(s) not copied yet, in {t}-0 (11), {t}-1 (10)"
    )
    assert hint.startswith("mirrorflow: what to do: check that the mirror job runs")
    data, markdown, _html = the_report(state)
    assert [(s["step"], s["status"]) for s in data["steps"]] == [
        ("preflight", "success"),
        ("fence-producers", "skipped"),
        ("catch-up", "failed"),
        ("report", "success"),
    ]
    assert markdown.startswith(f"# Failover of {FLOW}: failed at catch-up\n")
    assert jobs.held(flows / "primary-secondary") is None  # nothing was stopped

    dag_file = render_into_dags_folder(config, "failover")
    sandbox_mod.down(sandbox.directory, ["primary"])
    try:
        # From a shell, with primary down: one line says so, and none of librdkafka's own
        # lines per connection attempt (issue 24: 454 of them in an emergency failover).
        down = failover_cli(config, state, "--mode", "emergency", "--dry-run")
        said = (down.stdout + down.stderr).splitlines()
        assert down.returncode == 0, "\n".join(said[-40:])
        spam = [ln for ln in said if "Connection refused" in ln or "Connect to" in ln]
        assert spam == [], f"{len(spam)} lines of librdkafka's, e.g. {spam[0]}"
        (unreachable,) = [ln for ln in said if "cluster primary does not answer" in ln]
        assert "check primary.bootstrap.servers and that the cluster is up" in unreachable
        the_report(state)  # seen

        log = tmp_path / "emergency.log"
        result = run_dag(dag_file, state, log, {"mode": "auto"})
        output = log.read_text()
        tasks = {s: ["success", 1] for s in STEPS}
        tasks["fence-producers"] = tasks["catch-up"] = ["skipped", 1]
        assert result == {"state": "success", "tasks": tasks}, output
        assert "Connection refused" not in output and "Connect to" not in output
        data, markdown, _html = the_report(state)
        assert data["mode"] == "emergency" and data["preflight"]["source_reachable"] is False
        assert data["rpo"]["records"] == 21 and data["rpo"]["exact"] is False
        assert data["rpo"]["per_partition"] == {f"{t}-0": 11, f"{t}-1": 10}
        assert data["rpo"]["positions_at_cut"][t] == {"0": 50, "1": 50}
        assert "**21 record(s) or more** (estimate)" in markdown
        assert f"group {group}: read on secondary from {remote}-0@30, {remote}-1@20" in output
        assert target_group_offsets(secondary, group, remote) == checkpoints
        read = read_as_group(secondary, remote, group)
        assert len(read) == len(set(read)), "a record was read twice"
        # The failed batch may have copied some of the new records (at least once): they
        # follow, nothing before is lost.
        assert keys - consumed <= set(read) <= (keys | new) - consumed
        assert jobs.held(flows / "primary-secondary")
    finally:
        sandbox_mod.up(["primary"], sandbox.directory)
    wait_for(lambda: sandbox_mod.load(sandbox.directory)["primary"].is_running(), 60, "primary")
