"""A flow's trend, without clusters: the job's sampler and its ring file
(:mod:`mirrorflow.runtime.trend`), the series read from it (:mod:`mirrorflow.health.trends`:
records/s from counters, restarts, gaps, current, min and max), their drawing
(:mod:`mirrorflow.airflow.ui.charts`) and the pages' numbers (thousands separators)."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mirrorflow.airflow.ui import charts
from mirrorflow.airflow.ui.graph import lag_label
from mirrorflow.health import history, trends
from mirrorflow.health.numbers import thousands
from mirrorflow.mm2.policy import DefaultReplicationPolicy
from mirrorflow.runtime import metrics as metrics_mod
from mirrorflow.runtime import trend

NOW = 1_800_000_000.0


def sample(t: float, records: int, run: str = "r1", **figures) -> dict:
    return {
        "t": t,
        "run": run,
        "state": "RUNNING",
        "lag_records": figures.get("lag_records", 0),
        "lag_seconds": figures.get("lag_seconds", 0.0),
        "records": records,
        "latency_ms": figures.get("latency_ms"),
    }


def test_thousands_separators():
    assert thousands(1234567) == "1,234,567"
    assert thousands(999) == "999"
    assert thousands(1234.56, 1) == "1,234.6"
    assert thousands(-0.2) == "0"
    assert thousands(None) == "—" and thousands(True) == "—"
    assert thousands(None, missing="?") == "?"
    assert lag_label({"lag_records": 1234567, "lag_seconds": 3601.4}) == "1,234,567 rec · 3,601 s"
    assert history._rpo({"records": 12345}) == "12,345 record(s)"
    assert history._rto(4321.25) == "4,321.2 s"


def test_records_per_second_come_from_consecutive_counters():
    samples = [sample(NOW - 30, 1_000), sample(NOW - 20, 11_000), sample(NOW - 10, 11_000)]
    samples.append(sample(NOW, 11_500, lag_records=7, lag_seconds=2.5, latency_ms=40))
    result = trends.derive(samples, NOW)
    rate = result.series["rate"]
    assert rate.points == [(NOW - 20, 1_000.0), (NOW - 10, 0.0), (NOW, 50.0)]
    assert (rate.current, rate.low, rate.high) == (50.0, 0.0, 1_000.0)
    assert result.series["lag_records"].current == 7
    assert result.series["lag_seconds"].current == 2.5
    assert result.series["latency_ms"].points == [(NOW, 40.0)]  # None elsewhere: no line
    assert result.restarts == [] and result.samples == 4
    # The trend spans at least 5 minutes: the time before the first sample is a gap, no line.
    assert result.start == NOW - 300 and result.gaps == [(NOW - 300, NOW - 30)]


def test_a_restart_is_a_mark_never_a_negative_rate():
    samples = [
        sample(NOW - 40, 5_000),
        sample(NOW - 30, 6_000),
        sample(NOW - 20, 200, run="r2"),  # a new job: its counter began again at 0
        sample(NOW - 10, 700, run="r2"),
        sample(NOW, 100, run="r2"),  # the counter went down: another restart
    ]
    result = trends.derive(samples, NOW)
    assert result.restarts == [NOW - 20, NOW]
    rate = result.series["rate"]
    assert rate.points == [(NOW - 30, 100.0), (NOW - 10, 50.0)]
    assert all(value >= 0 for _t, value in rate.points)
    assert len(rate.segments) == 2  # never a line across a restart
    assert rate.current is None  # the last sample is a restart: no rate yet


def test_times_without_samples_are_gaps_not_lines():
    frozen = [sample(NOW - 300 + 10 * i, 100 * i) for i in range(6)]  # until NOW - 250
    frozen += [sample(NOW - 120 + 10 * i, 1_000 + 100 * i) for i in range(5)]  # from NOW - 120
    result = trends.derive(frozen, NOW)
    assert (NOW - 250, NOW - 120) in result.gaps
    assert (NOW - 80, NOW) in result.gaps  # stopped 80 s ago: a gap up to now
    for name in ("lag_records", "rate"):
        series = result.series[name]
        assert len(series.segments) == 2, series.segments
        assert series.segments[0][-1][0] <= NOW - 250 < NOW - 120 <= series.segments[1][0][0]
        assert series.current is None  # nothing heard for longer than a gap: no current value
    # The first sample after the gap has no rate: it would average over the time unseen.
    assert result.series["rate"].segments[1][0][0] == NOW - 110
    # Drawn: no path crosses the gap, which is a shaded area.
    drawn = charts.chart(result, "lag_records")
    assert result.start == NOW - 300  # the first sample: no gap before it
    assert len(drawn["paths"]) == 2 and len(drawn["gaps"]) == 2
    for path in drawn["paths"]:
        xs = [float(x) for x in re.findall(r"[ML] ([\d.]+) ", path)]
        for gap in drawn["gaps"]:
            assert all(not gap["x"] < x < gap["x"] + gap["width"] for x in xs), (path, gap)


def test_an_hour_at_most_and_no_samples_is_one_gap_over_it():
    old = [sample(NOW - 4_000, 1), sample(NOW - 3_000, 2), sample(NOW - 2_990, 3)]
    assert trends.derive(old, NOW).start == NOW - 3_000  # the first sample of the hour
    assert trends.derive(old, NOW).samples == 2
    result = trends.derive([], NOW)
    assert result.gaps == [(NOW - 3600, NOW)] and result.last_sample_at is None
    assert all(s.current is None and s.high is None for s in result.series.values())
    drawn = charts.sparkline(result, "rate")
    assert drawn["paths"] == [] and drawn["current_text"] == "—"


def test_chart_axes_labels_units_and_figures():
    samples = [sample(NOW - 20, 0), sample(NOW - 10, 12_345_670), sample(NOW, 12_345_670)]
    result = trends.derive(samples, NOW)
    drawn = charts.chart(result, "rate")
    assert drawn["unit"] == "records/s"
    assert [t["label"] for t in drawn["y_ticks"]] == ["0", "1,000,000", "2,000,000"]
    assert [t["label"] for t in drawn["x_ticks"]] == ["\u22124 min", "\u22122 min", "now"]
    assert charts.time_ticks(3600) == [60, 45, 30, 15, 0]
    assert charts.time_ticks(1800) == [30, 20, 10, 0]
    assert charts.time_ticks(400) == [6, 4, 2, 0]
    assert drawn["high_text"] == "1,234,567 records/s" and drawn["current_text"] == "0 records/s"
    # The highest point is drawn below the axis' top, at its value's height.
    [path] = drawn["paths"]
    ys = [float(y) for y in re.findall(r"[ML] [\d.]+ ([\d.]+)", path)]
    top, bottom = drawn["top"], drawn["bottom"]
    assert min(ys) == pytest.approx(bottom - (bottom - top) * 1_234_567 / 2_000_000, abs=0.1)
    assert max(ys) == bottom
    assert charts.nice_ceiling(0) == 1 and charts.nice_ceiling(1_234_567) == 2_000_000
    assert charts.nice_ceiling(2.1) == 2.5 and charts.nice_ceiling(5) == 5
    small = trends.derive([sample(NOW - 10, 0, lag_seconds=0.8), sample(NOW, 1)], NOW)
    assert [t["label"] for t in charts.chart(small, "lag_seconds")["y_ticks"]] == ["0", "0.5", "1"]
    tiny = trends.derive([sample(NOW - 10, 0, lag_seconds=2.2), sample(NOW, 1)], NOW)
    assert [t["label"] for t in charts.chart(tiny, "lag_seconds")["y_ticks"]] == [
        "0",
        "1.25",
        "2.5",
    ]


def test_take_latency_merges_the_flows_partitions_acknowledged_since_the_last_take():
    m = metrics_mod.Metrics()
    flow, other = m.flow("a", "b"), m.flow("c", "b")
    Copied, Stats = metrics_mod.Copied, metrics_mod.Stats
    copied = {
        ("t", 0): Copied(2, 20, Stats(), Stats(100, 300, 400, 2)),
        ("t", 1): Copied(1, 10, Stats(), Stats(50, 50, 50, 1)),
        ("heartbeats", 0): Copied(1, 10, Stats(), Stats(1_900, 1_900, 1_900, 1)),
    }
    ends = {("t", 0): 2, ("t", 1): 1, ("heartbeats", 0): 1}
    mapping = {"t": "a.t", "heartbeats": "a.heartbeats"}
    t0 = time.time()
    flow.batch(copied, ends, ends, mapping, t0)
    other.batch(
        {("u", 0): Copied(1, 10, Stats(), Stats(9_000, 9_000, 9_000, 1))},
        {("u", 0): 1},
        {("u", 0): 1},
        {"u": "c.u"},
        t0,
    )
    # The trend leaves out heartbeat topics, which a stream copies once a second.
    heartbeats = DefaultReplicationPolicy().is_heartbeats_topic
    assert flow.take_latency(heartbeats) == Stats(50, 300, 450, 3)
    assert flow.take_latency().count == 0  # nothing acknowledged since
    flow.batch(copied, ends, ends, mapping, t0 + 1)
    assert flow.take_latency() == Stats(50, 1_900, 2_350, 4)
    assert other.take_latency() == Stats(9_000, 9_000, 9_000, 1)


class FakeJob:
    """What the sampler reads of a MirrorJob: its flow, its state directory, its metrics."""

    def __init__(self, flow_dir: Path, metrics=None) -> None:
        self.spec = SimpleNamespace(
            flow="a->b", is_heartbeats_topic=DefaultReplicationPolicy().is_heartbeats_topic
        )
        self.flow_dir, self.metrics = flow_dir, metrics


def write_progress(flow_dir: Path, **progress) -> None:
    (flow_dir / "progress.json").write_text(json.dumps(progress))


def test_the_sampler_appends_to_an_hour_long_ring_after_each_report(tmp_path):
    flow_dir = tmp_path / "a-b"
    flow_dir.mkdir()
    umask = os.umask(0o077)  # the file is 0644 whatever the umask
    try:
        sample_twice(flow_dir)
    finally:
        os.umask(umask)


def sample_twice(flow_dir: Path) -> None:
    old = [sample(time.time() - 4_000, 1), sample(time.time() - 100, 2, run="old")]
    trend.write(flow_dir, "a->b", old, 10.0)
    job = FakeJob(flow_dir)
    reports = []

    def report() -> None:  # as report-progress writes progress.json
        reports.append(time.time())
        write_progress(
            flow_dir, state="RUNNING", lag_records=12, caught_up_at=time.time() - 7, records=500
        )

    task = trend.sampled(job, report, 10.0)
    task()
    write_progress(flow_dir, state="IDLE", lag_records=0, caught_up_at=time.time(), records=800)
    task2 = trend.sampled(job, lambda: None, 10.0)  # the same job's next try: the same run
    task2()
    data = json.loads((flow_dir / "trend.json").read_text())
    assert data["flow"] == "a->b" and data["interval_s"] == 10.0 and data["window_s"] == 3600
    samples = data["samples"]
    assert [s["records"] for s in samples] == [2, 500, 800]  # the sample older than 1 h is gone
    first, second = samples[1], samples[2]
    assert first["run"] == second["run"] != "old"
    assert first["lag_records"] == 12 and 6.5 <= first["lag_seconds"] <= 8
    assert first["latency_ms"] is None  # no metrics: no latency figure
    assert second["state"] == "IDLE" and second["lag_seconds"] == 0
    assert len(reports) == 1 and reports[0] <= first["t"] + 0.01  # t is kept to 0.01 s
    assert stat.S_IMODE((flow_dir / "trend.json").stat().st_mode) == 0o644
    assert sorted(p.name for p in flow_dir.iterdir()) == ["progress.json", "trend.json"]
    # A new job of the flow is a new run: the reader sees a restart, never a negative rate.
    new_job = FakeJob(flow_dir)
    trend.sampled(new_job, lambda: None, 10.0)()
    assert trend.read(flow_dir)["samples"][-1]["run"] != first["run"]


def test_a_sampler_that_cannot_write_says_so_and_the_report_goes_on(tmp_path, caplog):
    flow_dir = tmp_path / "gone"
    job = FakeJob(flow_dir)
    written = []
    task = trend.sampled(job, lambda: written.append(1), 10.0)
    task()
    task()
    assert written == [1, 1]
    assert caplog.text.count("its trend could not be written") == 1


def test_an_unreadable_ring_starts_again(tmp_path):
    (tmp_path / "trend.json").write_text("{not json")
    assert trend.read(tmp_path) == {"interval_s": 10.0, "window_s": 3600.0, "samples": []}
    (tmp_path / "trend.json").write_text(json.dumps({"samples": [{"t": "x"}, 3, {"t": 5}]}))
    assert trend.read(tmp_path)["samples"] == [{"t": 5}]
