"""mirrorflow's page inside the Airflow UI, against a real api-server, a real mirror job on the
sandbox clusters and a real browser (Debian's Chromium driven by Playwright): every plugin
endpoint refuses anonymous requests; a user who logs in through Airflow's login page sees the
flow RUNNING with its lag; during a burst of records its trends (the table's sparkline, the
flow page's charts) rise and fall with the job's samples, numbers with thousands separators;
STALLED while its job is frozen, RUNNING again with the frozen time a gap in its trends, then
STOPPED. Screenshots go to ``$MIRRORFLOW_TEST_ARTEFACTS/ui`` (else the test's temporary
folder)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import time
from collections.abc import Iterator

import pytest

from mirrorflow.airflow.ui.charts import SPARK_H
from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.devtools.local_airflow import UI_USER, LocalAirflow
from mirrorflow.health.numbers import thousands
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime import jobs, launch, trend
from tests.conftest import create_topics
from tests.mirror_harness import (
    end_offsets,
    flow_file,
    free_port,
    produce,
    produce_fresh,
    progress,
    start_mirror,
    stop_job,
    wait_for,
)
from tests.ui_harness import (
    CHROMIUM,
    CHROMIUM_ARGS,
    artefacts_dir,
    assert_refused,
    fetch,
    goto,
    plugin_get_routes,
    render_dags,
    require_chromium,
    running_airflow,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.airflow]

FLOW = "primary->secondary"
STALL_TIMEOUT_S = 20  # the flow's health.stall.timeout.seconds in this test
LAG_MAX_S, LAG_MAX_RECORDS = 10, 2000  # its health.lag.max.seconds and .records
REFRESH_S = 15  # one refresh: the job measures every 10 s, the page reloads every 5 s
BACKLOG = 100_000  # records produced while the flow is paused (drained 200 a batch)
LAG = re.compile(r"([\d,]+) records, ([\d,]+) s")
BURST, BURST_S = 20_000, 15  # records produced in a burst, over that many seconds
GAP_S = 25  # no sample for 2.5 times the 10 s between samples: a gap


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
        goto(page, url)
        row = page.locator(f'tr[data-flow="{FLOW}"]')
        seen = row.get_attribute("data-state", timeout=10_000)
        if seen in states:
            cells = row.locator("td").all_inner_texts()
            return {"state": seen, "reason": cells[2], "lag": cells[3], "heartbeat": cells[4]}
        time.sleep(2)
    raise AssertionError(f"the page showed {FLOW} as {seen}, not {'/'.join(states)}")


def samples(state) -> list[dict]:
    """The job's samples of the flow (its trend.json)."""
    return trend.read(state / "primary-secondary")["samples"]


def rates(taken: list[dict]) -> list[tuple[float, float]]:
    """Records/s as the page must derive them: between consecutive samples of one job, within
    the gap bound, from its counter of records copied."""
    return [
        (b["t"], (b["records"] - a["records"]) / (b["t"] - a["t"]))
        for a, b in itertools.pairwise(taken)
        if a["run"] == b["run"] and b["t"] - a["t"] <= GAP_S and b["records"] >= a["records"]
    ]


def heights(path_d: str) -> list[float]:
    """The y of each point of an SVG path (M/L commands)."""
    return [float(y) for y in re.findall(r"[ML] [\d.]+ ([\d.]+)", path_d)]


def row_of(page, url: str) -> dict[str, object]:
    """The flow's row now: state, reason, lag (records, seconds; None: not shown)."""
    goto(page, url)
    row = page.locator(f'tr[data-flow="{FLOW}"]')
    state = row.get_attribute("data-state", timeout=10_000)
    cells = row.locator("td").all_inner_texts()
    lag = LAG.fullmatch(cells[3])
    records, seconds = (
        (int(lag[1].replace(",", "")), int(lag[2].replace(",", "")))
        if lag
        else (
            None,
            None,
        )
    )
    return {"state": state, "reason": cells[2], "records": records, "seconds": seconds}


class Truth:
    """The flow's lag counted independently of mirrorflow: the source's end offsets minus the
    target's (its copies), and the page sampled against it."""

    def __init__(self, source, target, topic: str) -> None:
        self.source, self.target, self.topic = source, target, topic
        self.samples: list[dict] = []

    @staticmethod
    def _ends(cluster, topic: str) -> int | None:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient, OffsetSpec

        admin = AdminClient({**cluster.client_config(), "log_level": 0})
        try:
            futures = admin.list_offsets(
                {TopicPartition(topic, p): OffsetSpec.latest() for p in range(2)},
                request_timeout=5,
            )
            return sum(f.result(timeout=6).offset for f in futures.values())
        except Exception:
            return None  # the cluster is away

    def behind(self) -> int | None:
        source, target = (
            self._ends(self.source, self.topic),
            self._ends(self.target, "primary." + self.topic),
        )
        return None if source is None or target is None else source - target

    def sample(self, page, url: str, behind: int | None = None) -> dict:
        """The page's row, with the records behind counted before it was read (``behind``)
        and, when counted here, after (``behind_after``)."""
        taken = {"t": time.time(), "behind": self.behind() if behind is None else behind}
        taken.update(row_of(page, url))
        if behind is None:
            taken["behind_after"] = self.behind()
        self.samples.append(taken)
        return taken

    def never_caught_up_while_behind(self) -> None:
        """No sample says caught up while records were behind since at least one refresh.

        While a backlog drains (it only shrinks), the measurement a page shows may be newer
        than the count taken before the page was read: at the end of a fast drain it rightly
        says caught up while that count still had some records behind. The count taken after
        reading the page is newer than the measurement: records still behind then were
        behind when the page's measurement was taken."""
        for s in self.samples:
            if "caught up" in s["reason"] and s.get("behind_after", s["behind"]):
                earlier = [e for e in self.samples if s["t"] - REFRESH_S <= e["t"] < s["t"]]
                assert not earlier or not all(e["behind"] for e in earlier), (s, earlier)


def measured_at(sample: dict) -> float:
    """When the measurement a page sample shows was taken: its reason's "measured Ns ago"
    (whole seconds, so up to a second early), else the moment the sample was taken."""
    found = re.search(r"measured (\d+)s ago", str(sample["reason"]))
    return sample["t"] - int(found.group(1)) - 1 if found else sample["t"]


def scraped_lag(port: int, topic: str) -> tuple[float, float]:
    """The job's lag metrics of the copies of ``topic`` now: records behind in all its
    partitions, the oldest record's age in seconds."""
    from tests.test_metrics import scrape

    samples = scrape(port)

    def of(name: str) -> list[float]:
        return [s.value for s in samples.get(name, []) if s.labels["topic"] == "primary." + topic]

    return sum(of("mirrorflow_lag_records")), max(of("mirrorflow_lag_seconds"), default=0.0)


def check_burst_in_table(page, state) -> float:
    """The flows' table: the flow's sparkline rises and falls with the burst, its highest
    point the samples' highest rate; numbers with thousands separators. That rate."""
    spark = page.locator(f'svg.spark[data-flow="{FLOW}"]')
    shown_high = float(spark.get_attribute("data-high"))
    highest = max(rate for _t, rate in rates(samples(state)))
    assert shown_high == pytest.approx(highest, rel=1e-6), (shown_high, highest)
    assert highest > BURST / BURST_S / 3, highest  # the burst, not the heartbeats' trickle
    lines = spark.locator("path.line").evaluate_all("ps => ps.map(p => p.getAttribute('d'))")
    ys = [y for d in lines for y in heights(d)]  # left to right; a smaller y is higher
    peak, zero = ys.index(min(ys)), max(ys)
    # It rose well above its level before and after: the axis tops at a round number at most
    # twice the highest rate, so the peak stands at least half the plot's height above 0.
    assert zero - ys[peak] >= (SPARK_H - 4) / 2 - 0.1, ys
    assert any(y >= zero - 2 for y in ys[:peak]), ys  # from about 0 before the burst
    assert any(y >= zero - 2 for y in ys[peak + 1 :]), ys  # and fell back after it
    assert "Records copied since the job started" in page.locator("#flows th").all_inner_texts()
    row = page.locator(f'tr[data-flow="{FLOW}"]')
    records = row.locator("td.records").inner_text()
    assert re.fullmatch(r"\d{1,3}(,\d{3})+", records), records
    assert int(records.replace(",", "")) >= 120 + BURST
    assert LAG.fullmatch(row.locator("td.lag").inner_text()), row.locator("td.lag").inner_text()
    text = row.locator(".spark-text").inner_text()
    assert f"max {thousands(highest)} records/s" in text, text
    return highest


def check_burst_on_flow_page(page, url: str, state, highest: float, burst_at: float) -> None:
    """The flow's page: its four charts, the rate's highest the burst's, each figure with its
    unit; the replication latency the samples' (of the burst's fresh records, under a minute);
    offsets with separators."""
    goto(page, url)
    charts = {c.get_attribute("data-series"): c for c in page.locator("figure.chart").all()}
    assert set(charts) == {"lag_records", "lag_seconds", "rate", "latency_ms"}
    rate = charts["rate"]
    assert float(rate.get_attribute("data-high")) == pytest.approx(highest, rel=1e-6)
    assert rate.locator(".high").inner_text() == f"{thousands(highest)} records/s"
    taken = samples(state)
    latencies = [s["latency_ms"] for s in taken if s["latency_ms"] is not None]
    assert float(charts["latency_ms"].get_attribute("data-high")) == max(latencies)
    fresh = [s["latency_ms"] for s in taken if s["t"] > burst_at and s["records"]]
    fresh = [ms for ms in fresh if ms is not None]
    assert fresh and all(0 <= ms < 60_000 for ms in fresh), fresh  # copied within seconds
    most_lag = max(s["lag_records"] or 0 for s in taken)
    assert float(charts["lag_records"].get_attribute("data-high")) == most_lag
    for chart in charts.values():
        title = chart.locator("svg text.axis-title").text_content()  # SVG: no innerText
        assert title == chart.get_attribute("data-unit"), title
        assert chart.locator("svg text.x-tick").all_text_contents()[-1] == "now"
    ends = page.locator("#partitions td:nth-child(3)").all_inner_texts()
    assert any(re.fullmatch(r"\d{1,3}(,\d{3})+", e) for e in ends), ends


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
        tmp_path,
        sandbox,
        topic,
        f"{FLOW}.health.stall.timeout.seconds = {STALL_TIMEOUT_S}",
        f"{FLOW}.health.lag.max.seconds = {LAG_MAX_S}",
        f"{FLOW}.health.lag.max.records = {LAG_MAX_RECORDS}",
    )
    render_dags(config, airflow_ui)
    state = airflow_ui.state / "flows"  # where the api-server's MIRRORFLOW_STATE points
    stop_file = launch.stop_file_for(state, FLOW)
    log = tmp_path / "mirror.log"
    # With metrics: the trend's replication latency is theirs.
    port = free_port()
    metrics = ("--metrics-port", str(port))
    # Batches of 200 records at most: a backlog takes a while to drain, as a large one does
    # (at 5,000 a quiet machine drained it between two of the page's samples, ~2 s apart, and
    # at 1,000, copied in the driver at 10-20 ms a batch, a busy one did too: the page never
    # showed it LAGGING).
    small = ("--max-records-per-batch", "200")
    job = start_mirror(config, FLOW, state, log, "--stop-file", str(stop_file), *metrics, *small)
    ui = f"http://127.0.0.1:{airflow_ui.port}"
    page_url = f"{ui}/mirrorflow/"
    flow_url = f"{page_url}flows/primary/secondary"
    try:
        wait_for(lambda: progress(state).get("records", 0) >= 120, 240, "the first copies")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
            )
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 800})
                # Anonymous: the page sends the browser to Airflow's login page.
                goto(page, page_url)
                assert "/auth/login" in page.url, page.url
                page.screenshot(path=str(shots / "0-login.png"))
                page.locator('input[name="username"]').fill(UI_USER)
                page.locator('input[name="password"]').fill(airflow_ui.ui_password())
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(re.compile(r".*/mirrorflow/?$"), timeout=30_000)

                running = flow_row_state(page, page_url, ("RUNNING",), 60)
                assert LAG.fullmatch(running["lag"]), running
                assert running["heartbeat"].endswith("s ago"), running
                page.screenshot(path=str(shots / "1-running.png"), full_page=True)

                # A burst of records: the trends rise with it and fall after it.
                wait_for(lambda: len(samples(state)) >= 2, 60, "two samples before the burst")
                burst_at = time.time()
                produce_fresh(primary, topic, 2, BURST, start=120, seconds=BURST_S)
                burst_end = time.time()
                wait_for(
                    lambda: (
                        len([t for t, rate in rates(samples(state)) if t > burst_end + 10]) >= 2
                    ),
                    90,
                    "two samples after the burst",
                )
                assert all(r < 50 for t, r in rates(samples(state)) if t > burst_end + 10)
                goto(page, page_url)
                highest = check_burst_in_table(page, state)
                page.screenshot(path=str(shots / "1b-trends-burst.png"), full_page=True)
                check_burst_on_flow_page(page, flow_url, state, highest, burst_at)
                # The same page inside Airflow's UI, from its Browse menu entry.
                goto(page, f"{ui}/plugin/mirrorflow")
                frame = page.frame_locator("iframe")
                assert frame.locator(f'tr[data-flow="{FLOW}"]').get_attribute(
                    "data-state", timeout=30_000
                ) in ("RUNNING",)
                page.screenshot(path=str(shots / "2-running-in-airflow.png"), full_page=True)

                next_key = 120 + BURST
                truth = Truth(primary, sandbox["secondary"], topic)
                flow_dir = state / "primary-secondary"

                # Paused with records produced meanwhile: PAUSED, and the backlog shows, on the
                # page and in the metrics (measured by the job's application).
                # The page says "pausing" until the job confirms it has stopped copying (its
                # batch in progress may still copy): the backlog is produced after that.
                jobs.set_paused(flow_dir, True)
                flow_row_state(page, page_url, ("PAUSED",), 60)
                wait_for(
                    lambda: row_of(page, page_url)["reason"].startswith("the flow is paused"),
                    60,
                    "the job's confirmation of the pause on the page",
                )
                produce_fresh(primary, topic, 2, BACKLOG, start=next_key)
                next_key += BACKLOG
                try:
                    wait_for(
                        lambda: truth.sample(page, page_url)["records"] == BACKLOG,
                        3 * REFRESH_S,
                        "the paused flow's backlog on the page",
                    )
                except AssertionError as exc:  # what the page said last, and the job's log
                    raise AssertionError(
                        f"{exc}; last samples {truth.samples[-3:]}; progress {progress(state)}"
                    ) from None
                assert truth.samples[-1]["state"] == "PAUSED", truth.samples[-1]
                assert truth.samples[-1]["behind"] == BACKLOG
                wait_for(
                    lambda: scraped_lag(port, topic)[0] == BACKLOG, 3 * REFRESH_S, "its metric"
                )
                page.screenshot(path=str(shots / "1c-paused-backlog.png"), full_page=True)

                # Resumed: the backlog drains, sampled every second against the count.
                jobs.set_paused(flow_dir, False)
                metrics_seen = []
                while True:
                    taken = truth.sample(page, page_url)
                    records = scraped_lag(port, topic)[0]
                    # Counted again after the scrape: the metric lies between the two counts
                    # of the last refresh (the backlog only shrinks here).
                    metrics_seen.append((taken["t"], taken["behind"], records, truth.behind()))
                    if taken["behind"] == 0 and taken["records"] == 0:
                        break
                    assert time.time() - taken["t"] < 240, "the backlog did not drain"
                    time.sleep(max(0.0, 1 - (time.time() - taken["t"])))
                truth.never_caught_up_while_behind()
                lagging = [s for s in truth.samples if s["state"] == "LAGGING"]
                assert any("records behind (bound 2,000)" in s["reason"] for s in lagging), (
                    truth.samples
                )
                # The metric agrees with the count: what was behind within the last refresh.
                for at, _behind, records, after in metrics_seen:
                    recent = [m[1] for m in metrics_seen if at - REFRESH_S <= m[0] <= at]
                    assert after <= records <= max(recent), (at, records, metrics_seen)

                # The target's broker killed, records produced meanwhile: the lag grows in
                # records and in seconds (LAGGING on the seconds bound), then STALLED (no
                # heartbeat), the lag still shown.
                sandbox_mod.kill(sandbox.directory, ["secondary"])
                try:
                    produced_at = time.time()
                    produce_fresh(primary, topic, 2, 500, start=next_key)
                    # All 500 acknowledged: a measurement taken while they were being written
                    # (the producer's start and flush took seconds on a busy machine) may
                    # rightly have seen the source's ends before them.
                    written_at = time.time()
                    next_key += 500
                    outage: list[dict] = []
                    while time.time() - produced_at < STALL_TIMEOUT_S + 2 * REFRESH_S:
                        outage.append(truth.sample(page, page_url, behind=500))
                        time.sleep(1)
                    # None measured after the records were written says caught up (the first
                    # samples may still show the measurement from before them, with its age).
                    assert not [
                        s
                        for s in outage
                        if "caught up" in s["reason"] and measured_at(s) >= written_at
                    ], (written_at - produced_at, outage)
                    assert any(
                        s["state"] == "LAGGING" and f"s behind (bound {LAG_MAX_S}s)" in s["reason"]
                        for s in outage
                    ), outage
                    last = outage[-1]
                    assert last["state"] == "STALLED" and "no heartbeat" in last["reason"], last
                    assert last["records"] == 500, last
                    assert last["seconds"] >= time.time() - produced_at - REFRESH_S, last
                    records, seconds = scraped_lag(port, topic)
                    assert records == 500 and seconds > LAG_MAX_S, (records, seconds)
                    page.screenshot(path=str(shots / "3a-target-away.png"), full_page=True)
                finally:
                    sandbox_mod.up(["secondary"], sandbox.directory)
                wait_for(lambda: truth.behind() == 0, 120, "the copies after the outage")
                flow_row_state(page, page_url, ("RUNNING",), 90)
                # Frozen once its positions are written too: a job frozen between a batch's
                # copies and their positions is behind by that batch as well (at least once,
                # it copies the batch again), and the page would rightly count it.
                spec = spec_for_flow([config], FLOW)
                api_log = airflow_ui.home / "logs" / "api-server.log"
                ends = {(topic, p): end for p, end in end_offsets(primary, topic, 2).items()}
                wait_for(
                    lambda: {tp: o for tp, o in flow_positions(spec).items() if tp in ends} == ends,
                    60,
                    "the job's positions at the source's ends",
                )

                os.killpg(job.pid, signal.SIGSTOP)  # the job hangs: no report, no heartbeat
                frozen_at = time.time()
                try:
                    produce_fresh(primary, topic, 2, 300, start=next_key)
                    next_key += 300
                    stalled = flow_row_state(page, page_url, ("STALLED",), STALL_TIMEOUT_S + 40)
                    assert time.time() - frozen_at <= STALL_TIMEOUT_S + REFRESH_S, stalled
                    # Both bounds are the same: whichever the page sees pass first names it.
                    reason = stalled["reason"]
                    assert "no progress report" in reason or "no heartbeat" in reason, stalled
                    # The lag as the page measured it itself: the records written since.
                    try:
                        wait_for(
                            lambda: truth.sample(page, page_url, behind=300)["records"] == 300,
                            3 * REFRESH_S,
                            "the frozen flow's lag measured by the page",
                        )
                    except AssertionError as exc:  # what the page said last, what it measured
                        measured = [
                            line
                            for line in api_log.read_text(errors="replace").splitlines()
                            if "lag" in line
                        ]
                        raise AssertionError(
                            f"{exc}; last samples {truth.samples[-3:]}; "
                            f"the api-server's lag lines {measured[-5:]}"
                        ) from None
                    stalled = flow_row_state(page, page_url, ("STALLED",), 10)
                    # No Airflow run of its mirror DAG here (test_ui_active_active links one).
                    assert "no task log to show" in stalled["reason"], stalled
                    page.screenshot(path=str(shots / "3-stalled.png"), full_page=True)
                    frozen_at = samples(state)[-1]["t"]  # the trend's last sample
                    wait_for(lambda: time.time() - frozen_at > GAP_S + 5, 60, "a gap")
                finally:
                    os.killpg(job.pid, signal.SIGCONT)
                flow_row_state(page, page_url, ("RUNNING",), 90)
                # The frozen time is a gap in the trends: no sample, no line across it.
                wait_for(
                    lambda: len([s for s in samples(state) if s["t"] > frozen_at + GAP_S]) >= 2,
                    60,
                    "two samples after the freeze",
                )
                goto(page, flow_url)
                status, body, _ = fetch(
                    f"{ui}/mirrorflow/api/flows/primary/secondary",
                    {"Authorization": f"Bearer {airflow_ui.api().token}"},
                )
                assert status == 200, body[:300]
                trend_json = json.loads(body)["trend"]
                gaps = trend_json["gaps"]
                assert any(a == frozen_at and b > frozen_at + GAP_S for a, b in gaps), gaps
                rate_chart = page.locator("#chart-rate")
                assert rate_chart.locator("rect.gap").count() >= 1  # the freeze, at least
                segments = trend_json["series"]["rate"]["segments"]
                assert any(s[-1][0] <= frozen_at for s in segments[:-1])
                assert segments[-1][0][0] > frozen_at + GAP_S
                page.screenshot(path=str(shots / "3b-flow-trends-gap.png"), full_page=True)

                stop_file.parent.mkdir(parents=True, exist_ok=True)
                stop_file.touch()  # a clean stop, after the batch in progress
                assert job.wait(120) == 0, log.read_text(errors="replace")[-3000:]
                stopped = flow_row_state(page, page_url, ("STOPPED",), 30)
                assert stopped["reason"].startswith("its mirror job stopped"), stopped
                assert stopped["lag"] == "0 records, 0 s", stopped  # it had copied everything
                page.screenshot(path=str(shots / "4-stopped.png"), full_page=True)
            finally:
                browser.close()
    finally:
        stop_job(job)
    assert "Traceback" not in log.read_text(errors="replace")
