"""The Prometheus alert rules and the Grafana dashboard shipped in ``monitoring/``.

The rules are checked by Prometheus's own ``promtool`` (``check rules``, then ``test rules`` on
series made for each alert: each fires for the flow it is about and for no other), the
dashboard's queries are parsed by it too, and both are read strictly here (the rules' schema,
the dashboard's panels, targets and variables). ``scripts/bootstrap.sh`` takes promtool from
Debian's prometheus package into the cache (else builds it from the Go module proxy); without
it the promtool checks skip, saying so.
That every metric they query is one a running mirror job serves is checked against a real
scrape in ``tests/test_metrics.py`` (:func:`queried_metrics`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mirrorflow import paths

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "monitoring" / "prometheus" / "mirrorflow-rules.yaml"
DASHBOARD = ROOT / "monitoring" / "grafana" / "mirrorflow-dashboard.json"
METRIC = re.compile(r"\bmirrorflow_[a-z_]+\b")
DURATION = re.compile(r"(\d+[smhd])+")
RULE_KEYS = {"alert", "expr", "for", "labels", "annotations"}
PANEL_TYPES = {"row", "timeseries", "state-timeline"}
# Grafana's variables in the dashboard's queries, as PromQL for promtool
GRAFANA_VARIABLES = {"$source": ".*", "$target": ".*", "$__rate_interval": "1m"}


def rules() -> list[dict]:
    data = yaml.safe_load(RULES.read_text())
    assert set(data) == {"groups"}, set(data)
    return [rule for group in data["groups"] for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[str]:
    """Every PromQL query of the dashboard: its panels' targets and its variables'."""
    board = dashboard()
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+), \w+\)", variable["definition"])
            assert found, variable["definition"]
            queries.append(found[1])
    return queries


def queried_metrics() -> set[str]:
    """The mirror job's metrics that the rules and the dashboard query."""
    exprs = [r["expr"] for r in rules()] + dashboard_queries()
    return {name for expr in exprs for name in METRIC.findall(expr)}


def promtool() -> str:
    """promtool on the PATH, else the one scripts/bootstrap.sh put into the cache (Debian's,
    else one built from the Go module proxy)."""
    found = shutil.which("promtool") or next(
        (str(p) for p in sorted(paths.cache_dir().glob("promtool-*/promtool"))[::-1]), None
    )
    if found is None:
        pytest.skip("no promtool: scripts/bootstrap.sh builds it where Go is installed")
    return found


def test_the_rules_file_is_strict():
    names = set()
    for rule in rules():
        assert set(rule) <= RULE_KEYS and {"alert", "expr", "labels", "annotations"} <= set(rule)
        assert re.fullmatch(r"Mirrorflow[A-Z]\w+", rule["alert"]) and rule["alert"] not in names
        names.add(rule["alert"])
        assert DURATION.fullmatch(str(rule.get("for", "0s"))), rule
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
        assert set(rule["annotations"]) == {"summary", "description"}, rule
        assert "{{" not in rule["annotations"]["description"], "descriptions are plain text"
    assert names == {
        "MirrorflowLaggingRecords",
        "MirrorflowLaggingSeconds",
        "MirrorflowStalled",
        "MirrorflowJobDown",
        "MirrorflowFailed",
        "MirrorflowCheckpointsOld",
        "MirrorflowHeartbeatOld",
    }


def test_the_dashboard_is_strict():
    board = dashboard()
    assert board["uid"] == "mirrorflow-replication" and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        assert {"x", "y", "w", "h"} == set(panel["gridPos"]) and panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"] and panel["title"] and panel.get("description"), panel
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["refId"]
            assert target["expr"].strip()
            for variable in re.findall(r"\$\w+", target["expr"]):
                assert variable in GRAFANA_VARIABLES, variable
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert panel["type"] != "timeseries" or unit, f"{panel['title']} has no unit"
    # every metric the job serves has a panel
    assert queried_metrics() >= {
        "mirrorflow_record_count_total",
        "mirrorflow_byte_count_total",
        "mirrorflow_lag_records",
        "mirrorflow_lag_seconds",
        "mirrorflow_replication_latency_ms",
        "mirrorflow_record_age_ms",
        "mirrorflow_checkpoint_latency_ms",
        "mirrorflow_checkpoint_timestamp_seconds",
        "mirrorflow_heartbeat_timestamp_seconds",
        "mirrorflow_batches_total",
        "mirrorflow_last_batch_timestamp_seconds",
        "mirrorflow_flow_state",
    }


def run(command: list[str], cwd: Path) -> str:
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_promtool_checks_the_rules_and_the_dashboards_queries(tmp_path):
    tool = promtool()
    assert "SUCCESS: 7 rules found" in run([tool, "check", "rules", str(RULES)], ROOT)
    recorded = []
    for n, expr in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        recorded.append({"record": f"mirrorflow:dashboard_query:{n}", "expr": expr})
    queries = tmp_path / "dashboard-queries.yaml"
    queries.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    assert f"SUCCESS: {len(recorded)} rules found" in run(
        [tool, "check", "rules", str(queries)], ROOT
    )


# -- promtool test rules: series for each alert, evaluated 20 minutes in ----------------------
JOB = {"job": "mirrorflow", "instance": "mirror-a:9404"}
MINUTES = 20
STEPS = MINUTES * 2  # one value every 30 s


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in {**JOB, **labels}.items())
    return {"series": f"{name}{{{text}}}", "values": values}


def flow(source: str, target: str, *, lag=0, lag_s=0, records="0+300", beat="0+30",
         checkpoint="0+30", state="RUNNING") -> list[dict[str, str]]:  # fmt: skip
    """One flow's series: partition 0's lag and count, heartbeat and checkpoint times (a
    "+30" runs with the clock: fresh), its state."""
    part = {"source": source, "target": target, "topic": f"{source}.t", "partition": "0"}
    flow_labels = {"source": source, "target": target}
    return [
        series("mirrorflow_lag_records", f"{lag}x{STEPS}", **part),
        series("mirrorflow_lag_seconds", f"{lag_s}x{STEPS}", **part),
        series("mirrorflow_record_count_total", f"{records}x{STEPS}", **part),
        series("mirrorflow_heartbeat_timestamp_seconds", f"{beat}x{STEPS}", **flow_labels),
        series("mirrorflow_checkpoint_timestamp_seconds", f"{checkpoint}x{STEPS}", **flow_labels),
        series("mirrorflow_flow_state", f"1x{STEPS}", **flow_labels, mirrorflow_flow_state=state),
    ]


def expected(alert: str, summary: str, **labels: str) -> dict:
    """An alert as it must fire: its labels (the rule's severity added) and annotations."""
    [rule] = [r for r in rules() if r["alert"] == alert]
    return {
        "exp_labels": {**labels, "severity": rule["labels"]["severity"]},
        "exp_annotations": {"summary": summary, "description": rule["annotations"]["description"]},
    }


def test_each_alert_fires_for_its_flow_and_no_other(tmp_path):
    tool = promtool()
    inputs = [
        *flow("a", "b"),  # healthy: copying, no lag, fresh heartbeats and checkpoints
        *flow("c", "d", lag=200_000, lag_s=10, records="0+1000"),
        *flow("e", "f", lag=50, lag_s=400, records="0+100"),
        *flow("g", "h", lag=10, records="500"),  # records to copy, none copied
        *flow("i", "j", beat="0", checkpoint="0", state="IDLE"),  # nothing heard since 0
        *flow("k", "l", state="FAILED"),
        series("up", f"1x{STEPS}"),
        series("up", f"0x{STEPS}", instance="mirror-z:9404"),
    ]
    stale = {"source": "i", "target": "j", **JOB}
    alerts = {
        "MirrorflowLaggingRecords": [
            expected(
                "MirrorflowLaggingRecords",
                "Flow c->d is 200k records behind",
                source="c",
                target="d",
            )
        ],
        "MirrorflowLaggingSeconds": [
            expected(
                "MirrorflowLaggingSeconds", "Flow e->f is 6m 40s behind", source="e", target="f"
            )
        ],
        "MirrorflowStalled": [
            expected("MirrorflowStalled", "Flow g->h is stalled", source="g", target="h"),
            expected("MirrorflowStalled", "Flow i->j is stalled", **stale),
        ],
        "MirrorflowJobDown": [
            expected(
                "MirrorflowJobDown",
                "The mirror job at mirror-z:9404 does not answer its scrapes",
                **{**JOB, "instance": "mirror-z:9404"},
            )
        ],
        "MirrorflowFailed": [
            expected(
                "MirrorflowFailed",
                "Flow k->l failed",
                source="k",
                target="l",
                mirrorflow_flow_state="FAILED",
                **JOB,
            )
        ],
        "MirrorflowCheckpointsOld": [
            expected("MirrorflowCheckpointsOld", "Flow i->j: no checkpoint run for 20m 0s", **stale)
        ],
        "MirrorflowHeartbeatOld": [
            expected("MirrorflowHeartbeatOld", "Flow i->j: last heartbeat 20m 0s ago", **stale)
        ],
    }
    assert set(alerts) == {r["alert"] for r in rules()}, "a test for every alert"
    unit = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": inputs,
                "alert_rule_test": [
                    {"eval_time": f"{MINUTES}m", "alertname": name, "exp_alerts": fired}
                    for name, fired in alerts.items()
                ]
                # and at the start only what needs no time: a failed flow
                + [
                    {"eval_time": "0m", "alertname": name, "exp_alerts": fired if not wait else []}
                    for name, fired in alerts.items()
                    for wait in [next(r.get("for") for r in rules() if r["alert"] == name)]
                ],
            }
        ],
    }
    tests = tmp_path / "mirrorflow-rules.test.yaml"
    tests.write_text(yaml.safe_dump(unit, sort_keys=False))
    assert "SUCCESS" in run([tool, "test", "rules", str(tests)], tmp_path)
