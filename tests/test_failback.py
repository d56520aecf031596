"""The failback's pure logic: its request's checks, finding the failover it undoes (and refusing
without one), where a group resumes in a copied range, and its report rendered from a run record.
The steps themselves run against real clusters and a real Airflow in tests/test_failback_dag.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mirrorflow.dr import failback, failback_groups
from mirrorflow.errors import MirrorflowError


def request(**changes) -> failback.FailbackRequest:
    values = {"flow": "a->b", "flow_files": ("x.properties",), "run_id": "manual__1"}
    return failback.FailbackRequest(**{**values, **changes})


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"flow": "a"}, "'a' is not a flow"),
        ({"group_pattern": "("}, "group pattern '(' is not a regular expression"),
        ({"fence_principals": ("User:a b",)}, "fence principal 'User:a b' is not a principal"),
    ],
)
def test_a_bad_request_fails_in_one_line_naming_it(changes, error):
    with pytest.raises(MirrorflowError) as raised:
        request(**changes)
    assert error in str(raised.value)


def test_where_a_group_resumes_in_a_copied_range():
    runs = [[10, 100, 3], [15, 103, 2]]  # 10,11,12 -> 100..102; 15,16 -> 103,104
    assert failback_groups.via_runs(runs, 10, 17, None) == 100
    assert failback_groups.via_runs(runs, 12, 17, None) == 102
    assert failback_groups.via_runs(runs, 13, 17, None) == 103  # a gap: the next copy
    assert failback_groups.via_runs(runs, 17, 17, None) == 105  # past the last copy
    assert failback_groups.via_runs([], 5, 5, None) is None


def write_failover(tmp_path, run_id: str, started: str, held: bool = True, dry: bool = False):
    folder = tmp_path / "reports" / "failover" / run_id
    folder.mkdir(parents=True)
    steps = [
        {"step": "stop-mirror", "details": {"held": held}},
        {"step": "final-sync", "details": {"rpo": {"positions_at_cut": {"t": {"0": 5}}}}},
    ]
    data = {
        "flow": "a->b",
        "run_id": run_id,
        "started": started,
        "request": {"dry_run": dry},
        "steps": steps,
    }
    (folder / "run.json").write_text(json.dumps(data))


def test_the_failover_undone_is_the_latest_that_held_the_flow(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    with pytest.raises(MirrorflowError) as raised:
        failback.latest_failover("a->b")
    assert "no failover of a->b to fail back" in str(raised.value)
    write_failover(tmp_path, "one", "2026-01-01T00:00:00")
    write_failover(tmp_path, "two", "2026-01-02T00:00:00")
    write_failover(tmp_path, "dry", "2026-01-03T00:00:00", dry=True)
    write_failover(tmp_path, "unheld", "2026-01-04T00:00:00", held=False)
    assert failback.latest_failover("a->b")["run_id"] == "two"
    assert failback.latest_failover("a->b", "one")["run_id"] == "one"
    with pytest.raises(MirrorflowError):
        failback.latest_failover("a->b", "dry")


def test_a_failed_failover_is_not_failed_back_but_rolled_back_said_in_one_line(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    write_failover(tmp_path, "one", "2026-01-01T00:00:00")
    folder = tmp_path / "reports" / "failover" / "two"
    folder.mkdir(parents=True)
    failed = {
        "flow": "a->b",
        "run_id": "two",
        "started": "2026-01-02T00:00:00",
        "request": {"mode": "emergency", "dry_run": False, "flow_files": ["/f.properties"]},
        "steps": [{"step": "stop-mirror", "status": "failed", "details": {}}],
        "changes": [{"kind": "hold", "undo": {"reason": "failover two"}}],
    }
    (folder / "run.json").write_text(json.dumps(failed))
    with pytest.raises(MirrorflowError) as raised:
        failback.latest_failover("a->b")
    assert raised.value.message == (
        "the latest failover of a->b, run two, failed at stop-mirror: a failback undoes a "
        "failover that succeeded"
    )
    assert raised.value.hint == (
        "roll it back: mirrorflow failover /f.properties --flow 'a->b' --mode rollback "
        "--failover-run two (or the failover DAG with mode rollback and failover run two); "
        "or run the failover again, then fail back"
    )
    assert "\n" not in str(raised.value)
    # Rolled back, it is no longer the latest: the one before it is failed back.
    (folder / "run.json").write_text(json.dumps({**failed, "rolled_back": {"by": "rb"}}))
    assert failback.latest_failover("a->b")["run_id"] == "one"
    with pytest.raises(MirrorflowError, match="failover two of a->b was rolled back by run rb"):
        failback.latest_failover("a->b", "two")
    # None succeeded, yet the flow is held: said, with what to do.
    (tmp_path / "reports" / "failover" / "one" / "run.json").unlink()
    with pytest.raises(MirrorflowError) as raised:
        failback.latest_failover("a->b", held_by="failover two")
    assert (
        raised.value.message
        == "no failover of a->b succeeded, yet the flow is held ('failover two')"
    )
    assert "--mode rollback" in raised.value.hint


def test_a_report_counts_what_came_back_and_what_was_set_aside(tmp_path, monkeypatch):
    from mirrorflow.dr.report import write_report

    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    run = failback.FailbackRun(request())
    copies = [{"topic": "t", "partition": 0, "to": "t", "start": 20, "end": 28, "runs": []}]
    diverged = [{"topic": "t", "partition": 0, "to": "t.diverged.r", "start": 20, "end": 25}]
    pre = {
        "source": "a",
        "target": "b",
        "policy": "IdentityReplicationPolicy",
        "identity": True,
        "copies": copies,
        "diverged": diverged,
        "diverged_records": 5,
        "written_on_target": 8,
        "failover_run_id": "fo",
    }
    for name, details in (
        ("preflight", pre),
        ("set-aside", {"diverged": diverged, "records": 5}),
        ("reverse-copy", {"copies": copies, "written_on_target": 8, "copied": 8}),
    ):
        with run.recording(name) as record:
            record.details = details
    assert run.directory == tmp_path / "reports" / "failback" / "manual__1"
    written = write_report(run, failback.report_context(run))
    markdown = Path(written["markdown"]).read_text()
    assert markdown.startswith("# Failback of a->b: success\n")
    assert "| copied back | **8 record(s)** |" in markdown
    assert "| diverged (set aside) | **5 record(s)** |" in markdown
    assert "| `t`-0 | 20..24 | 5 | `t.diverged.r` |" in markdown
    assert "<code>t.diverged.r</code>" in Path(written["html"]).read_text()
