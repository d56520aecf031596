"""The health model's derivation (pure logic): progress.json, the DAGs' pause and the flow's
thresholds give RUNNING, LAGGING, STALLED, FAILED, PAUSED or STOPPED with a one-line reason;
and the thresholds are flow settings that ``validate`` knows."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from mirrorflow.config.topology import load_topology
from mirrorflow.config.validation import validate
from mirrorflow.health import model
from mirrorflow.health.model import HealthSettings, SiteDag, derive
from mirrorflow.health.status import settings_for, topology_health

NOW = 1_800_000_000.0
FLOW = "primary->secondary"


def progress(state: str = "RUNNING", age: float = 2.0, **extra: object) -> dict:
    """A progress.json written ``age`` seconds before NOW, heartbeat and checkpoint fresh."""
    base = {
        "flow": FLOW,
        "state": state,
        "error": None,
        "updated": datetime.fromtimestamp(NOW - age, UTC).isoformat(timespec="seconds"),
        "records": 100,
        "lag_records": 0,
        "lag_measured_at": NOW - age,
        "caught_up_at": NOW - age - 1,
        "last_batch_at": NOW - age,
        "pid": 4242,
        "host": "h",
        "tasks": {
            "heartbeats": {"last_success_at": NOW - 1, "runs": 9},
            "emit-checkpoints": {"last_success_at": NOW - 30, "runs": 1},
        },
    }
    return {**base, **extra}


def test_a_running_flow_within_its_bounds_is_running_with_its_figures():
    health = derive(FLOW, progress(), now=NOW, job_alive=True)
    assert (health.state, health.reason) == ("RUNNING", "caught up (measured 2s ago)")
    assert health.lag_records == 0 and health.lag_seconds == 0.0
    assert health.lag_measured_at == NOW - 2
    assert health.last_heartbeat == NOW - 1 and health.last_checkpoint == NOW - 30
    idle = derive(FLOW, progress("IDLE"), now=NOW, job_alive=None)
    assert (idle.state, idle.lag_seconds, idle.reason) == (
        "RUNNING",
        0.0,
        "caught up (measured 2s ago)",
    )


def test_a_flow_with_records_to_copy_is_never_caught_up_whatever_its_job_says():
    """The job's state lags behind the truth (IDLE written before it waits; a burst arrives):
    the records behind decide, and the age of the oldest of them is the lag in seconds."""
    burst = progress("IDLE", lag_records=297_084, oldest_uncopied_at=NOW - 12.5)
    health = derive(FLOW, burst, now=NOW, job_alive=True)
    assert (health.state, health.lag_records) == ("RUNNING", 297_084)
    assert health.lag_seconds == pytest.approx(12.5)
    assert (
        health.reason == "copying; 297,084 record(s) behind, the oldest 12s old (measured 2s ago)"
    )
    # the oldest not read yet: the time since the flow was last caught up bounds it
    unread = progress("RUNNING", lag_records=10, caught_up_at=NOW - 40)
    assert derive(FLOW, unread, now=NOW).lag_seconds == pytest.approx(40)
    # the renderer's own measurement, newer than the job's, wins
    measured = {"lag_records": 5, "lag_measured_at": NOW - 1, "oldest_uncopied_at": NOW - 7}
    fresh = derive(FLOW, progress("IDLE"), now=NOW, measured=measured)
    assert (fresh.lag_records, fresh.lag_seconds, fresh.lag_measured_at) == (5, 7.0, NOW - 1)
    stale = {"lag_records": 5, "lag_measured_at": NOW - 60, "oldest_uncopied_at": NOW - 70}
    assert derive(FLOW, progress("IDLE"), now=NOW, measured=stale).lag_records == 0


def test_lag_over_either_bound_is_lagging():
    behind = progress(oldest_uncopied_at=NOW - 400, lag_records=5)
    health = derive(FLOW, behind, now=NOW)
    assert health.state == "LAGGING"
    assert health.reason == "400s behind (bound 300s) (measured 2s ago)"
    records = derive(FLOW, progress(lag_records=5000), now=NOW, settings=HealthSettings(
        lag_max_records=1000))  # fmt: skip
    assert (records.state, records.reason) == (
        "LAGGING",
        "5,000 records behind (bound 1,000) (measured 2s ago)",
    )
    unbounded = HealthSettings(lag_max_seconds=0)
    assert derive(FLOW, behind, now=NOW, settings=unbounded).state == "RUNNING"


def test_no_report_or_no_heartbeat_within_the_timeout_is_stalled():
    quiet = derive(FLOW, progress(age=31), now=NOW, job_alive=True)
    assert quiet.state == "STALLED"
    assert quiet.reason.startswith("no progress report from its mirror job for 31s (bound 30s)")
    assert quiet.reason.endswith("; nothing to copy (measured 31s ago)")
    frozen = progress("RUNNING", age=40, lag_records=1000, oldest_uncopied_at=NOW - 45)
    stalled = derive(FLOW, frozen, now=NOW, job_alive=True)
    assert (stalled.state, stalled.lag_records) == ("STALLED", 1000)
    assert stalled.lag_seconds == pytest.approx(45)
    assert stalled.reason.endswith("1,000 record(s) behind, the oldest 45s old (measured 40s ago)")
    beats = progress()
    beats["tasks"]["heartbeats"]["last_success_at"] = NOW - 31
    no_beat = derive(FLOW, beats, now=NOW)
    assert (no_beat.state, no_beat.reason) == (
        "STALLED",
        "no heartbeat acknowledged by the target for 31s (bound 30s); nothing to copy "
        "(measured 2s ago)",
    )
    patient = HealthSettings(stall_timeout_seconds=200)
    assert derive(FLOW, beats, now=NOW, settings=patient).state == "RUNNING"


def test_failed_paused_and_stopped():
    failed = derive(FLOW, progress("FAILED", error="cluster primary refused User:alice"), now=NOW)
    assert failed.state == "FAILED"
    assert failed.reason == "cluster primary refused User:alice; nothing to copy (measured 2s ago)"
    dags = SiteDag("mirror__secondary", False, "flow__primary__secondary", True)
    paused = derive(FLOW, progress(), now=NOW, dags=dags)
    assert (paused.state, paused.reason) == (
        "PAUSED",
        "its DAG flow__primary__secondary is paused; nothing to copy (measured 2s ago)",
    )
    # a paused flow's backlog shows: what a failover would leave behind
    waiting = progress("PAUSED", lag_records=1000, oldest_uncopied_at=NOW - 90)
    backlog = derive(FLOW, waiting, now=NOW)
    assert (backlog.state, backlog.lag_records, backlog.lag_seconds) == ("PAUSED", 1000, 90.0)
    assert derive(FLOW, progress("PAUSED"), now=NOW).state == "PAUSED"
    assert derive(FLOW, progress(), now=NOW, flow_paused=True).state == "PAUSED"
    # asked to pause while its job runs: "pausing" until the job confirms it (it may still copy
    # its batch in progress), whichever way the pause was asked
    asked = derive(FLOW, progress(), now=NOW, job_alive=True, flow_paused=True)
    assert (asked.state, asked.reason) == (
        "PAUSED",
        "pausing: the flow is paused (its paused file exists); its job has not stopped copying "
        "yet; nothing to copy (measured 2s ago)",
    )
    by_dag = derive(FLOW, progress(), now=NOW, job_alive=True, dags=dags)
    assert by_dag.reason.startswith("pausing: its DAG flow__primary__secondary is paused;")
    confirmed = derive(FLOW, progress("PAUSED"), now=NOW, job_alive=True, flow_paused=True)
    assert confirmed.reason.startswith("the flow is paused (its paused file exists);")
    site = derive(FLOW, progress("STOPPED"), now=NOW, dags=SiteDag("mirror__secondary", True))
    assert site.state == "PAUSED"
    assert site.reason.startswith("the site's mirror DAG mirror__secondary is paused;")
    started_by_hand = derive(FLOW, progress(), now=NOW, dags=SiteDag("mirror__secondary", True))
    assert started_by_hand.state == "RUNNING"  # a job runs it all the same
    stopped = derive(FLOW, progress("STOPPED", age=65), now=NOW)
    assert (stopped.state, stopped.reason) == (
        "STOPPED",
        "its mirror job stopped 65s ago; nothing to copy (measured 65s ago)",
    )
    never = derive(FLOW, {}, now=NOW)
    assert (never.state, never.reason) == ("STOPPED", "no mirror job has run this flow yet")


def test_a_killed_job_is_stopped_then_stalled_when_its_dag_should_run_it():
    killed = progress("RUNNING", age=5)
    gone = derive(FLOW, killed, now=NOW, job_alive=False)
    assert gone.state == "STOPPED"
    assert gone.reason.startswith("its mirror job (pid 4242) is gone;")
    on = SiteDag("mirror__secondary", False)
    retrying = derive(FLOW, killed, now=NOW, job_alive=False, dags=on)
    assert retrying.state == "STOPPED" and "mirror__secondary is on and should start" in (
        retrying.reason
    )
    late = derive(FLOW, progress("STOPPED", age=500), now=NOW, dags=on)
    assert late.state == "STALLED"
    assert late.reason.startswith("its mirror job stopped 8min ago, though mirror__secondary is on")


def test_every_state_is_reachable():
    assert set(model.STATES) == {"RUNNING", "LAGGING", "STALLED", "FAILED", "PAUSED", "STOPPED"}


def _flow_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "mm2.properties"
    path.write_text(
        "\n".join(
            [
                "clusters = primary, secondary",
                "primary.bootstrap.servers = 127.0.0.1:1",
                "secondary.bootstrap.servers = 127.0.0.1:2",
                f"{FLOW}.enabled = true",
                *lines,
            ]
        )
        + "\n"
    )
    return path


def test_thresholds_are_flow_settings_with_defaults(tmp_path: Path):
    defaults = settings_for(load_topology([_flow_file(tmp_path)]).flow(FLOW))
    assert defaults == HealthSettings(300.0, 0, 30.0)
    path = _flow_file(
        tmp_path,
        f"{FLOW}.health.lag.max.seconds = 60",
        "health.lag.max.records = 10000",
        "health.stall.timeout.seconds = 45",
    )
    assert settings_for(load_topology([path]).flow(FLOW)) == HealthSettings(60.0, 10000, 45.0)
    assert not [f for f in validate(load_topology([path])) if "health" in f.key]


def test_validate_names_a_bad_threshold(tmp_path: Path):
    path = _flow_file(tmp_path, "health.stall.timeout.seconds = 0", "health.lag.max.seconds = -1")
    problems = {f.key: f for f in validate(load_topology([path])) if "health" in f.key}
    assert problems["health.stall.timeout.seconds"].severity == "error"
    assert problems["health.lag.max.seconds"].severity == "error"
    typo = _flow_file(tmp_path, "health.lag.max.secs = 5")
    assert [f for f in validate(load_topology([typo])) if f.key == "health.lag.max.secs"]


def test_topology_health_reads_each_flows_progress(tmp_path: Path):
    import json

    state = tmp_path / "flows"
    (state / "primary-secondary").mkdir(parents=True)
    (state / "primary-secondary" / "progress.json").write_text(json.dumps(progress("IDLE")))
    result = topology_health([_flow_file(tmp_path)], state, now=NOW)
    assert result.error is None and result.clusters == ["primary", "secondary"]
    [flow] = result.flows
    assert (flow["source"], flow["target"], flow["state"]) == ("primary", "secondary", "RUNNING")
    broken = topology_health([tmp_path / "missing.properties"], state, now=NOW)
    assert broken.error and "missing.properties" in broken.error and not broken.flows


def test_a_running_flow_rewrites_progress_at_most_every_second_and_a_new_state_at_once(
    tmp_path, monkeypatch
):
    """The job's report behind ``progress.json``, which the health model reads: batch after
    batch in one state (a small exactly-once batch every ~25 ms) it is rewritten at most every
    second, a change of state or an error at once, and what was left unwritten when the flow's
    loop ends."""
    import json

    from mirrorflow.replication.spec import spec_for_flow
    from mirrorflow.runtime import flow_report

    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = a, b\na.bootstrap.servers = a:9092\nb.bootstrap.servers = b:9092\n"
        "a->b.enabled = true\n"
    )
    spec = spec_for_flow([path], "a->b", state_dir=tmp_path / "state")
    report = flow_report.FlowReport(
        spec,
        source_admin=None,  # type: ignore[arg-type] (the lag is not measured here)
        metrics=None,
        positions=dict,
        mapping=dict,
        tasks=dict,
        silenced=lambda: False,
    )
    now = [1000.0]
    monkeypatch.setattr(flow_report.time, "monotonic", lambda: now[0])

    def written() -> dict:
        return json.loads((Path(spec.flow_dir) / "progress.json").read_text())

    report.record_state("RUNNING")
    for batch in range(1, 40):  # 39 batches in 0.975 s
        report.batches = batch
        now[0] += 0.025
        report.record_state("RUNNING")
    assert written()["batches"] == 0  # none of them rewrote it
    now[0] += 0.05
    report.batches = 40
    report.record_state("RUNNING")  # over a second after the last write
    assert written()["batches"] == 40
    report.batches = 41
    report.record_state("IDLE")  # a new state: at once
    assert (written()["state"], written()["batches"]) == ("IDLE", 41)
    report.batches = 42
    now[0] += 0.01
    report.record_state("RUNNING")
    report.batches = 43
    report.record_state("RUNNING", "a batch failed")  # an error: at once
    assert (written()["batches"], written()["error"]) == (43, "a batch failed")
    report.batches = 44
    report.record_state("RUNNING")
    assert written()["batches"] == 43
    report.flush()  # the loop ends: what was left is written
    assert written()["batches"] == 44


def test_the_lag_task_takes_a_caught_up_streams_fetches_and_asks_the_source_otherwise(
    tmp_path, monkeypatch
):
    """The ``measure-lag`` task of a flow whose stream's fetches found every partition caught
    up just now records that (nothing behind, as of then) without asking the source; a stream
    that does not cover every replicated partition, or none (``seen`` answers None: behind,
    holding, in batches), has the lag measured from the source as before."""
    from mirrorflow.replication import lag
    from mirrorflow.replication.spec import spec_for_flow
    from mirrorflow.runtime import flow_report

    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = a, b\na.bootstrap.servers = a:9092\nb.bootstrap.servers = b:9092\n"
        "a->b.enabled = true\n"
    )
    spec = spec_for_flow([path], "a->b", state_dir=tmp_path / "state")
    positions = {("t", 0): 40, ("t", 1): 7}
    seen: list[lag.Lag | None] = [lag.Lag(1000.0, {("t", 0): 40, ("t", 1): 7}, {})]
    asked: list[dict] = []

    def measure(_spec, at, **_clients):
        asked.append(dict(at))
        return lag.Lag(2000.0, {("t", 0): 45, ("t", 1): 7}, dict(at), {("t", 0): 1_999_000})

    monkeypatch.setattr(flow_report.lag, "measure", measure)

    class Reader:  # the lag's consumer
        closed = False

        def close(self) -> None:
            self.closed = True

    readers: list[Reader] = []
    monkeypatch.setattr(
        flow_report.lag, "timestamp_reader", lambda _spec: readers.append(Reader()) or readers[-1]
    )
    report = flow_report.FlowReport(
        spec,
        source_admin=None,  # type: ignore[arg-type] (lag.measure is replaced)
        metrics=None,
        positions=lambda: dict(positions),
        mapping=dict,
        tasks=dict,
        silenced=lambda: False,
        seen=lambda: seen[0],
    )
    report.measure_lag()
    assert asked == []
    measured = report.backlog.lag
    assert measured is not None
    assert (measured.measured_at, measured.records, measured.seconds(1005.0)) == (1000.0, 0, 0.0)

    seen[0] = lag.Lag(1001.0, {("t", 0): 40}, {})  # a partition its stream does not read
    report.measure_lag()
    seen[0] = None
    report.measure_lag()
    assert asked == [positions, positions]
    measured = report.backlog.lag
    assert (measured.measured_at, measured.records, measured.oldest_at) == (2000.0, 5, 1999.0)
    assert len(readers) == 1 and not readers[0].closed  # one consumer for both measurements

    # Its stream caught up again: the consumer, not needed, ends; the next need starts another.
    seen[0] = lag.Lag(1002.0, {("t", 0): 45, ("t", 1): 7}, {})
    report.measure_lag()
    assert readers[0].closed and len(asked) == 2
    seen[0] = None
    report.measure_lag()
    assert len(readers) == 2 and not readers[1].closed and len(asked) == 3
