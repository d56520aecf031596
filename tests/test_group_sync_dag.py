"""The sync DAG's ``groups`` task: consumer-group checkpoints and group offset sync of the flows
into a site, run by a real Airflow (``dag.test()``) against the sandbox clusters; a dry run
translates and writes nothing, a run commits exactly the translated offsets."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer

from mirrorflow.replication.checkpoint_stores import read_checkpoints
from mirrorflow.replication.group_offset_sync import GroupSyncReport, GroupSyncRun
from mirrorflow.replication.remote_cluster import PartitionTranslation, translate_group
from mirrorflow.replication.spec import spec_for_flow
from tests.conftest import create_topics
from tests.dag_harness import finish, render_into_dags_folder, start_dag_test
from tests.mirror_harness import flow_file, run_mirror_once
from tests.test_checkpoints import consume_and_commit, target_group_offsets
from tests.test_mirror_job import produce_transactions

FLOW = "primary->secondary"


def group_checkpoints(spec, group: str) -> dict[tuple[str, int], int]:
    """``group``'s latest checkpoints on the flow's target: target partition -> offset."""
    return {
        (topic, partition): c.downstream_offset
        for (g, topic, partition), c in read_checkpoints(spec).latest.items()
        if g == group
    }


def test_a_runs_lines_hold_a_translation_table_and_its_dict_is_json():
    rows = [
        PartitionTranslation("orders", 0, 100, "primary.orders", 104, "exact", None, None),
        PartitionTranslation("orders", 1, 37, "primary.orders", None, "not-copied", None, None),
    ]
    report = GroupSyncReport(written={"billing": {("primary.orders", 0): 104}}, active=["live"])
    run = GroupSyncRun(FLOW, "secondary", True, True, {"billing": rows, "live": []}, [], report)
    lines = run.lines()
    assert lines[0] == (
        "primary->secondary groups: 2 checkpointed group(s), would write 0 checkpoint(s), "
        "would commit 1 offset(s) of 1 group(s), skipped 1 group(s) active on secondary "
        "(dry run: nothing written)"
    )
    table = "\n".join(lines)
    assert "orders-0" in table and "primary.orders-0" in table
    (row0,) = [line for line in lines if "orders-0 " in line]
    assert row0.split()[1:5] == ["100", "primary.orders-0", "104", "exact"]
    assert row0.endswith("checkpoint unchanged, would commit")
    assert "nothing copied yet" in table
    assert lines[-1] == "  skipped, with members on secondary: live"
    data = run.as_dict()
    assert data["offsets_written"] == {"billing": {"primary.orders-0": 104}}
    assert data["active_groups_skipped"] == ["live"] and data["dry_run"] is True
    assert data["groups"]["billing"][0]["translated"] == 104


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.airflow
def test_the_groups_task_writes_nothing_in_a_dry_run_and_commits_the_translated_offsets(
    sandbox, airflow_home, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic, group, live = topic_name("dag-groups"), topic_name("billing"), topic_name("live")
    remote = f"primary.{topic}"
    create_topics(primary, topic, partitions=2)
    # Transactions, some aborted: the source's offsets have gaps the target's do not, so the
    # translated offsets differ from the committed ones.
    produce_transactions(primary, topic, 2, range(10), 20)
    consume_and_commit(primary, topic, group, {0: 35, 1: 17})
    consume_and_commit(primary, topic, live, {0: 20, 1: 20})
    config = flow_file(
        tmp_path,
        sandbox,
        topic,
        f"{FLOW}.groups = {group}|{live}",
        f"{FLOW}.sync.group.offsets.enabled = true",
        # Checkpoints only: the topic syncs have their own DAG test (test_sync.py).
        f"{FLOW}.sync.topic.configs.enabled = false",
        f"{FLOW}.sync.topic.acls.enabled = false",
        "primary.consumer.isolation.level = read_committed",
    )
    state = tmp_path / "state"
    run_mirror_once(config, FLOW, state)  # copies the topic; --once writes no checkpoints
    spec = spec_for_flow([config], FLOW)
    rows = translate_group(spec, group)
    translated = {(r.target_topic, r.partition): r.translated for r in rows}
    assert [r.exactness for r in rows] == ["exact", "exact"] and len(translated) == 2
    assert [r.translated for r in rows] == [35, 17] != [r.committed for r in rows]

    # A member of `live` on the target: its offsets there are never touched.
    member = Consumer({**secondary.client_config(), "group.id": live, "enable.auto.commit": False})
    try:
        member.subscribe([remote])
        deadline = time.monotonic() + 60
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.5)
        assert member.assignment(), "the member on the target got no partitions"
        dag_file = render_into_dags_folder(config, "sync")

        log = tmp_path / "dry-run.log"
        result = finish(start_dag_test(dag_file, state, log, {"dry_run": True}), log, 180)
        assert result == {"state": "success", "tasks": {"groups": ["success", 1]}}, log.read_text()
        output = log.read_text()
        assert (
            "primary->secondary groups: 2 checkpointed group(s), would write 4 checkpoint(s), "
            "would commit 2 offset(s) of 1 group(s), skipped 1 group(s) active on secondary "
            "(dry run: nothing written)"
        ) in output
        for r in rows:  # the translation table
            line = f"{topic}-{r.partition}".ljust(30) + f" {r.committed:>10}  "
            line += f"{remote}-{r.partition}".ljust(38) + f" {r.translated:>10}  "
            assert line + "exact".ljust(17) + "  would checkpoint, would commit" in output
        assert f"skipped, with members on secondary: {live}" in output
        assert group_checkpoints(spec, group) == {}, "a dry run wrote checkpoints"
        assert target_group_offsets(secondary, group, remote) == {}, "a dry run committed"

        log = tmp_path / "run.log"
        result = finish(start_dag_test(dag_file, state, log), log, 180)
        assert result == {"state": "success", "tasks": {"groups": ["success", 1]}}, log.read_text()
        output = log.read_text()
        assert "wrote 4 checkpoint(s), committed 2 offset(s) of 1 group(s)" in output
        assert target_group_offsets(secondary, group, remote) == translated
        assert group_checkpoints(spec, group) == translated
        member.poll(0.5)
        assert target_group_offsets(secondary, live, remote) == {}  # never touched
    finally:
        member.close()
