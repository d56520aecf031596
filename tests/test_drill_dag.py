"""The DR drill DAG (``drill__<source>__<target>``) run by a real Airflow (``dag.test()``) on the
sandbox clusters, with a running exactly-once mirror job: a non-destructive drill verifies its
canaries end to end and leaves a real group's offsets alone on both clusters; a destructive
drill kills the source broker mid-traffic, fails the drill group over with the emergency
failover's own steps (preflight, stop-mirror, final-sync, report: the runbook), and measures RPO,
RTO and the group's lost and repeated records (0 and 0), then restarts the broker, resumes the
flow and measures the failover's RPO on the source. Both write their reports, with their
ledgers and what they could not rehearse."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.dr import drill
from mirrorflow.dr.drill_request import DrillRequest
from mirrorflow.dr.drill_sandbox import sandbox_cluster
from mirrorflow.dr.drill_traffic import DRILL_PARTITIONS, DRILL_TOPIC
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.group_offset_sync import run_group_sync
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime import jobs
from tests.conftest import create_topics
from tests.dag_harness import finish, render_into_dags_folder, start_dag_test
from tests.mirror_harness import flow_file, start_mirror, stop_job, wait_for
from tests.test_checkpoints import (
    consume_and_commit,
    groups_on,
    produce_keys,
    target_group_offsets,
)
from tests.test_mirror_job import EXACTLY_ONCE

FLOW = "primary->secondary"
STEPS = ["preflight", "traffic", "failover", "verify", "restore", "report"]
# A destructive drill's failover: the failover DAG's own tasks, in emergency mode.
RUNBOOK = [
    *(
        f"emergency-failover.{step}"
        for step in ("preflight", "fence-producers", "catch-up", "stop-mirror", "final-sync")
    ),
    "emergency-failover-report",
]


def source_group_offsets(cluster, group: str, topic: str) -> dict[tuple[str, int], int]:
    consumer = Consumer({**cluster.client_config(), "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
        return {(tp.topic, tp.partition): tp.offset for tp in found}
    finally:
        consumer.close()


def positions(spec) -> dict:
    """The flow's positions; none while its offsets topic is being created."""
    try:
        return flow_positions(spec)
    except MirrorflowError:
        return {}


def end_offsets(cluster) -> list[int]:
    consumer = Consumer({**cluster.client_config(), "group.id": "probe"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(DRILL_TOPIC, p), timeout=30)[1]
            for p in range(DRILL_PARTITIONS)
        ]
    finally:
        consumer.close()


def the_report(state: Path) -> tuple[dict, str, str]:
    """The only drill report under ``state`` not read before: JSON, Markdown, HTML."""
    (directory,) = [
        d for d in (state / "reports" / "drill").iterdir() if not d.name.startswith("seen-")
    ]
    data = json.loads((directory / "report.json").read_text())
    texts = (directory / "report.md").read_text(), (directory / "report.html").read_text()
    directory.rename(directory.with_name("seen-" + directory.name))
    return data, *texts


def test_sandbox_cluster_is_recognised_by_its_bootstrap_port(tmp_path):
    (tmp_path / "clusters.json").write_text(
        json.dumps({"clusters": {"primary": {"broker_port": 19092}}})
    )
    assert sandbox_cluster("127.0.0.1:19092", tmp_path) == "primary"
    assert sandbox_cluster("localhost:19094", tmp_path) == "primary"  # its TLS listener
    assert sandbox_cluster("10.0.0.5:19092", tmp_path) is None
    assert sandbox_cluster("127.0.0.1:29092", tmp_path) is None
    assert sandbox_cluster("127.0.0.1:19092", tmp_path / "none") is None
    with pytest.raises(MirrorflowError, match="drill mode 'chaos' is not one of"):
        DrillRequest(FLOW, ("f",), "r", mode="chaos")


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.airflow
def test_drills_non_destructive_then_destructive_with_the_source_broker_killed_mid_traffic(
    sandbox, airflow_home, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group = topic_name("orders"), topic_name("billing")
    remote = f"primary.{t}"
    create_topics(primary, t, partitions=2)
    produce_keys(primary, t, 2, range(100))
    consume_and_commit(primary, t, group, {0: 20, 1: 10})
    config = flow_file(
        tmp_path,
        sandbox,
        f"{t}, {DRILL_TOPIC}",
        f"{FLOW}.groups = {group}, mirrorflow-drill-.*",
        f"{FLOW}.sync.topic.configs.enabled = false",
        f"{FLOW}.sync.topic.acls.enabled = false",
        "refresh.topics.interval.seconds = 2",
        "emit.checkpoints.interval.seconds = 2",
        "sync.group.offsets.enabled = true",
        "sync.group.offsets.interval.seconds = 1",
        *EXACTLY_ONCE,
    )
    spec = spec_for_flow([config], FLOW)
    assert spec.exactly_once
    state = tmp_path / "state"
    flows = state / "flows"
    job = start_mirror(config, FLOW, flows, tmp_path / "job.log")
    dag_file = render_into_dags_folder(config, "drill")
    env = {"MIRRORFLOW_SANDBOX": str(sandbox.directory)}
    try:
        wait_for(
            lambda: min(positions(spec).get((t, p), 0) for p in (0, 1)) >= 50,
            180,
            "the first copies",
        )
        run_group_sync(spec, {group}, sync_offsets=True)  # the real group, failed over before
        real_on_target = target_group_offsets(secondary, group, remote)
        real_on_source = source_group_offsets(primary, group, t)
        assert sorted(real_on_target.values()) == [10, 20]

        # A dry run checks and creates nothing (the drill topic comes with the first run).
        log = tmp_path / "dry.log"
        result = finish(start_dag_test(dag_file, state, log, {"dry_run": True}, **env), log, 300)
        tasks = {s: ["skipped", 1] for s in STEPS + RUNBOOK}
        tasks["preflight"] = tasks["report"] = ["success", 1]
        assert result == {"state": "success", "tasks": tasks}, log.read_text()[-5000:]
        data, markdown, _html = the_report(state)
        assert data["dry_run"] and data["figures"] == {}
        assert "dry run | yes: nothing was written or moved" in markdown

        # Non-destructive: canaries, a shadow group failed over, the real group untouched.
        log = tmp_path / "non-destructive.log"
        run = start_dag_test(dag_file, state, log, {"canaries": 60}, **env)
        result = finish(run, log, 420)
        output = log.read_text()
        tasks = {**{s: ["success", 1] for s in STEPS}, **{s: ["skipped", 1] for s in RUNBOOK}}
        assert result == {"state": "success", "tasks": tasks}, output[-8000:]
        data, markdown, html = the_report(state)
        figures = data["figures"]
        (shadow,) = figures["groups"]
        assert shadow.startswith("mirrorflow-drill-manual")
        assert figures["groups"][shadow] == {
            "read_on_source": 30,
            "expected_on_target": 30,
            "read_on_target": 30,
            "lost": 0,
            "lost_examples": [],
            "repeated": 0,
        }
        assert figures["rpo_records"] == 0 and figures["rto_s"] is not None
        print(
            f"non-destructive drill: RPO 0, RTO {figures['rto_s']} s, replication latency "
            f"{figures['replication_latency_s']} s"
        )
        assert figures["on_target"] == {"once": 60, "missing": 0, "duplicated": 0}
        assert figures["real_groups_unchanged"] is True and group in figures["real_groups"]
        assert target_group_offsets(secondary, group, remote) == real_on_target
        assert source_group_offsets(primary, group, t) == real_on_source
        # Deleted on both clusters by the restore, and the running job's group offset sync
        # does not commit it again on the target (it did, a moment later: issue 24).
        time.sleep(5)
        assert target_group_offsets(secondary, shadow, f"primary.{DRILL_TOPIC}") == {}
        assert shadow not in groups_on(secondary) | groups_on(primary)
        assert "**0 record(s)**" in markdown
        assert "DR drill of primary-&gt;secondary: success" in html
        kinds = {c["kind"] for c in data["changes"]} - {"topic-created"}  # the first drill's
        assert kinds == {"records-written", "group-offsets", "checkpoints", "group-deleted"}
        assert "stop-mirror: the flow is not held" in markdown
        assert "drill report: " in output and "drill figures: RPO 0 record(s)" in output

        # Destructive: the source broker killed mid-traffic.
        log = tmp_path / "destructive.log"
        conf = {"mode": "destructive", "traffic_seconds": 10, "rate": 100}
        result = finish(start_dag_test(dag_file, state, log, conf, **env), log, 600)
        output = log.read_text()
        # The failover ran as the failover DAG runs it: a task per step, those that do not
        # apply to an emergency skipped unstarted by its preflight.
        tasks = {s: ["success", 1] for s in STEPS + RUNBOOK}
        tasks["emergency-failover.fence-producers"] = ["skipped", 0]
        tasks["emergency-failover.catch-up"] = ["skipped", 0]
        assert result == {"state": "success", "tasks": tasks}, output[-8000:]
        data, markdown, html = the_report(state)
        figures = data["figures"]
        ((killed_group, lost_repeated),) = figures["groups"].items()
        assert lost_repeated["read_on_source"] > 0 and lost_repeated["read_on_target"] > 0
        assert lost_repeated["lost"] == 0 and lost_repeated["repeated"] == 0
        assert figures["acked"] >= 500  # 10 s at 100 records/s, minus the last second
        # RPO: what the producer had acknowledged and the flow had not copied at the kill:
        # exactly the records of this run missing from the target's copy.
        assert figures["on_target"]["missing"] == figures["rpo_records"]
        assert figures["on_target"]["duplicated"] == 0
        assert figures["on_target"]["once"] == figures["acked"] - figures["rpo_records"]
        assert figures["rto_s"] is not None and figures["rto_s"] > 0
        print(
            f"destructive drill: RPO {figures['rpo_records']} record(s) of {figures['acked']}, "
            f"RTO {figures['rto_s']} s, {lost_repeated}"
        )
        assert "killed (SIGKILL): the cut" in markdown and "failover triggered" in markdown
        # The failover was the failover workflow's own steps, in emergency mode.
        assert [(s["step"], s["status"]) for s in data["failover_steps"]] == [
            ("preflight", "success"),
            ("fence-producers", "skipped"),
            ("catch-up", "skipped"),
            ("stop-mirror", "success"),
            ("final-sync", "success"),
            ("rollback", "skipped"),
            ("measure-rpo", "skipped"),
            ("report", "success"),
        ]
        inner = json.loads(Path(data["failover_report"]).with_name("report.json").read_text())
        assert inner["mode"] == "emergency" and inner["status"] == "success"
        assert [s["step"] for s in inner["steps"]][3] == "stop-mirror"
        assert [c["kind"] for c in inner["changes"]][:2] == ["hold", "group-offsets"]
        assert inner["rolled_back"]["by"] == data["run_id"]  # its hold released by restore
        assert "| stop-mirror | success |" in markdown
        assert "fencing producers: an emergency failover cannot" in markdown
        kinds = [c["kind"] for c in data["changes"]]
        for kind in ("broker-killed", "broker-restarted", "hold-released", "group-deleted"):
            assert kind in kinds, kinds
        # The source back, the failover's RPO counted there: at least what the producer had
        # acknowledged and the flow had not copied (more if the broker wrote records it could
        # no longer acknowledge).
        measured = data["measured_rpo"]
        assert measured["records"] >= figures["rpo_records"], (measured, figures["rpo_records"])
        assert inner["measured_rpo"]["records"] == measured["records"]
        print(
            f"destructive drill: failover steps {data['failover_seconds']} s, measured RPO "
            f"{measured['records']} (drill RPO {figures['rpo_records']})"
        )
        # The job may have given up during the outage (its writes to the source time out
        # after 60 s); the mirror DAG's retries would start it again, as this does.
        assert data["restore"]["flow_caught_up"] is data["restore"]["mirror_job_running"]
        if job.poll() is not None:
            job = start_mirror(config, FLOW, flows, tmp_path / "job2.log")
        ends = {(DRILL_TOPIC, p): o for p, o in enumerate(end_offsets(primary))}
        wait_for(
            lambda: all(positions(spec).get(tp, 0) >= o for tp, o in ends.items()),
            180,
            "the flow to copy the rest after the restore",
        )
        assert data["failover_report"].endswith("report.md")
        assert Path(data["failover_report"]).is_file()
        assert jobs.held(flows / "primary-secondary") is None
        assert sandbox_mod.load(sandbox.directory)["primary"].is_running()
        # Neither drill group comes back on the target over several checkpoint runs and
        # syncs (of the running job, or of one started above: it reads their checkpoints back).
        time.sleep(5)
        assert {shadow, killed_group}.isdisjoint(groups_on(secondary) | groups_on(primary))
    finally:
        stop_job(job)
        if not sandbox_mod.load(sandbox.directory)["primary"].is_running():
            sandbox_mod.up(["primary"], sandbox.directory)


@pytest.mark.kafka
def test_a_destructive_drill_refuses_a_source_that_is_not_a_sandbox_cluster(
    sandbox, tmp_path, monkeypatch
):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path / "state"))
    config = flow_file(tmp_path, sandbox, DRILL_TOPIC, f"{FLOW}.groups = mirrorflow-drill-.*")
    request = DrillRequest(
        FLOW, (str(config),), "refused", mode="destructive", sandbox_dir=str(tmp_path / "other")
    )
    with pytest.raises(MirrorflowError) as refused:
        drill.preflight(request, log=lambda _line: None)
    assert str(refused.value).startswith(
        "a destructive drill kills primary's broker, and primary is not a mirrorflow sandbox "
        f"cluster (none in {tmp_path / 'other'} listens at its bootstrap servers)"
    )
    # The flow must checkpoint the drill's groups: said in one line naming the setting.
    config = flow_file(tmp_path, sandbox, DRILL_TOPIC, f"{FLOW}.groups = billing")
    request = DrillRequest(FLOW, (str(config),), "refused-2")
    with pytest.raises(MirrorflowError, match="does not checkpoint the drill group") as refused:
        drill.preflight(request, log=lambda _line: None)
    assert f"add mirrorflow-drill-.* to {FLOW}.groups" in refused.value.hint
