"""The DR workflows' shared step plumbing (mirrorflow.dr.steps), pure logic: each workflow's steps
are registered under its DAG's task ids, a DAG run's Params become its request, a run of every
step skips, fails and always-runs as the DAG's trigger rules do, and a run that failed at its
first step still gets its report. The steps against real clusters and a real Airflow are in
tests/test_{failover,failback,drill}_dag.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from mirrorflow.dr import steps
from mirrorflow.errors import MirrorflowError

FIXED = {"flow": "primary->secondary", "flow_files": ("x.properties",), "run_id": "manual__1"}


@pytest.mark.parametrize("kind", ["failover", "failback", "drill"])
def test_every_step_of_each_workflow_is_registered_in_its_dags_order(kind):
    workflow = steps.workflow(kind)
    assert workflow.kind == kind and workflow.steps[0] == "preflight"
    assert workflow.steps[-1] == "report"
    assert set(workflow.functions) == set(workflow.steps)
    dag = (Path(__file__).parent.parent / "templates" / f"{kind}_dag.py.j2").read_text()
    assert [s for s in workflow.steps if f'("{s}", ' in dag] == list(workflow.steps)


def test_a_dag_runs_params_become_its_request():
    failover = steps.workflow("failover").request_class.from_params(
        {"fence_principals": "alice, User:bob", "catch_up_timeout_seconds": 5}, **FIXED
    )
    assert (failover.mode, failover.catch_up_timeout_s) == ("planned", 5.0)
    assert failover.principals == ["User:alice", "User:bob"]
    failback = steps.workflow("failback").request_class.from_params(
        {"failover_run_id": "fo-1", "dry_run": True}, **FIXED
    )
    assert (failback.failover_run_id, failback.dry_run, failback.mode) == ("fo-1", True, "failback")
    drill = steps.workflow("drill").request_class.from_params({"rate": 50}, **FIXED)
    assert (drill.mode, drill.rate, drill.canaries) == ("non-destructive", 50, 100)
    with pytest.raises(MirrorflowError, match="group pattern '\\(' is not a regular expression"):
        steps.workflow("failback").request_class.from_params({"group_pattern": "("}, **FIXED)


@dataclass(frozen=True)
class ToyRequest(steps.DRRequest):
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
