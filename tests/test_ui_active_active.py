"""The Replication page with the active/active example (``examples/active-active.properties``:
``primary->secondary`` and ``secondary->primary``), against a real api-server and dag-processor,
the sandbox clusters, two real mirror jobs (one per site, as the two mirror DAGs run them) and
a real browser (Debian's Chromium driven by Playwright).

The page shows both flows, in its table and its drawn topology (an SVG box per cluster, an arrow
per flow with its state and lag), through the states the health model gives: RUNNING with their
lag; PAUSED by the flow's ``paused`` file (the job pauses it) and by its flow DAG paused in
Airflow; after a kill, STOPPED while its site's mirror DAG is on, then STALLED once the stall
bound passed, with a link to its mirror task's log in Airflow's UI (which opens it); after a
clean stop, PAUSED while its site's mirror DAG is paused; RUNNING again
after a restart, with the records written meanwhile copied. A second test pages through the
history of DR runs (``?page=``, ``?limit=``, newest first, its links) and triggers the failback
DAG with its buttons through Airflow's REST API (a dry run at once, a real run once confirmed).

The example is used as it is, except that its file config provider reads the test session's
sandbox (``clusters.properties``) instead of the demo's, its topics are one topic of this test
(named ``orders-…``, which the example's ``orders.*`` would take too, without those of other
tests) and the stall bound is shorter. No scheduler runs: the jobs are the test's, and a
triggered DAG run stays queued. Screenshots go to ``$MIRRORFLOW_TEST_ARTEFACTS/ui`` (else the
test's temporary folder), named ``aa-*.png``."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirrorflow.devtools.local_airflow import UI_USER, LocalAirflow
from mirrorflow.paths import write_private
from mirrorflow.runtime import jobs, launch
from tests.conftest import create_topics
from tests.mirror_harness import produce, progress, start_mirror, stop_job, wait_for, watermarks
from tests.ui_harness import (
    api_call,
    artefacts_dir,
    chromium,
    fetch,
    goto,
    login,
    render_dags,
    running_airflow,
    runs_of,
    trigger_with_buttons,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.airflow]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "active-active.properties"
EXAMPLE_PROVIDER_FILE = ".mirrorflow/sandbox/clusters.properties"
EXAMPLE_TOPICS = "topics = orders.*, payments.*"
AB, BA = "primary->secondary", "secondary->primary"
SITE = {AB: "mirror__secondary", BA: "mirror__primary"}  # each flow's mirror DAG
FLOW_DAG = {AB: "flow__primary__secondary", BA: "flow__secondary__primary"}
STALL_TIMEOUT_S = 30  # > the jobs' 10 s between reports, so a kill shows STOPPED first
LAG = re.compile(r"[\d,]+ records, [\d,]+ s")


@pytest.fixture(scope="module")
def airflow_aa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAirflow]:
    """A real api-server (with the plugin) and dag-processor, no scheduler."""
    base = tmp_path_factory.mktemp("ui-aa")
    with running_airflow(base, ("api-server", "dag-processor")) as airflow:
        yield airflow


def example_flow_file(directory: Path, box, topic: str) -> Path:
    """The active/active example on the session's sandbox, replicating ``topic`` both ways."""
    text = EXAMPLE.read_text()
    assert EXAMPLE_PROVIDER_FILE in text and EXAMPLE_TOPICS in text, "the example changed"
    text = text.replace(EXAMPLE_PROVIDER_FILE, str(box.directory / "clusters.properties"))
    text = text.replace(EXAMPLE_TOPICS, f"topics = {topic}")
    text += f"health.stall.timeout.seconds = {STALL_TIMEOUT_S}\n"
    return write_private(directory / "active-active.properties", text)


def read_page(page, url: str) -> dict[str, dict]:
    """Each flow as the page shows it: its table row (state, reason, lag) and its arrow in the
    topology (state, label); the arrow must agree with the row.

    A page already at ``url`` is read as it reloads itself (its meta refresh), right after that
    reload: a navigation of the test's own would race it (CI: three ``goto`` in a row
    "interrupted by another navigation" on a busy machine), and a read could straddle two
    copies of the page."""
    if page.url == url:
        every = page.locator('meta[http-equiv="refresh"]').get_attribute("content")
        with page.expect_navigation(url=url, timeout=(float(every) + 30) * 1000):
            pass  # the page's own reload, loaded
    else:
        goto(page, url)
    page.locator("#flows").wait_for(timeout=15_000)
    shown: dict[str, dict] = {}
    for row in page.locator("#flows tbody tr[data-flow]").all():
        cells = row.locator("td").all_inner_texts()
        shown[row.get_attribute("data-flow")] = {
            "state": row.get_attribute("data-state"),
            "reason": cells[2],
            "lag": cells[3],
        }
    for edge in page.locator("#topology g.edge").all():
        flow = edge.get_attribute("data-flow")
        label = " ".join(edge.locator("text.label tspan").all_text_contents())
        assert flow in shown, f"an arrow for {flow}, which the table does not list"
        assert edge.get_attribute("data-state") == shown[flow]["state"], (flow, label, shown)
        assert label.startswith(shown[flow]["state"]), (flow, label)
        shown[flow]["arrow"] = label
    return shown


def wait_states(
    page, url: str, wanted: dict[str, tuple[str, ...]], timeout: float, with_lag: bool = False
) -> dict:
    """Read the page at each of its reloads until every flow of ``wanted`` shows one of its
    states (and, ``with_lag``, its lag in records and seconds: its job has reported since it
    started); what the page shows."""
    deadline, shown = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        shown = read_page(page, url)
        if all(
            shown.get(flow, {}).get("state") in states
            and (not with_lag or LAG.fullmatch(shown[flow]["lag"]))
            for flow, states in wanted.items()
        ):
            return shown
    raise AssertionError(f"the page did not show {wanted} within {timeout:.0f}s: {shown}")


LOGICAL_DATE = {"logical_date": None}


def open_task_log(page, dag_id: str, run_id: str, shot: Path) -> None:
    """The STALLED flow's link leads to its mirror task's log in Airflow's UI: the task
    instance's page of its site DAG's latest run (its first tab is the log)."""
    link = page.locator(f'#flows tr[data-flow="{BA}"] a.log')
    path = f"/dags/{dag_id}/runs/{urllib.parse.quote(run_id, safe='')}/tasks/mirror"
    assert link.get_attribute("href") == ".." + path, link.get_attribute("href")
    link.click()
    page.wait_for_url(re.compile(".*" + re.escape(path) + "$"), timeout=30_000)
    # Airflow's UI found that task instance (its operator shows once its data loaded), its log
    # the page's first tab.
    page.get_by_text("MirrorFlowOperator").first.wait_for(timeout=60_000)
    assert page.get_by_text(run_id).count() >= 1
    page.get_by_text("Logs", exact=True).first.wait_for(timeout=30_000)
    page.screenshot(path=str(shot), full_page=True)


def remote_records(box, flow: str, topic: str) -> int:
    """Records in the flow's remote topic on its target (``primary.<topic>`` on secondary)."""
    source, _, target = flow.partition("->")
    ends = watermarks(box[target], f"{source}.{topic}", [0, 1])
    return sum(high for _low, high in ends.values())


def test_the_active_active_example_through_pause_stop_and_restart(
    airflow_aa: LocalAirflow, sandbox, topic_name, tmp_path
):
    shots = artefacts_dir(tmp_path)
    topic = topic_name("orders")
    for cluster in ("primary", "secondary"):
        create_topics(sandbox[cluster], topic, partitions=2)
    produce(sandbox["primary"], topic, 2, 60)
    produce(sandbox["secondary"], topic, 2, 40)
    config = example_flow_file(tmp_path, sandbox, topic)
    render_dags(config, airflow_aa)
    state = airflow_aa.state / "flows"  # where the api-server's MIRRORFLOW_STATE points
    flow_dirs = {flow: state / "-".join(jobs.split_flow(flow)) for flow in (AB, BA)}

    def start(flow: str):
        stop_file = launch.stop_file_for(state, flow)
        stop_file.unlink(missing_ok=True)
        log = tmp_path / f"{flow_dirs[flow].name}.log"
        return start_mirror(config, flow, state, log, "--stop-file", str(stop_file))

    running = {flow: start(flow) for flow in (AB, BA)}
    api = airflow_aa.api()
    url = f"http://127.0.0.1:{airflow_aa.port}/mirrorflow/"
    try:
        airflow_aa.wait_for_dags(api, [*SITE.values(), *FLOW_DAG.values()])
        for flow, count in ((AB, 60), (BA, 40)):
            wait_for(
                lambda f=flow, c=count: progress(state, flow_dirs[f].name).get("records", 0) >= c,
                300,
                f"the first copies of {flow}",
            )
        with chromium() as browser:
            page = login(browser, airflow_aa, "/mirrorflow/", UI_USER, airflow_aa.ui_password())

            # Both flows RUNNING with their lag, in the table and as two arrows.
            shown = wait_states(page, url, {AB: ("RUNNING",), BA: ("RUNNING",)}, 90, True)
            assert set(shown) == {AB, BA}, shown
            for flow in (AB, BA):
                assert LAG.fullmatch(shown[flow]["lag"]), shown[flow]
                assert re.fullmatch(r"RUNNING [\d,]+ rec · [\d,]+ s", shown[flow]["arrow"]), shown
            nodes = page.locator("#topology g.node")
            assert sorted(n.get_attribute("data-cluster") for n in nodes.all()) == [
                "primary",
                "secondary",
            ]
            edges = {
                (e.get_attribute("data-source"), e.get_attribute("data-target"))
                for e in page.locator("#topology g.edge").all()
            }
            assert edges == {("primary", "secondary"), ("secondary", "primary")}
            page.screenshot(path=str(shots / "aa-1-running.png"), full_page=True)

            # Paused: one by its paused file (the job pauses it), one by its flow DAG.
            jobs.set_paused(flow_dirs[AB], True)
            api.pause(FLOW_DAG[BA])
            shown = wait_states(page, url, {AB: ("PAUSED",), BA: ("PAUSED",)}, 60)
            # Each reason then says what its lag was when measured (the paused flows' lag is
            # measured by their jobs' applications).
            # ("pausing: " first, until its job confirms the pause)
            assert (
                shown[AB]["reason"]
                .removeprefix("pausing: ")
                .startswith("the flow is paused (its paused file exists)")
            ), shown
            assert (
                shown[BA]["reason"]
                .removeprefix("pausing: ")
                .startswith(f"its DAG {FLOW_DAG[BA]} is paused")
            ), shown
            assert shown[AB]["lag"] == "—" or LAG.fullmatch(shown[AB]["lag"]), shown
            wait_for(
                lambda: progress(state, flow_dirs[AB].name).get("state") == "PAUSED",
                60,
                "the job to pause primary->secondary",
            )
            produce(sandbox["primary"], topic, 2, 10, start=60)  # waits for the resume
            page.screenshot(path=str(shots / "aa-2-paused.png"), full_page=True)
            jobs.set_paused(flow_dirs[AB], False)
            api.unpause(FLOW_DAG[BA])
            wait_states(page, url, {AB: ("RUNNING",), BA: ("RUNNING",)}, 60)
            wait_for(lambda: remote_records(sandbox, AB, topic) >= 70, 120, "the resumed copy")

            # Stopped. secondary->primary's site is on (its DAG unpaused; no scheduler starts
            # it): its job killed, it is STOPPED, then STALLED once nothing was heard within
            # the bound. primary->secondary stopped cleanly while its site's DAG is paused.
            api.unpause(SITE[BA])
            # A run of the site's DAG (queued: no scheduler) whose mirror task's log the page
            # links to once the flow stalls.
            status, dag_run = api_call(
                airflow_aa, "POST", f"/api/v2/dags/{SITE[BA]}/dagRuns", api.token, LOGICAL_DATE
            )
            assert status == 200, dag_run
            os.killpg(running[BA].pid, signal.SIGKILL)
            running[BA].wait(30)
            shown = wait_states(page, url, {BA: ("STOPPED", "STALLED")}, 30)
            killed = progress(state, flow_dirs[BA].name).get("pid")
            if shown[BA]["state"] == "STOPPED":
                assert shown[BA]["reason"].startswith(
                    f"its mirror job (pid {killed}) is gone; {SITE[BA]} is on and should start "
                    "it again"
                ), shown
                page.screenshot(path=str(shots / "aa-3-killed-stopped.png"), full_page=True)
            stop_file = launch.stop_file_for(state, AB)
            stop_file.touch()  # a clean stop, after the batch in progress
            assert running[AB].wait(120) == 0
            wait_states(page, url, {AB: ("PAUSED",), BA: ("STALLED",)}, STALL_TIMEOUT_S + 30)

            def lag_measured() -> dict | None:  # by the page itself: no job reports it
                shown = wait_states(page, url, {AB: ("PAUSED",), BA: ("STALLED",)}, 10)
                return shown if all(LAG.fullmatch(shown[f]["lag"]) for f in (AB, BA)) else None

            shown = wait_for(lag_measured, 30, "the lag the page measured itself")
            assert shown[AB]["reason"].startswith(f"the site's mirror DAG {SITE[AB]} is paused"), (
                shown
            )
            assert shown[BA]["reason"].startswith(
                f"its mirror job (pid {killed}) is gone, though {SITE[BA]} is on (no report"
            ), shown
            for flow in (AB, BA):
                assert " rec · " in shown[flow]["arrow"], shown
            assert "log of its mirror task" in shown[BA]["reason"], shown
            assert "log" not in shown[AB]["reason"], shown  # PAUSED: no log link
            page.screenshot(path=str(shots / "aa-4-stopped.png"), full_page=True)
            open_task_log(page, SITE[BA], dag_run["dag_run_id"], shots / "aa-6-stalled-log.png")

            # Restarted: RUNNING again, and what was written meanwhile is copied both ways.
            produce(sandbox["primary"], topic, 2, 20, start=70)
            produce(sandbox["secondary"], topic, 2, 20, start=40)
            running = {flow: start(flow) for flow in (AB, BA)}
            # (At least: the killed job's last batch may be copied again.)
            wait_for(lambda: remote_records(sandbox, AB, topic) >= 90, 300, "the copy after")
            wait_for(lambda: remote_records(sandbox, BA, topic) >= 60, 120, "the copy back")
            shown = wait_states(page, url, {AB: ("RUNNING",), BA: ("RUNNING",)}, 90, True)
            for flow in (AB, BA):
                assert LAG.fullmatch(shown[flow]["lag"]), shown[flow]
            page.screenshot(path=str(shots / "aa-5-restarted.png"), full_page=True)
    finally:
        for job in running.values():
            stop_job(job)
    for flow in (AB, BA):
        log = (tmp_path / f"{flow_dirs[flow].name}.log").read_text(errors="replace")
        assert "Traceback" not in log, log[-3000:]


def write_reports(state: Path, count: int) -> list[str]:
    """``count`` drill reports (as a drill's report.json names its fields), a minute apart,
    alternating between the two flows; their run names, newest first."""
    names = []
    for i in range(count):
        run = f"scheduled__run-{i:02d}"
        directory = state / "reports" / "drill" / run
        directory.mkdir(parents=True)
        report = {
            "flow": (AB, BA)[i % 2],
            "started_at": f"2026-11-26T01:{i:02d}:00+00:00",
            "passed": True,
            "rpo_records": 0,
            "rto_seconds": 4.5,
        }
        (directory / "report.json").write_text(json.dumps(report))
        (directory / "report.html").write_text(f"<h1>Drill {run}</h1>")
        names.append(run)
    return names[::-1]


def test_history_pages_and_the_failback_buttons(
    airflow_aa: LocalAirflow, sandbox, topic_name, tmp_path
):
    shots = artefacts_dir(tmp_path)
    config = example_flow_file(tmp_path, sandbox, topic_name("orders"))
    render_dags(config, airflow_aa)
    runs = write_reports(airflow_aa.state, 23)
    api = airflow_aa.api()
    base = f"http://127.0.0.1:{airflow_aa.port}/mirrorflow"
    auth = {"Authorization": f"Bearer {api.token}"}

    def history(query: str) -> dict:
        status, body, _ = fetch(f"{base}/api/history{query}", auth)
        assert status == 200, (query, status, body[:300])
        return json.loads(body)

    first = history("?limit=10")
    assert [r["run"] for r in first["runs"]] == runs[:10]  # newest first
    assert (first["page"], first["pages"], first["total"]) == (1, 3, 23)
    assert (first["newer_page"], first["older_page"]) == (None, 2)
    last = history("?page=3&limit=10")
    assert [r["run"] for r in last["runs"]] == runs[20:]
    assert (last["newer_page"], last["older_page"]) == (2, None)
    past = history("?page=4&limit=10")
    assert past["runs"] == [] and past["newer_page"] == 3 and past["total"] == 23
    assert [r["run"] for r in history("")["runs"]] == runs[:20]  # 20 a page by default
    for query, name in (("?page=0", "page"), ("?limit=201", "limit"), ("?page=x&limit=5", "page")):
        status, body, _ = fetch(f"{base}/api/history{query}", auth)
        assert status == 400, (query, status, body[:300])
        detail = json.loads(body)["detail"]
        assert detail.startswith(f"{name}=") and "whole number from 1" in detail, detail

    failback = "failback__primary__secondary"
    airflow_aa.wait_for_dags(api, [failback])
    assert runs_of(airflow_aa, api.token, failback) == {}
    with chromium() as browser:
        page = login(browser, airflow_aa, "/mirrorflow/history", UI_USER, airflow_aa.ui_password())

        # The history, ten a page: from the newest, older and older, and back.
        goto(page, f"{base}/history?limit=10")

        def listed() -> list[str]:
            return [
                r.get_attribute("data-run") for r in page.locator("#history tr[data-run]").all()
            ]

        assert listed() == runs[:10]
        assert page.locator("#newer").count() == 0
        page.locator("#older").click()
        page.wait_for_url(re.compile(r".*/history\?page=2&limit=10$"))
        assert listed() == runs[10:20]
        assert "page 2 of 3 (runs 11\u201320 of 23)" in page.locator("#pages").inner_text()
        page.screenshot(path=str(shots / "aa-6-history-page-2.png"), full_page=True)
        page.locator("#older").click()
        page.wait_for_url(re.compile(r".*/history\?page=3&limit=10$"))
        assert listed() == runs[20:] and page.locator("#older").count() == 0
        page.locator("#newer").click()
        page.wait_for_url(re.compile(r".*/history\?page=2&limit=10$"))
        assert listed() == runs[10:20]

        # The failback's buttons: a dry run at once, a real run only once confirmed.
        dry_run_id, real_run_id = trigger_with_buttons(page, failback, "Fail back…")
        page.screenshot(path=str(shots / "aa-7-failback-triggered.png"), full_page=True)
        made = runs_of(airflow_aa, api.token, failback)
        assert set(made) == {dry_run_id, real_run_id}, made
        for run_id, dry in ((dry_run_id, True), (real_run_id, False)):
            assert made[run_id]["conf"] == {"dry_run": dry}, made[run_id]
            assert made[run_id]["state"] == "queued", made[run_id]
            assert made[run_id]["triggering_user_name"] == UI_USER, made[run_id]

        # The flow's page has the same buttons beside the failover's.
        goto(page, f"{base}/flows/primary/secondary")
        assert page.locator(f'#actions tr[data-dag="{failback}"] button').count() == 2
        assert page.locator('#actions tr[data-dag="failover__primary__secondary"]').count() == 1
