"""The DR workflows' shared step plumbing (mirrorflow.dr.steps) and the failover's pure logic:
each workflow's steps are registered under its DAG's task ids, a DAG run's Params become its
request (defaulted as the request itself and the command default them), a run of every step
skips, fails and always-runs as the DAG's trigger rules do, a run that failed at its first step
still gets its report, the ledger is on disk the moment a change is made (a step that then fails
still reports it), the bounds on the oldest uncopied record's age, the stop-mirror's reading of
progress.json's time, and a rollback's choice of run, refusals and release of exactly that run's
hold. The steps against real clusters and a real Airflow are in
tests/test_{failover,failback,drill}_dag.py."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from mirrorflow.cli import build_parser
from mirrorflow.dr import failover, request, rpo, steps
from mirrorflow.dr.records import hold_reason
from mirrorflow.errors import MirrorflowError
from mirrorflow.runtime import jobs

DAGS = Path(__file__).parent.parent / "dags"
FIXED = {"flow": "primary->secondary", "flow_files": ("x.properties",), "run_id": "manual__1"}


@pytest.mark.parametrize("kind", ["failover", "failback", "drill"])
def test_every_step_of_each_workflow_is_registered_in_its_dags_order(kind):
    workflow = steps.workflow(kind)
    assert workflow.kind == kind and workflow.steps[0] == "preflight"
    assert workflow.steps[-1] == "report"
    assert set(workflow.functions) == set(workflow.steps)
    # the committed rendering (fresh: test_dag_render), its tasks from the registry
    dag = (DAGS / f"{kind}__primary__secondary.py").read_text()
    assert [s for s in workflow.steps if f'("{s}", ' in dag] == list(workflow.steps)


def test_a_dag_runs_params_become_its_request():
    over = steps.workflow("failover").request_class.from_params(
        {"fence_principals": "alice, User:bob", "catch_up_timeout_seconds": 5}, **FIXED
    )
    assert (over.mode, over.catch_up_timeout_s, over.stop_timeout_s) == ("planned", 5.0, 30.0)
    assert over.principals == ["User:alice", "User:bob"]
    back = steps.workflow("failover").request_class.from_params(
        {"mode": "rollback", "failover_run": "fo-1", "stop_timeout_seconds": 3}, **FIXED
    )
    assert (back.mode, back.failover_run_id, back.stop_timeout_s) == ("rollback", "fo-1", 3.0)
    failback = steps.workflow("failback").request_class.from_params(
        {"failover_run_id": "fo-1", "dry_run": True}, **FIXED
    )
    assert (failback.failover_run_id, failback.dry_run, failback.mode) == ("fo-1", True, "failback")
    drill = steps.workflow("drill").request_class.from_params({"rate": 50}, **FIXED)
    assert (drill.mode, drill.rate, drill.canaries) == ("non-destructive", 50, 100)
    with pytest.raises(MirrorflowError, match="group pattern '\\(' is not a regular expression"):
        steps.workflow("failback").request_class.from_params({"group_pattern": "("}, **FIXED)


@pytest.mark.parametrize("kind", ["failover", "failback"])
def test_a_request_defaults_each_option_as_its_params_and_its_command_do(kind):
    """A request built without an option, one from a DAG run's empty Params and one from the
    command without the option agree (the failover's mode once defaulted to auto in the request,
    to planned in the Params and the command); the failover DAG's Param says planned too."""
    request_class = steps.workflow(kind).request_class
    built = request_class(**FIXED)
    from_params = request_class.from_params({}, **FIXED)
    args = build_parser().parse_args([kind, "x.properties", "--flow", FIXED["flow"]])
    for name, (_param, convert, default) in request_class.PARAMS.items():
        from_cli = getattr(args, name)
        from_cli = tuple(from_cli) if isinstance(from_cli, list) else from_cli
        assert getattr(built, name) == getattr(from_params, name) == convert(default), name
        assert from_cli == getattr(built, name), name
    if kind == "failover":
        dag = (DAGS / "failover__primary__secondary.py").read_text()
        param = re.search(r'"mode": Param\(\s*"([^"]+)"', dag)
        assert param is not None
        assert built.mode == from_params.mode == args.mode == param.group(1) == "planned"


@dataclass(frozen=True)
class ToyRequest(request.DRRequest):
    fail_at: str = ""

    def record(self) -> dict:
        return {"fail_at": self.fail_at}


class ToyRun(steps.Run):
    KIND = "toy"


TOY = steps.Workflow(ToyRun, ToyRequest, ("one", "two", "three", "cleanup"), always=("cleanup",))


def _toy_step(name: str, skip: bool = False) -> None:
    @TOY.step(name)
    def body(request, run, record, log) -> None:
        if skip:
            raise steps.StepSkipped(f"{name} does not apply")
        if request.fail_at == name:
            raise MirrorflowError(f"{name} broke", "fix it")
        record.details, record.summary = {"seen": name}, f"{name} done"
        run.event(f"{name} ran")


for _name, _skip in (("one", False), ("two", True), ("three", False), ("cleanup", False)):
    _toy_step(_name, _skip)


def test_a_run_skips_steps_ends_at_a_failure_and_still_runs_what_always_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    lines: list[str] = []
    assert TOY.functions["one"](ToyRequest(**FIXED), log=lines.append) == {
        "step": "one",
        "seen": "one",
        "summary": "one done",
    }
    with pytest.raises(MirrorflowError) as failed:
        TOY.run_all(ToyRequest(**{**FIXED, "run_id": "r2"}, fail_at="one"), log=lines.append)
    assert failed.value.message == "toy of primary->secondary failed: one broke"
    assert failed.value.hint == f"fix it; report: {tmp_path / 'reports/toy/r2/report.md'}"
    record = json.loads((tmp_path / "reports" / "toy" / "r2" / "run.json").read_text())
    assert [(s["step"], s["status"]) for s in record["steps"]] == [
        ("one", "failed"),
        ("cleanup", "success"),
    ]
    assert record["request"] == {"fail_at": "one", "flow_files": ["x.properties"]}
    assert [e["event"] for e in record["timeline"]] == ["cleanup ran"]
    run = TOY.run_all(ToyRequest(**{**FIXED, "run_id": "r3"}), log=lines.append)
    assert [(s["step"], s["status"]) for s in run.steps] == [
        ("one", "success"),
        ("two", "skipped"),
        ("three", "success"),
        ("cleanup", "success"),
    ]
    assert (
        "two: skipped: two does not apply" in lines and "one: failed: one broke (fix it)" in lines
    )


@pytest.mark.parametrize("kind", ["failover", "failback", "drill"])
def test_a_run_that_failed_at_its_preflight_gets_its_report(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    workflow = steps.workflow(kind)
    request = workflow.request_class(**{**FIXED, "flow_files": (str(tmp_path / "none"),)})
    with pytest.raises(MirrorflowError, match="flow file\\(s\\) not found"):
        workflow.functions["preflight"](request, log=lambda _line: None)
    lines: list[str] = []
    result = workflow.report(request, log=lines.append)
    assert result["failed_steps"] == ["preflight"]
    markdown = Path(result["markdown"]).read_text()
    assert "failed at preflight" in markdown.splitlines()[0]
    assert lines[-1] == f"{kind} report: {result['markdown']} (and report.html, report.json)"
    assert Path(result["json"]).parent == tmp_path / "reports" / kind / "manual__1"


def test_a_change_is_on_disk_when_made_and_reported_when_the_step_then_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    request = failover.FailoverRequest(**FIXED, mode="emergency")
    run = failover.FailoverRun(request)
    with (
        pytest.raises(MirrorflowError, match="the job did not stop"),
        run.recording("stop-mirror"),
    ):
        run.change("hold", "held primary->secondary paused", undo={"reason": "failover x"})
        on_disk = json.loads(run.file.read_text())  # saved before the step goes on
        assert [(c["step"], c["kind"], c["dry_run"]) for c in on_disk["changes"]] == [
            ("stop-mirror", "hold", False)
        ]
        assert on_disk["changes"][0]["undo"] == {"reason": "failover x"}
        raise MirrorflowError("the job did not stop")
    result = failover.report(request, log=lambda _line: None)
    assert result["failed_steps"] == ["stop-mirror"]
    data = json.loads(Path(result["json"]).read_text())
    assert data["status"] == "failed at stop-mirror"
    assert [c["what"] for c in data["changes"]] == ["held primary->secondary paused"]
    markdown = Path(result["markdown"]).read_text()
    assert "## What was changed" in markdown and "| held primary-&gt;" not in markdown
    assert "| stop-mirror | held primary->secondary paused |" in markdown
    assert "held primary-&gt;secondary paused" in Path(result["html"]).read_text()
    # A dry run's ledger says what it would change, marked so.
    dry = failover.FailoverRequest(**{**FIXED, "run_id": "dry"}, dry_run=True)
    run = failover.FailoverRun(dry)
    with run.recording("stop-mirror"):
        run.change("hold", "would hold primary->secondary paused")
    assert run.changes[0]["dry_run"] is True
    markdown = Path(failover.report(dry, log=lambda _line: None)["markdown"]).read_text()
    assert "## What it would change (dry run: nothing was changed)" in markdown


def test_the_oldest_uncopied_record_was_written_between_two_observations():
    history = [[1000, 5], [2000, 8], [3000, 8], [4000, 12]]
    # At position 8 the record at offset 8 did not exist at 3000 (end 8), did at 4000.
    assert rpo.oldest_uncopied_written(history, 8) == (3000, 4000)
    assert rpo.oldest_uncopied_written(history, 5) == (1000, 2000)
    assert rpo.oldest_uncopied_written(history, 6) == (1000, 2000)
    # The first entry past the position: written before it, after an unknown time.
    assert rpo.oldest_uncopied_written(history, 2) == (None, 1000)
    # Never seen past the position: nothing uncopied known.
    assert rpo.oldest_uncopied_written(history, 12) == (4000, None)
    assert rpo.oldest_uncopied_written([], 3) == (None, None)


def test_stop_mirror_reads_the_jobs_time_to_the_millisecond_and_old_whole_seconds():
    held_at = 1_700_000_010.4567  # 10.456 s past the minute, in ms
    assert failover.written_since("2023-11-14T22:13:30.457+00:00", held_at)
    assert failover.written_since("2023-11-14T22:13:30.456+00:00", held_at)
    assert not failover.written_since("2023-11-14T22:13:30.455+00:00", held_at)
    # An older job's whole second, truncated: from that second on (no -1 s fudge).
    assert failover.written_since("2023-11-14T22:13:30+00:00", held_at)
    assert not failover.written_since("2023-11-14T22:13:29+00:00", held_at)
    assert not failover.written_since(None, held_at)


def _failover_record(run_id: str, started: str, **extra) -> dict:
    steps_ = extra.pop("steps", [{"step": "preflight", "status": "success"}])
    return {
        "flow": "primary->secondary",
        "run_id": run_id,
        "started": started,
        "request": {"mode": extra.pop("mode", "planned"), "dry_run": extra.pop("dry", False)},
        "steps": steps_,
        "changes": extra.pop("changes", []),
        **extra,
    }


HOLD = {"kind": "hold", "undo": {"reason": "failover held", "paused_created": True}}
FENCE = {"kind": "fence-acl", "undo": {"principal": "User:alice", "topic": "orders"}}
FAILED = [{"step": "stop-mirror", "status": "failed"}]


def test_a_rollback_undoes_the_run_that_holds_the_flow_and_refuses_what_it_cannot():
    choose = failover.choose_rollback
    flow = "primary->secondary"
    runs = [
        _failover_record("fenced", "2026-01-01", changes=[FENCE]),
        _failover_record("held", "2026-01-02", changes=[FENCE, HOLD], steps=FAILED),
        _failover_record("dry", "2026-01-03", dry=True),
        _failover_record("rb", "2026-01-04", mode="rollback"),
    ]
    assert choose(runs, flow, "", "failover held")["run_id"] == "held"  # the hold's run
    assert choose(runs, flow, "", None)["run_id"] == "held"  # else the latest with fences
    assert choose(runs[:1], flow, "", "failover other")["run_id"] == "fenced"
    assert choose(runs, flow, "fenced", None)["run_id"] == "fenced"
    refusals = [
        (runs, "dry", None, [], "failover dry of primary->secondary was a dry run"),
        (runs, "rb", None, [], "run rb of primary->secondary is a rollback run, not a failover"),
        (runs, "nope", None, [], "no failover run nope of primary->secondary to roll back"),
        (runs[2:], "", None, [], "no failover of primary->secondary to roll back: it is not"),
        (
            [_failover_record("x", "1", rolled_back={"by": "rb"})],
            "x",
            None,
            [],
            "failover x of primary->secondary was rolled back already, by run rb",
        ),
    ]
    back = {
        "run_id": "fb",
        "request": {"dry_run": False},
        "steps": [{"step": "preflight", "status": "success", "details": {"failover_run_id": "x"}}],
        "changes": [{"kind": "records-copied"}],
    }
    succeeded = [_failover_record("x", "1", changes=[HOLD])]
    refusals.append(
        (
            succeeded,
            "x",
            None,
            [back],
            "failover x of primary->secondary succeeded and was failed back by run fb",
        )
    )
    partly = {**back, "steps": [*back["steps"], {"step": "resume", "status": "failed"}]}
    refusals.append((succeeded, "x", None, [partly], "is being failed back: failback fb failed"))
    for records, run_id, held_by, failbacks, message in refusals:
        with pytest.raises(MirrorflowError) as refused:
            choose(records, flow, run_id, held_by, failbacks)
        assert str(refused.value).startswith(message) or message in str(refused.value), str(
            refused.value
        )
        assert "\n" not in str(refused.value)


def test_a_rollback_releases_exactly_its_runs_hold_and_marks_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    flows = tmp_path / "flows"
    held = failover.FailoverRequest(**{**FIXED, "run_id": "fo-1"}, state_dir=str(flows))
    flow_dir = held.flow_dir()
    run = failover.FailoverRun(held)
    with pytest.raises(MirrorflowError), run.recording("stop-mirror"):
        jobs.hold(flow_dir, hold_reason("fo-1"))
        run.change(
            "hold",
            "held",
            undo={"reason": hold_reason("fo-1"), "paused_created": True},
        )
        raise MirrorflowError("the mirror job did not pause it")
    failover.report(held, log=lambda _line: None)
    lines: list[str] = []
    rollback = failover.FailoverRequest(
        **{**FIXED, "run_id": "rb-1"}, mode="rollback", state_dir=str(flows)
    )
    done = failover.run_all(rollback, log=lines.append)
    assert [(s["step"], s["status"]) for s in done.steps] == [
        *((s, "skipped") for s in failover.STEPS[:5]),
        ("rollback", "success"),
        ("measure-rpo", "skipped"),
        ("report", "success"),
    ]
    assert jobs.held(flow_dir) is None and not (flow_dir / jobs.PAUSED_FILE).exists()
    assert [c["kind"] for c in done.changes] == ["hold-released", "unpaused", "record-amended"]
    marked = json.loads(run.file.read_text())["rolled_back"]
    assert marked["by"] == "rb-1" and marked["released"] == [
        "the hold of primary->secondary",
        "the paused file of primary->secondary",
    ]
    report = (run.directory / "report.md").read_text()
    assert report.startswith(
        "# Failover of primary->secondary: failed at stop-mirror (rolled back by rb-1)"
    )
    assert "The group offsets it committed stay" in report
    assert failover.OFFSETS_KEPT in (done.directory / "report.md").read_text()
    # Again: refused in one line (rolled back already, by rb-1).
    again = failover.FailoverRequest(
        **{**FIXED, "run_id": "rb-2"}, mode="rollback", failover_run_id="fo-1", state_dir=str(flows)
    )
    with pytest.raises(MirrorflowError, match="was rolled back already, by run rb-1"):
        failover.run_all(again, log=lines.append)
    # A hold that is another's, and a paused file that was there before, stay.
    jobs.hold(flow_dir, "failover someone-else")
    other = failover.FailoverRun(failover.FailoverRequest(**{**FIXED, "run_id": "fo-3"}))
    with other.recording("stop-mirror"):
        other.change("hold", "held", undo={"reason": "failover fo-3", "paused_created": False})
    third = failover.FailoverRequest(
        **{**FIXED, "run_id": "rb-3"}, mode="rollback", failover_run_id="fo-3", state_dir=str(flows)
    )
    done = failover.run_all(third, log=lines.append)
    assert jobs.held(flow_dir) == "failover someone-else"
    assert (flow_dir / jobs.PAUSED_FILE).exists()
    assert done.details("rollback")["kept"] == [
        "the hold of primary->secondary: its hold is another's ('failover someone-else')"
    ]


def test_a_measurement_takes_the_latest_failover_that_recorded_its_cut():
    flow = "primary->secondary"
    final = {"step": "final-sync", "details": {"rpo": {"positions_at_cut": {"t": {"0": 5}}}}}
    runs = [
        _failover_record("one", "1", steps=[final]),
        _failover_record("two", "2", steps=[final]),
        _failover_record("drill", "3", steps=[final], rolled_back={"by": "d"}),
        _failover_record("dry", "4", steps=[final], dry=True),
        _failover_record("cut-less", "5", steps=FAILED),
    ]
    assert failover.choose_measured(runs, flow, "")["run_id"] == "two"
    assert failover.choose_measured(runs, flow, "one")["run_id"] == "one"
    assert failover.choose_measured(runs, flow, "drill")["run_id"] == "drill"
    with pytest.raises(MirrorflowError, match="no failover of primary->secondary with run id dry"):
        failover.choose_measured(runs, flow, "dry")


def test_a_rollback_puts_back_the_hold_its_failover_had_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_STATE", str(tmp_path))
    flows = str(tmp_path / "flows")
    first = failover.FailoverRequest(**{**FIXED, "run_id": "fo-a"}, state_dir=flows)
    flow_dir = first.flow_dir()
    jobs.hold(flow_dir, hold_reason("fo-a"))  # a failover that succeeded holds it
    again = failover.FailoverRun(failover.FailoverRequest(**{**FIXED, "run_id": "fo-b"}))
    with pytest.raises(MirrorflowError), again.recording("stop-mirror"):
        jobs.hold(flow_dir, hold_reason("fo-b"))
        again.change(
            "hold",
            "held",
            undo={
                "reason": hold_reason("fo-b"),
                "paused_created": False,
                "replaced": hold_reason("fo-a"),
            },
        )
        raise MirrorflowError("the mirror job did not pause it")
    rollback = failover.FailoverRequest(
        **{**FIXED, "run_id": "rb"}, mode="rollback", state_dir=flows
    )
    done = failover.run_all(rollback, log=lambda _line: None)
    assert done.details("rollback")["failover_run_id"] == "fo-b"
    assert jobs.held(flow_dir) == "failover fo-a" and (flow_dir / jobs.PAUSED_FILE).exists()
