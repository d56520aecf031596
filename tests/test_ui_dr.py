"""The plugin's history of failovers and drills and its trigger buttons, against a real
api-server and dag-processor, the sandbox clusters, a real failover dry run (``mirrorflow
failover --dry-run``) and a real browser (Debian's Chromium driven by Playwright): every new
route refuses anonymous and forged requests and serves only reports that exist; a logged-in user
sees the failover in the history with its mode, result and RPO and opens its report; the
buttons create real DAG runs of the failover DAG through Airflow's REST API as that user (a dry
run by default, a real one only after a confirmation), and Airflow refuses a viewer's.
Screenshots go to ``$MIRRORFLOW_TEST_ARTEFACTS/ui`` (else the test's temporary folder)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirrorflow.devtools.local_airflow import UI_USER, LocalAirflow
from tests.conftest import create_topics
from tests.mirror_harness import flow_file, produce, run_mirror_once
from tests.test_least_privilege import commit
from tests.ui_harness import (
    CHROMIUM,
    CHROMIUM_ARGS,
    VIEWER,
    AirflowWithViewer,
    artefacts_dir,
    fetch,
    goto,
    login,
    plugin_get_routes,
    render_dags,
    require_chromium,
    running_airflow,
    runs_of,
    token_of,
    trigger_with_buttons,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.airflow]

ROOT = Path(__file__).resolve().parent.parent
FLOW = "primary->secondary"
FAILOVER_DAG = "failover__primary__secondary"


@pytest.fixture(scope="module")
def airflow_dr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowWithViewer]:
    """A real api-server (with the plugin) and dag-processor; no scheduler, so a triggered run
    stays queued and changes nothing (the failover DAG is created unpaused)."""
    base = tmp_path_factory.mktemp("ui-dr")
    with running_airflow(base, ("api-server", "dag-processor"), AirflowWithViewer) as airflow:
        yield airflow


def failover_dry_run(config: Path, airflow: LocalAirflow) -> str:
    """``mirrorflow failover --dry-run`` of the flow with the api-server's state; the run id."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mirrorflow.cli",
            "failover",
            str(config),
            "--flow",
            FLOW,
            "--dry-run",
            "--catch-up-timeout",
            "60",
            "--state-dir",
            str(airflow.state / "flows"),
            "--run-id",
            "cli__ui-history",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "MIRRORFLOW_STATE": str(airflow.state), "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return "cli__ui-history"


def commit_and_checkpoint(cluster, config: Path, topic: str, group: str, offsets: dict) -> None:
    """``group`` commits ``offsets`` of ``topic`` on the source, and ``mirrorflow sync-groups
    --checkpoints-only`` writes its checkpoints to the target."""
    commit(cluster, group, {(topic, p): o for p, o in offsets.items()})
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mirrorflow.cli",
            "sync-groups",
            str(config),
            "--flow",
            FLOW,
            "--checkpoints-only",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_history_and_trigger_buttons(airflow_dr: AirflowWithViewer, sandbox, topic_name, tmp_path):
    require_chromium()
    from playwright.sync_api import sync_playwright

    shots = artefacts_dir(tmp_path)
    airflow = airflow_dr
    primary = sandbox["primary"]
    topic = topic_name("uidr")
    create_topics(primary, topic, partitions=2)
    produce(primary, topic, 2, 40)
    config = flow_file(tmp_path, sandbox, topic)
    render_dags(config, airflow)
    run_mirror_once(config, FLOW, airflow.state / "flows")
    group = f"{topic}-readers"
    commit_and_checkpoint(primary, config, topic, group, {0: 15, 1: 10})
    run = failover_dry_run(config, airflow)
    admin = token_of(airflow, UI_USER)
    viewer = token_of(airflow, VIEWER)

    # Every route refuses anonymous and forged requests; reports only of runs that exist.
    base = f"http://127.0.0.1:{airflow.port}/mirrorflow"
    routes = [
        r.replace("{kind}", "failover")
        .replace("{run}", run)
        .replace("{source}", "primary")
        .replace("{target}", "secondary")
        for r in plugin_get_routes()
    ]
    assert set(routes) >= {
        "/history",
        "/api/history",
        f"/reports/failover/{run}",
        "/flows/primary/secondary",
        "/api/flows/primary/secondary",
    }, routes
    for route in routes:
        for headers in (
            {},
            {"Accept": "application/json"},
            {"Authorization": "Bearer not-a-token"},
            {"Cookie": "_token=not-a-token"},
        ):
            status, body, _ = fetch(base + route, headers)
            assert status in (401, 403), (route, headers, status, body[:200])
            assert "primary" not in body, "a refused request saw a flow"
        status, body, _ = fetch(base + route, {"Authorization": f"Bearer {admin}"})
        assert status == 200 and "primary" in body, (route, status, body[:300])
    status, _, headers = fetch(
        f"{base}/reports/failover/{run}", {"Authorization": f"Bearer {viewer}"}
    )
    assert status == 200 and "default-src 'none'" in headers["content-security-policy"]
    (airflow.state / "secret.html").write_text("not a report")
    for path in (
        "/reports/failover/nope",
        "/reports/failover/..%2F..%2Fsecret.html",
        "/reports/..%2Fsecret.html/x",
        f"/reports/drill/{run}",
        "/reports/failover/%2E%2E",
        "/flows/primary/tertiary",
        "/api/flows/..%2F..%2Fsecret.html/x",
    ):
        status, body, _ = fetch(base + path, {"Authorization": f"Bearer {admin}"})
        assert status == 404 and "not a report" not in body, (path, status, body[:200])
    [entry] = json.loads(fetch(f"{base}/api/history", {"Authorization": f"Bearer {admin}"})[1])[
        "runs"
    ]
    assert (entry["kind"], entry["run"], entry["flow"], entry["mode"], entry["result"]) == (
        "failover",
        run,
        FLOW,
        "planned",
        "success",
    )
    assert entry["rpo"] == "0 record(s)" and entry["dry_run"] is True

    # The flow's detail: lag per partition, topics, the group's last checkpoints on the target.
    _, body, _ = fetch(f"{base}/api/flows/primary/secondary", {"Authorization": f"Bearer {admin}"})
    detail = json.loads(body)
    # (The flow also replicates `heartbeats` where an earlier test's flow into primary made it.)
    mine = [r for r in detail["partitions"] if r["topic"] == topic]
    assert [(r["partition"], r["end"], r["position"], r["lag"]) for r in mine] == [
        (0, 20, 20, 0),
        (1, 20, 20, 0),
    ], detail["partitions"]
    assert {r["topic"] for r in detail["partitions"]} <= {topic, "heartbeats"}
    assert [t for t in detail["topics"] if t["topic"] == topic] == [
        {"topic": topic, "remote": f"primary.{topic}", "partitions": 2, "lag": 0}
    ]
    assert detail["note"] is None, detail["note"]
    assert [(c["topic"], c["partition"], c["offset"]) for c in detail["groups"][group]] == [
        (f"primary.{topic}", 0, 15),
        (f"primary.{topic}", 1, 10),
    ]
    assert [r["run"] for r in detail["runs"]] == [run]

    airflow.wait_for_dags(airflow.api(), [FAILOVER_DAG])
    assert runs_of(airflow, admin, FAILOVER_DAG) == {}
    ui = f"http://127.0.0.1:{airflow.port}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = login(browser, airflow, "/mirrorflow/history", UI_USER, airflow.ui_password())
            row = page.locator(f'#history tr[data-kind="failover"][data-run="{run}"]')
            cells = row.locator("td").all_inner_texts()
            assert cells[1:7] == [
                "failover dry run",
                FLOW,
                "planned",
                "success",
                "0 record(s)",
                "—",
            ], cells
            page.screenshot(path=str(shots / "5-history.png"), full_page=True)
            # The link opens the run's report, served by the plugin.
            row.locator("a.report").click()
            page.wait_for_url(re.compile(rf".*/mirrorflow/reports/failover/{run}$"))
            assert page.locator("h1").first.inner_text().startswith(f"Failover of {FLOW}")
            page.screenshot(path=str(shots / "6-report.png"), full_page=True)

            # The flow's page, from the health page's link.
            goto(page, f"{ui}/mirrorflow/")
            page.locator(f'tr[data-flow="{FLOW}"] a.flow').click()
            page.wait_for_url(re.compile(r".*/mirrorflow/flows/primary/secondary$"))
            assert page.locator(f'#partitions tbody tr[data-topic="{topic}"]').count() == 2
            assert page.locator(f'#groups tr[data-group="{group}"]').count() == 2
            assert page.locator(f'#history tr[data-run="{run}"]').count() == 1
            assert page.locator(f'#actions tr[data-dag="{FAILOVER_DAG}"] button').count() == 2
            page.screenshot(path=str(shots / "6b-flow.png"), full_page=True)

            # The buttons: a dry run at once, a real run only once confirmed.
            goto(page, f"{ui}/mirrorflow/history")
            dry_run_id, real_run_id = trigger_with_buttons(
                page, FAILOVER_DAG, "Fail over…", shots / "7-triggered-dry-run.png"
            )
            runs = runs_of(airflow, admin, FAILOVER_DAG)
            assert set(runs) == {dry_run_id, real_run_id}, runs
            for run_id, dry in ((dry_run_id, True), (real_run_id, False)):
                made = runs[run_id]
                assert made["conf"] == {"dry_run": dry}, made
                assert made["run_type"] == "manual" and made["state"] == "queued", made
                assert made["triggering_user_name"] == UI_USER, made
                assert made["triggered_by"] == "ui", made

            # A viewer sees the page, but Airflow refuses the viewer's trigger.
            page = login(
                browser, airflow, "/mirrorflow/history", VIEWER, airflow.password_of(VIEWER)
            )
            actions = page.locator(f'#actions tr[data-dag="{FAILOVER_DAG}"]')
            actions.get_by_role("button", name="Dry run").click()
            answer = actions.locator(".answer")
            page.wait_for_function(
                "e => e.textContent.startsWith('Airflow refused')", arg=answer.element_handle()
            )
            assert "HTTP 403" in answer.inner_text()
            page.screenshot(path=str(shots / "8-viewer-refused.png"), full_page=True)
            assert set(runs_of(airflow, admin, FAILOVER_DAG)) == {dry_run_id, real_run_id}
        finally:
            browser.close()
