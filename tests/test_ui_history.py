"""The history of DR runs read from report files (pure logic on a temporary state directory):
newest first, every kind read generically (a failover's report as ``mirrorflow.dr.report``
writes it, a drill's and a failback's with other spellings, a broken one), and a run found only
by names listed on disk, never by a path from a request."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mirrorflow.health.history import find_report, history


def write_run(state: Path, kind: str, run: str, data: object, html: bool = True) -> Path:
    directory = state / "reports" / kind / run
    directory.mkdir(parents=True)
    text = data if isinstance(data, str) else json.dumps(data)
    (directory / "report.json").write_text(text)
    if html:
        (directory / "report.html").write_text(f"<h1>{kind} {run}</h1>")
    return directory


FAILOVER = {  # the keys mirrorflow.dr.report writes
    "flow": "primary->secondary",
    "run_id": "manual__2026-11-26T01:00:00+00:00",
    "request": {"mode": "auto", "dry_run": True},
    "mode": "planned",
    "dry_run": True,
    "started": "2026-11-26T01:00:00.5+00:00",
    "status": "success",
    "rpo": {"records": 0, "exact": True, "summary_short": "0 record(s)"},
}


def test_runs_of_every_kind_newest_first_read_generically(tmp_path):
    write_run(tmp_path, "failover", "manual__2026-11-26T01_00_00_00_00", FAILOVER)
    write_run(
        tmp_path,
        "failover",
        "cli__2",
        {
            **FAILOVER,
            "started": "2026-11-26T03:00:00+00:00",
            "status": "failed at catch-up",
            "mode": "emergency",
            "dry_run": False,
            "rpo": {"records": 21, "exact": False},
        },
    )
    write_run(  # a drill as another engineer may write it
        tmp_path,
        "drill",
        "scheduled__x",
        {
            "flow": "secondary->primary",
            "started_at": "2026-11-26T02:00:00Z",
            "passed": True,
            "rpo_records": 3,
            "rto_seconds": 12.25,
        },
        html=False,
    )
    broken_dir = write_run(tmp_path, "failback", "broken", "{not json")
    os.utime(broken_dir / "report.json", (1764115200, 1764115200))  # 2025-11-26T00:00Z
    (tmp_path / "reports" / "drill" / "no-report").mkdir()  # a run still in progress

    runs = history(tmp_path)
    assert [(r.kind, r.run) for r in runs][:3] == [
        ("failover", "cli__2"),
        ("drill", "scheduled__x"),
        ("failover", "manual__2026-11-26T01_00_00_00_00"),
    ]
    latest, drill, first, broken = runs
    assert (latest.mode, latest.result, latest.ok, latest.dry_run, latest.rpo) == (
        "emergency",
        "failed at catch-up",
        False,
        False,
        "21 record(s) or more",
    )
    assert (first.flow, first.mode, first.ok, first.dry_run, first.rpo, first.rto) == (
        "primary->secondary",
        "planned",
        True,
        True,
        "0 record(s)",
        None,
    )
    assert first.started == "2026-11-26T01:00:00+00:00" and first.has_html
    assert (drill.flow, drill.result, drill.ok, drill.rpo, drill.rto, drill.has_html) == (
        "secondary->primary",
        "passed",
        True,
        "3 record(s)",
        "12.2 s",
        False,
    )
    assert drill.started == "2026-11-26T02:00:00+00:00"
    # An unreadable report still shows (by its file's time), saying so.
    assert (broken.kind, broken.ok, broken.flow) == ("failback", False, None)
    assert broken.result.startswith("report.json unreadable") and broken.started is None


def test_a_report_is_found_only_among_the_runs_listed(tmp_path):
    state = tmp_path / "state"
    run = write_run(state, "failover", "cli__1", FAILOVER)
    secret = tmp_path / "secret.html"
    secret.write_text("secret")
    assert find_report(state, "failover", "cli__1") == run / "report.html"
    assert find_report(state, "failover", "cli__1", "report.json") == run / "report.json"
    for kind, name in (
        ("failover", "../../../secret.html"),
        ("failover", ".."),
        ("..", "secret.html"),
        ("failover", "cli__1/../cli__1"),
        ("drill", "cli__1"),
        ("failover", "cli__2"),
        ("", ""),
    ):
        assert find_report(state, kind, name) is None, (kind, name)
    # A symlinked run directory is not followed.
    (state / "reports" / "failover" / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "report.json").write_text("{}")
    assert find_report(state, "failover", "elsewhere", "secret.html") is None
    assert [r.run for r in history(state)] == ["cli__1"]
    assert history(tmp_path / "nothing") == []


def test_a_flows_partitions_from_progress_and_an_unreachable_target_in_one_note(tmp_path):
    import time

    from mirrorflow.health.detail import flow_detail, partitions

    progress = {
        "source_end_offsets": {"t1": {"0": 10, "1": 5, "10": 3}},
        "source_positions": {"t1": {"0": 7, "1": 5}, "t2": {"0": 4}},
    }
    assert partitions(progress) == [
        {"topic": "t1", "partition": 0, "end": 10, "position": 7, "lag": 3},
        {"topic": "t1", "partition": 1, "end": 5, "position": 5, "lag": 0},
        {"topic": "t1", "partition": 10, "end": 3, "position": None, "lag": None},
    ]  # t2 has a position but the job's last plan had no such topic: not the flow's now
    before_any_plan = {"source_positions": progress["source_positions"]}
    assert [(r["topic"], r["partition"]) for r in partitions(before_any_plan)] == [
        ("t1", 0),
        ("t1", 1),
        ("t2", 0),
    ]
    assert partitions({}) == []
    flows = tmp_path / "flows"
    (flows / "a-b").mkdir(parents=True)
    (flows / "a-b" / "progress.json").write_text(json.dumps(progress))
    config = tmp_path / "mm2.properties"
    config.write_text(
        "clusters = a, b\n"
        "a.bootstrap.servers = 127.0.0.1:1\n"
        "b.bootstrap.servers = 127.0.0.1:1\n"
        "a->b.enabled = true\n"
        "a->b.topics = t.*\n"
    )
    started = time.monotonic()
    detail = flow_detail([config], "a->b", flows, timeout_s=2)
    assert time.monotonic() - started < 6, "the page waited past its bound"
    assert detail["groups"] == {} and detail["checkpoints_topic"] == "a.checkpoints.internal"
    assert detail["note"].startswith("b did not answer within 2s"), detail["note"]
    assert detail["topics"] == [{"topic": "t1", "remote": "a.t1", "partitions": 3, "lag": 3}]
    # A flow that is not in the files: a note, the partitions still shown.
    other = flow_detail([config], "b->a", flows)
    assert other["note"] and other["partitions"] == []


def test_the_history_in_pages_newest_first(tmp_path):
    import pytest

    from mirrorflow.health.history import MAX_PAGE_SIZE, paginate

    for i in range(7):
        write_run(tmp_path, "drill", f"r{i}", {"flow": "a->b", "started": f"2026-11-26T0{i}:00Z"})
    runs = history(tmp_path)
    assert [r.run for r in runs] == [f"r{i}" for i in range(6, -1, -1)]
    pages = [paginate(runs, n, 3) for n in (1, 2, 3, 4)]
    assert [[r.run for r in p.runs] for p in pages] == [
        ["r6", "r5", "r4"],
        ["r3", "r2", "r1"],
        ["r0"],
        [],
    ]
    assert [(p.newer, p.older) for p in pages] == [(None, 2), (1, 3), (2, None), (3, None)]
    assert {(p.total, p.pages, p.limit) for p in pages} == {(7, 3, 3)}
    empty = paginate([], 1, 5)
    assert (empty.runs, empty.pages, empty.newer, empty.older) == ([], 1, None, None)
    assert paginate(runs, 1, MAX_PAGE_SIZE).as_dict()["older_page"] is None
    for page, limit in ((0, 3), (1, 0), (1, MAX_PAGE_SIZE + 1)):
        with pytest.raises(ValueError):
            paginate(runs, page, limit)
