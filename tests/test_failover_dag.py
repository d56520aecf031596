"""The failover DAG (``failover__<source>__<target>``) run by a real Airflow (``dag.test()``) on
the sandbox clusters: a planned failover with a running mirror job and a fenced producer ends
with RPO 0 and a group that resumes on the target with nothing lost or repeated, after a dry
run (``mirrorflow failover --dry-run``) that changed nothing and a failover that failed (the
job's driver frozen, SIGSTOP: its stop-mirror timed out) whose report lists its fence and hold,
which a failback refuses to undo and the rollback mode releases exactly; an emergency
failover with the source broker stopped commits the stored checkpoints and estimates the RPO
from the job's last observed end offsets, after ``mirrorflow failover`` (the same steps from a
shell) failed to catch up, naming the records, and, the broker back, ``--mode measure-rpo``
counts the records really lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.dr import failback, failover
from mirrorflow.dr.failback import FailbackRequest
from mirrorflow.dr.steps import safe_run_id
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.checkpoint_stores import read_checkpoints
from mirrorflow.replication.group_offset_sync import run_group_sync
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime import jobs, launch
from tests.conftest import allow, create_topics, topic_acls
from tests.dag_harness import finish, render_into_dags_folder, start_dag_test
from tests.mirror_harness import (
    ROOT,
    flow_file,
    mirror_command,
    run_mirror_once,
    start_mirror,
    stop_job,
    wait_for,
    watermarks,
)
from tests.test_checkpoints import (
    consume_and_commit,
    produce_keys,
    read_as_group,
    target_group_offsets,
)

FLOW = "primary->secondary"
STEPS = list(failover.STEPS)  # the DAG's tasks, in order
# Each task's state and try number: a step that does not apply is skipped by the step before
# it, its task never started (try 0): in an emergency each task is a process and a hand-off.
FAILOVER_TASKS = {
    **{s: ["success", 1] for s in STEPS},
    "rollback": ["skipped", 0],
    "measure-rpo": ["skipped", 0],
}


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
    found = topic_acls(cluster, topic, AclPermissionType.DENY)
    return sorted((a.principal, a.operation.name) for a in found)


def failover_cli(config: Path, state: Path, *options: str) -> subprocess.CompletedProcess:
    """``mirrorflow failover`` of the flow with ``options``, from a shell."""
    flow = ("--flow", FLOW, "--state-dir", str(state / "flows"))
    return mirrorflow_cli(state, "failover", str(config), *flow, *options)


def run_dag(dag_file: Path, state: Path, log: Path, conf: dict) -> dict:
    return finish(start_dag_test(dag_file, state, log, conf), log, 420)


def mirrorflow_cli(state: Path, *args: str) -> subprocess.CompletedProcess:
    """``mirrorflow ARGS`` with ``state`` as ``$MIRRORFLOW_STATE``."""
    return subprocess.run(
        [sys.executable, "-m", "mirrorflow.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "MIRRORFLOW_STATE": str(state), "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )


def cli_error(done: subprocess.CompletedProcess) -> list[str]:
    """The command's one-line error and what to do (librdkafka's own log lines left out)."""
    return [line for line in done.stderr.splitlines() if line.startswith("mirrorflow: ")]


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
    sandbox, airflow_home, topic_name, tmp_path, monkeypatch
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

        # A dry run (from a shell: the same steps) computes everything and changes nothing.
        dry = failover_cli(config, state, "--fence", "alice", "--dry-run")
        output = dry.stdout
        assert dry.returncode == 0, output + dry.stderr
        assert "rollback: skipped: mode planned: nothing to roll back" in output
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
        assert {c["kind"] for c in data["changes"]} >= {"fence-acl", "hold", "group-offsets"}
        assert all(c["dry_run"] and c["what"].startswith("would") for c in data["changes"])
        assert "## What it would change (dry run: nothing was changed)" in markdown

        # A failover that fails: the job's driver frozen, so stop-mirror times out (2 s). Its
        # report lists what it changed (alice fenced, the hold); a failback refuses to undo it.
        spec = spec_for_flow([config], FLOW)
        wait_for(
            lambda: (
                {tp: o for tp, o in flow_positions(spec).items() if tp[0] == t}
                == {(t, 0): 115, (t, 1): 115}
            ),
            120,
            "the 230 copies",
        )
        (driver,) = jobs.mirror_processes(flows, FLOW)
        os.kill(driver, signal.SIGSTOP)
        try:
            frozen = failover_cli(
                config, state, "--fence", "alice", "--stop-timeout", "2", "--run-id", "frozen"
            )
            assert frozen.returncode == 2, frozen.stdout + frozen.stderr
            error, hint = cli_error(frozen)
            state_then = jobs.read_progress(flows / "primary-secondary")["state"]
            assert error == (
                f"mirrorflow: error: failover of {FLOW} failed: the mirror job of {FLOW} "
                f"(driver {driver}) did not pause it within 2s (state {state_then}); the flow "
                "stays held, nothing else was changed after the hold"
            ), frozen.stderr
            assert "--mode rollback --failover-run frozen" in hint, hint
            data, markdown, _html = the_report(state)
            assert data["status"] == "failed at stop-mirror"
            # (a heartbeats topic an earlier test made on primary is replicated, so fenced too)
            changes = [c for c in data["changes"] if "heartbeats" not in c["what"]]
            assert [(c["step"], c["kind"]) for c in changes] == [
                ("fence-producers", "fence-acl"),
                ("stop-mirror", "hold"),
            ]
            assert changes[1]["undo"]["reason"] == "failover frozen"
            assert "| stop-mirror | held primary->secondary paused:" in markdown
            assert jobs.held(flows / "primary-secondary") == "failover frozen"
            assert deny_acls(primary, t) == [("User:alice", "WRITE")]
            monkeypatch.setenv("MIRRORFLOW_STATE", str(state))
            back = FailbackRequest(FLOW, (str(config),), "back", state_dir=str(flows))
            with pytest.raises(MirrorflowError) as refused:
                failback.preflight(back, log=lambda _line: None)
            assert str(refused.value) == (
                f"the latest failover of {FLOW}, run frozen, failed at stop-mirror: a failback "
                "undoes a failover that succeeded (roll it back: mirrorflow failover "
                f"{config.resolve()} --flow '{FLOW}' --mode rollback --failover-run frozen (or "
                "the failover DAG with mode rollback and failover run frozen); or run the "
                "failover again, then fail back)"
            )

            # The rollback (mode rollback, here from a shell: the DAG's rollback task runs the
            # same step) releases exactly what that run held; the other steps skip.
            rolled = failover_cli(config, state, "--mode", "rollback", "--run-id", "undo")
            assert rolled.returncode == 0, rolled.stdout + rolled.stderr
            for step in STEPS[:5]:
                assert f"{step}: skipped: mode rollback: no failover in this run" in rolled.stdout
            assert jobs.held(flows / "primary-secondary") is None
            assert not (flows / "primary-secondary" / jobs.PAUSED_FILE).exists()
            assert deny_acls(primary, t) == []
            fences = json.loads(
                (state / "failover" / "primary-secondary" / "fences.json").read_text()
            )
            assert fences == []
            data, markdown, _html = the_report(state)
            assert data["mode"] == "rollback" and data["acts_on"] == "frozen"
            assert [c["kind"] for c in data["changes"] if "heartbeats" not in c["what"]] == [
                "hold-released",
                "unpaused",
                "fence-removed",
                "fences-file",
                "record-amended",
            ]
            assert "committed group offsets stay" in markdown
            frozen_report = (state / "reports" / "failover" / "frozen" / "report.md").read_text()
            assert frozen_report.startswith(
                f"# Failover of {FLOW}: failed at stop-mirror (rolled back by undo)\n"
            ), frozen_report.splitlines()[0]
        finally:
            os.kill(driver, signal.SIGCONT)

        # The failover: alice fenced, the flow caught up and held, the group committed.
        log = tmp_path / "run.log"
        result = run_dag(dag_file, state, log, {"fence_principals": ["alice"]})
        output = log.read_text()
        assert result == {"state": "success", "tasks": FAILOVER_TASKS}, output
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
        # The fences first (one per principal and topic: other tests of the session may have
        # let more principals write to the replicated topics), then the hold.
        kinds = [c["kind"] for c in data["changes"]]
        assert kinds[0] == "fence-acl" and next(k for k in kinds if k != "fence-acl") == "hold"
        assert "group-offsets" in {c["kind"] for c in data["changes"]}
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
    cli = failover_cli(
        config, state, "--mode", "auto", "--dry-run", "--catch-up-timeout", "3"
    )  # the source answers: planned
    assert cli.returncode == 2, cli.stdout + cli.stderr
    error, hint = cli_error(cli)
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
    assert data["mode"] == "planned" and data["changes"] == []
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
        result = run_dag(dag_file, state, log, {"mode": "emergency"})
        output = log.read_text()
        tasks = dict(FAILOVER_TASKS)
        tasks["fence-producers"] = tasks["catch-up"] = ["skipped", 0]
        assert result == {"state": "success", "tasks": tasks}, output
        assert "Connection refused" not in output and "Connect to" not in output
        data, markdown, _html = the_report(state)
        # The report lists every step in the runbook's order, those skipped with their reason.
        assert [(s["step"], s["status"]) for s in data["steps"]] == [
            (step, "skipped" if tasks[step][0] == "skipped" else "success") for step in STEPS
        ]
        assert "| skipped | an emergency failover cannot wait for the source: it is away |" in (
            markdown
        )
        assert data["mode"] == "emergency" and data["preflight"]["source_reachable"] is False
        # The source, away, is given 2 s (auto would give it 15 s).
        assert data["preflight"]["source_probe_s"] == 2.0
        assert data["steps"][0]["seconds"] < 12, data["steps"][0]
        assert data["rpo"]["records"] == 21 and data["rpo"]["exact"] is False
        assert data["rpo"]["per_partition"] == {f"{t}-0": 11, f"{t}-1": 10}
        assert data["rpo"]["positions_at_cut"][t] == {"0": 50, "1": 50}
        assert "**at least 21 record(s)** (estimate: the end offsets" in markdown
        # The oldest uncopied record of each partition: written before the job listed the
        # ends, so at least that long before the cut.
        for row in data["rpo"]["partitions"]:
            assert row["age_at_least_s"] is not None and row["age_at_least_s"] > 0, row
        emergency_run = data["run_id"]
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

    # The source back: the RPO measured there, the records written up to the cut and never
    # copied, exactly the 21 the job had observed (nothing was written after the cut).
    assert watermarks(primary, t, [0, 1]) == {0: (0, 61), 1: (0, 60)}
    measured = failover_cli(config, state, "--mode", "measure-rpo")
    assert measured.returncode == 0, measured.stdout + measured.stderr
    assert "measured RPO: 21 record(s) written on primary up to the cut" in measured.stdout
    the_report(state)  # the measuring run's own
    failover_dir = state / "reports" / "failover" / safe_run_id(emergency_run)
    data = json.loads((failover_dir / "report.json").read_text())
    figures = data["measured_rpo"]
    assert figures["records"] == 21 and figures["after_cut"] == 0
    assert {r["partition"]: r["missing"] for r in figures["partitions"] if t in r["partition"]} == {
        f"{t}-0": 11,
        f"{t}-1": 10,
    }
    assert figures["oldest_age_at_cut_s"] > 0
    assert "## RPO measured on primary once it was back" in (failover_dir / "report.md").read_text()
