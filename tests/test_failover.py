"""The failover's pure logic: its request's checks, the run record its steps share, the RPO
arithmetic and the report (Markdown, HTML) rendered from a run record. The steps themselves run
against real clusters and a real Airflow in tests/test_failover_dag.py."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from mirrorflow.dr import failover, rpo
from mirrorflow.dr.report import write_report
from mirrorflow.errors import MirrorflowError

FLOW = "primary->secondary"


def request(**changes) -> failover.FailoverRequest:
    values = dict(flow=FLOW, flow_files=("mm2.properties",), run_id="manual__2026-01-01T00:00")
    return failover.FailoverRequest(**{**values, **changes})


@pytest.mark.parametrize(
    "changes, culprit",
    [
        ({"mode": "hurry"}, "failover mode 'hurry' is not one of planned, emergency, auto"),
        ({"group_pattern": "billing("}, "group pattern 'billing(' is not a regular expression"),
        ({"fence_principals": ("alice bob",)}, "fence principal 'alice bob' is not a principal"),
        ({"flow": "primary"}, "'primary' is not a flow name"),
    ],
)
def test_a_bad_request_ends_in_one_line_naming_the_culprit(changes, culprit):
    with pytest.raises(MirrorflowError) as error:
        request(**changes)
    assert str(error.value).startswith(culprit) and "\n" not in str(error.value)


def test_principals_are_named_as_kafka_names_them_and_run_ids_become_directory_names():
    assert request(fence_principals=("alice", "User:bob", "User:alice")).principals == [
        "User:alice",
        "User:bob",
    ]
    assert failover.safe_run_id("manual__2026-11-26T03:35:12.6+00:00") == (
        "manual__2026-11-26T03_35_12.6_00_00"
    )
    assert failover.safe_run_id("../..") == "run"


def test_records_behind_are_the_end_minus_the_position_or_the_log_start_without_one():
    bounds = {("t", 0): (0, 61), ("t", 1): (0, 60), ("t", 2): (40, 50), ("t", 3): (7, 7)}
    positions = {("t", 0): 50, ("t", 1): 60}
    assert rpo.records_behind(bounds, positions) == {("t", 0): 11, ("t", 2): 10}


def test_each_step_is_recorded_however_it_ends(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    run = failover.FailoverRun(request())
    with run.recording("preflight") as record:
        record.summary = "fine"
    with pytest.raises(failover.StepSkipped), run.recording("fence-producers"):
        raise failover.StepSkipped("no principal to fence")
    with pytest.raises(MirrorflowError), run.recording("catch-up"):
        raise MirrorflowError("did not catch up")
    again = failover.FailoverRun(request())  # another process reads what the steps wrote
    assert [(s["step"], s["status"], s["summary"]) for s in again.steps] == [
        ("preflight", "success", "fine"),
        ("fence-producers", "skipped", "no principal to fence"),
        ("catch-up", "failed", "did not catch up"),
    ]
    assert again.file.parent == tmp_path / "reports" / "failover" / "manual__2026-01-01T00_00"
    assert stat.S_IMODE(again.file.stat().st_mode) == 0o600


def test_a_report_shows_where_each_group_reads_the_rpo_and_what_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    run = failover.FailoverRun(request(fence_principals=("alice",)))
    run.data["mode"] = "planned"
    steps = {
        "preflight": {"source": "primary", "target": "secondary", "source_reachable": True},
        "fence-producers": {
            "acls": [{"principal": "User:alice", "topic": "orders"}],
            "applied": True,
        },
        "stop-mirror": {"held": True},
        "final-sync": {
            "committed": {"<b>billing": {"primary.orders-0": 7}},
            "active": [],
            "targets": {
                "<b>billing": [
                    {
                        "topic": "primary.orders",
                        "partition": 0,
                        "offset": 7,
                        "committed_on_source": 9,
                        "exactness": "exact",
                    }
                ]
            },
            "rpo": {
                "records": 0,
                "exact": True,
                "summary_short": "0 record(s)",
                "summary": "RPO: 0 record(s) on primary not on secondary",
                "per_partition": {},
            },
        },
    }
    for name, details in steps.items():
        with run.recording(name) as record:
            record.details = details
            if name == "fence-producers":
                run.change("fence-acl", "denied WRITE on topic orders of primary to User:alice")
            if name == "final-sync":
                run.change(
                    "group-offsets",
                    "committed offsets of group <b>billing on secondary: primary.orders-0@7",
                )
    written = write_report(run)
    markdown = Path(written["markdown"]).read_text()
    html = Path(written["html"]).read_text()
    assert markdown.startswith("# Failover of primary->secondary: success\n")
    assert "| RPO at the cut | **0 record(s)** (exact) |" in markdown
    assert "| `primary.orders` | 0 | 7 | 9 | exact |" in markdown
    assert "| fence-producers | denied WRITE on topic orders of primary to User:alice |" in markdown
    assert (
        "| final-sync | committed offsets of group <b>billing on secondary: primary.orders-0@7 |"
        in markdown
    )
    assert "<code>&lt;b&gt;billing</code>" in html and "<b>billing" not in html
    assert "group &lt;b&gt;billing on secondary" in html
    data = json.loads(Path(written["json"]).read_text())
    assert data["targets"]["<b>billing"][0]["topic"] == "primary.orders"


def test_a_failover_that_failed_early_still_gets_a_report_saying_where(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    run = failover.FailoverRun(request(mode="planned"))
    with pytest.raises(MirrorflowError), run.recording("preflight"):
        raise MirrorflowError("a planned failover needs the source primary, which is unreachable")
    markdown = Path(write_report(run)["markdown"]).read_text()
    assert markdown.startswith("# Failover of primary->secondary: failed at preflight\n")
    assert "No consumer group to fail over." in markdown
    assert "which is unreachable |" in markdown
    assert "Nothing (the run failed before changing anything)." in markdown
