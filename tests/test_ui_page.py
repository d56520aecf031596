"""mirrorflow's page inside the Airflow UI, against a real api-server, a real mirror job on the
sandbox clusters and a real browser (Debian's Chromium driven by Playwright): every plugin
endpoint refuses anonymous requests; a user who logs in through Airflow's login page sees the
flow RUNNING with its lag, STALLED while its job is frozen, RUNNING again, then STOPPED.
Screenshots go to ``$MIRRORFLOW_TEST_ARTEFACTS/ui`` (else the test's temporary folder)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator

import pytest

from mirrorflow.devtools.local_airflow import UI_USER, LocalAirflow
from mirrorflow.runtime import launch
from tests.conftest import create_topics
from tests.mirror_harness import flow_file, produce, progress, start_mirror, stop_job, wait_for
from tests.ui_harness import (
    CHROMIUM,
    CHROMIUM_ARGS,
    artefacts_dir,
    assert_refused,
    fetch,
    plugin_get_routes,
    render_dags,
    require_chromium,
    running_airflow,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.airflow]

FLOW = "primary->secondary"
STALL_TIMEOUT_S = 20  # the flow's health.stall.timeout.seconds in this test


@pytest.fixture(scope="module")
def airflow_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAirflow]:
    """A real Airflow api-server (simple auth manager, 0600 password file) with the plugin."""
    with running_airflow(tmp_path_factory.mktemp("ui"), ("api-server",)) as airflow:
        yield airflow


def test_every_plugin_endpoint_refuses_anonymous_and_forged_requests(
    airflow_ui: LocalAirflow, sandbox, topic_name, tmp_path
):
    config = flow_file(tmp_path, sandbox, topic_name("ui"))
    render_dags(config, airflow_ui)
    base = f"http://127.0.0.1:{airflow_ui.port}/mirrorflow"
    # Routes with path parameters (a flow, a report) are checked in tests/test_ui_dr.py.
    routes = [r for r in plugin_get_routes() if "{" not in r]
    assert set(routes) >= {"/", "/api/health", "/history", "/api/history"}
    token = airflow_ui.api().token
    for route in routes:
        url = base + route
        for headers in (
            {},
            {"Accept": "application/json"},
            {"Authorization": "Bearer not-a-token"},
            {"Cookie": "_token=not-a-token"},
        ):
            status, body, _ = fetch(url, headers)
            assert status in (401, 403), (url, headers, status, body[:200])
            assert "primary" not in body, "a refused request saw the topology"
        status, body, _ = fetch(url, {"Authorization": f"Bearer {token}"})
        assert status == 200, (url, status, body[:300])
        assert "primary" in body
    # Paging and bad paging are refused alike before any other answer (no 400 to a stranger).
    for query in ("/history?page=2&limit=5", "/api/history?page=0", "/api/history?limit=x"):
        assert_refused(base + query)
    # A browser without a login is sent to Airflow's login page, and back after it.
    status, _, headers = fetch(base + "/", {"Accept": "text/html"})
    assert status == 303 and "/auth/login" in headers["location"], (status, headers)
    assert "next=" in headers["location"]
    # The flow file's passwords never reach the page.
    _, page, _ = fetch(base + "/", {"Authorization": f"Bearer {token}"})
    _, api, _ = fetch(base + "/api/health", {"Authorization": f"Bearer {token}"})
    for cluster in ("primary", "secondary"):
        for value in sandbox[cluster].java_client_config().values():
            if "password" in value:
                secret = re.search(r'password="([^"]+)"', value)
                assert secret and secret.group(1) not in page + api
    [flow] = json.loads(api)["flows"]
    assert (flow["flow"], flow["mirror_dag"]) == (FLOW, "mirror__secondary")


def flow_row_state(page, url: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
    """Reload ``url`` until the flow's row shows one of ``states``; its cells' texts."""
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        page.goto(url)
        row = page.locator(f'tr[data-flow="{FLOW}"]')
        seen = row.get_attribute("data-state", timeout=10_000)
        if seen in states:
            cells = row.locator("td").all_inner_texts()
            return {"state": seen, "reason": cells[2], "lag": cells[3], "heartbeat": cells[4]}
        time.sleep(2)
    raise AssertionError(f"the page showed {FLOW} as {seen}, not {'/'.join(states)}")


def test_a_logged_in_user_sees_the_flow_running_stalled_and_stopped(
    airflow_ui: LocalAirflow, sandbox, topic_name, tmp_path
):
    require_chromium()
    from playwright.sync_api import sync_playwright

    shots = artefacts_dir(tmp_path)
    primary = sandbox["primary"]
    topic = topic_name("ui")
    create_topics(primary, topic, partitions=2)
    produce(primary, topic, 2, 120)
    config = flow_file(
        tmp_path, sandbox, topic, f"{FLOW}.health.stall.timeout.seconds = {STALL_TIMEOUT_S}"
    )
    render_dags(config, airflow_ui)
    state = airflow_ui.state / "flows"  # where the api-server's MIRRORFLOW_STATE points
    stop_file = launch.stop_file_for(state, FLOW)
    log = tmp_path / "mirror.log"
    job = start_mirror(config, FLOW, state, log, "--stop-file", str(stop_file))
    ui = f"http://127.0.0.1:{airflow_ui.port}"
    page_url = f"{ui}/mirrorflow/"
    try:
        wait_for(lambda: progress(state).get("records", 0) >= 120, 240, "the first copies")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
            )
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 800})
                # Anonymous: the page sends the browser to Airflow's login page.
                page.goto(page_url)
                assert "/auth/login" in page.url, page.url
                page.screenshot(path=str(shots / "0-login.png"))
                page.locator('input[name="username"]').fill(UI_USER)
                page.locator('input[name="password"]').fill(airflow_ui.ui_password())
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(re.compile(r".*/mirrorflow/?$"), timeout=30_000)

                running = flow_row_state(page, page_url, ("RUNNING",), 60)
                assert re.fullmatch(r"\d+ records, \d+ s", running["lag"]), running
                assert running["heartbeat"].endswith("s ago"), running
                page.screenshot(path=str(shots / "1-running.png"), full_page=True)
                # The same page inside Airflow's UI, from its Browse menu entry.
                page.goto(f"{ui}/plugin/mirrorflow")
                frame = page.frame_locator("iframe")
                assert frame.locator(f'tr[data-flow="{FLOW}"]').get_attribute(
                    "data-state", timeout=30_000
                ) in ("RUNNING",)
                page.screenshot(path=str(shots / "2-running-in-airflow.png"), full_page=True)

                os.killpg(job.pid, signal.SIGSTOP)  # the job hangs: no report, no heartbeat
                try:
                    stalled = flow_row_state(page, page_url, ("STALLED",), STALL_TIMEOUT_S + 40)
                    # Both bounds are the same: whichever the page sees pass first names it.
                    reason = stalled["reason"]
                    assert "no progress report" in reason or "no heartbeat" in reason, stalled
                    seconds = int(re.fullmatch(r"\d+ records, (\d+) s", stalled["lag"])[1])
                    assert seconds >= STALL_TIMEOUT_S, stalled  # behind since it froze
                    page.screenshot(path=str(shots / "3-stalled.png"), full_page=True)
                finally:
                    os.killpg(job.pid, signal.SIGCONT)
                flow_row_state(page, page_url, ("RUNNING",), 90)

                stop_file.parent.mkdir(parents=True, exist_ok=True)
                stop_file.touch()  # a clean stop, after the batch in progress
                assert job.wait(120) == 0, log.read_text(errors="replace")[-3000:]
                stopped = flow_row_state(page, page_url, ("STOPPED",), 30)
                assert stopped["reason"].startswith("its mirror job stopped"), stopped
                assert stopped["lag"] == "—"
                page.screenshot(path=str(shots / "4-stopped.png"), full_page=True)
            finally:
                browser.close()
    finally:
        stop_job(job)
    assert "Traceback" not in log.read_text(errors="replace")
