"""The mirror job's Prometheus metrics: per remote topic-partition record counts that match the
target, lag per partition, the flow's state, served on 127.0.0.1 only; every metric the shipped
alert rules and Grafana dashboard query (``monitoring/``) is one a running job serves."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.lag import Lag
from mirrorflow.runtime import eos_writer, launch
from mirrorflow.runtime import metrics as metrics_mod
from mirrorflow.runtime.progress import Backlog
from tests import exposure
from tests.conftest import create_topics
from tests.mirror_harness import (
    end_offsets,
    flow_file,
    free_port,
    produce,
    produce_fresh,
    progress,
    read_topic,
    start_mirror,
    stop_job,
    wait_for,
)
from tests.test_least_privilege import commit
from tests.test_monitoring import queried_metrics


def scrape(port: int) -> dict[str, list]:
    """The endpoint's samples by sample name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def per_partition(samples: dict[str, list], name: str, topic: str) -> dict[int, float]:
    return {
        int(s.labels["partition"]): s.value
        for s in samples.get(name, [])
        if s.labels["topic"] == topic
        and s.labels["source"] == "primary"
        and s.labels["target"] == "secondary"
    }


def test_port_comes_from_the_option_else_the_environment(monkeypatch):
    monkeypatch.delenv(metrics_mod.PORT_ENV, raising=False)
    assert metrics_mod.port_from(None) == 0
    monkeypatch.setenv(metrics_mod.PORT_ENV, "9404")
    assert metrics_mod.port_from(None) == 9404
    assert metrics_mod.port_from(0) == 0  # the option wins, even to turn the endpoint off
    monkeypatch.setenv(metrics_mod.PORT_ENV, "nine")
    with pytest.raises(MirrorflowError, match="not a port number"):
        metrics_mod.port_from(None)


def test_flow_metrics_count_per_remote_partition_and_lag():
    m = metrics_mod.Metrics()
    flow = m.flow("a", "b")
    flow.state("RUNNING")
    flow.heartbeat()
    remote = {"t": "a.t"}
    Copied, Stats = metrics_mod.Copied, metrics_mod.Stats
    first = {
        ("t", 0): Copied(3, 30, Stats(10, 30, 60, 3), Stats(15, 40, 80, 3)),
        ("t", 1): Copied(2, 20, Stats(5, 5, 10, 2), Stats(7, 9, 16, 2)),
    }
    t0 = time.time()
    flow.batch(first, {("t", 0): 3, ("t", 1): 2}, {("t", 0): 5, ("t", 1): 2}, remote, t0)
    second = {("t", 0): Copied(2, 20, Stats(1, 2, 3, 2), Stats(100, 200, 300, 2))}
    flow.batch(second, {("t", 0): 5, ("t", 1): 2}, {("t", 0): 5, ("t", 1): 2}, remote, t0 + 1)
    value = m.registry.get_sample_value
    labels = {"source": "a", "target": "b", "topic": "a.t"}
    p0, p1 = {**labels, "partition": "0"}, {**labels, "partition": "1"}
    assert value("mirrorflow_record_count_total", p0) == 5
    assert value("mirrorflow_record_count_total", p1) == 2
    assert value("mirrorflow_lag_records", p0) == 0
    assert value("mirrorflow_byte_count_total", p0) == 50
    assert value("mirrorflow_byte_count_total", p1) == 20
    assert value("mirrorflow_batches_total", {"source": "a", "target": "b"}) == 2
    # Both batches are in the window: min, max and avg over their 5 records of partition 0.
    age = {s: value("mirrorflow_record_age_ms", {**p0, "stat": s}) for s in ("min", "max", "avg")}
    assert age == {"min": 1, "max": 30, "avg": 63 / 5}
    latency = value("mirrorflow_replication_latency_ms", {**p1, "stat": "max"})
    assert latency == 9
    assert value("mirrorflow_lag_seconds", p0) == 0
    # Partition 1 falls behind at a plan: its lag in seconds counts from when it was caught up.
    flow.lag({("t", 1): 2}, {("t", 1): 9}, remote, time.time())
    behind = value("mirrorflow_lag_seconds", p1)
    assert time.time() - t0 - 2 <= behind <= time.time() - t0 + 0.01
    flow.caught_up({("t", 1): 9}, remote, time.time())
    assert value("mirrorflow_lag_seconds", p1) == 0
    # The lag in records follows the plans and the measurements, whichever came last.
    assert value("mirrorflow_lag_records", p1) == 7
    flow.measured(Lag(time.time(), {("t", 1): 9}, {("t", 1): 9}), remote)
    assert value("mirrorflow_lag_records", p1) == 0
    flow.lag({("t", 1): 2}, {("t", 1): 9}, remote, time.time())
    assert value("mirrorflow_lag_records", p1) == 7
    flow.checkpoints({("g", "a.t", 0): 12.4})
    checkpoint = {"source": "a", "target": "b", "group": "g", "topic": "a.t", "partition": "0"}
    assert value("mirrorflow_checkpoint_latency_ms", {**checkpoint, "stat": "avg"}) == 12
    checked = value("mirrorflow_checkpoint_timestamp_seconds", {"source": "a", "target": "b"})
    assert time.time() - 5 < checked <= time.time()
    state = {"source": "a", "target": "b", "mirrorflow_flow_state": "RUNNING"}
    assert value("mirrorflow_flow_state", state) == 1
    beat = value("mirrorflow_heartbeat_timestamp_seconds", {"source": "a", "target": "b"})
    assert time.time() - 5 < beat <= time.time()


def test_latency_window_keeps_the_last_minute_else_the_last_batch():
    window = metrics_mod._Window()
    window.add(metrics_mod.Stats(100, 100, 100, 1), 1000.0)
    window.add(metrics_mod.Stats(5, 7, 12, 2), 1050.0)
    assert window.stats(1055.0) == metrics_mod.Stats(5, 100, 112, 3)
    assert window.stats(1070.0) == metrics_mod.Stats(5, 7, 12, 2)  # the first one left it
    assert window.stats(2000.0) == metrics_mod.Stats(5, 7, 12, 2)  # idle: the last batch's
    # Copies of one bucket (BUCKET_S) are kept as one sample: a stream reports every second.
    window.add(metrics_mod.Stats(1, 1, 1, 1), 2001.0)
    window.add(metrics_mod.Stats(3, 3, 3, 1), 2004.9)
    window.add(metrics_mod.Stats(9, 9, 9, 1), 2005.0)
    assert [at for at, _stats in window.samples] == [2000.0, 2005.0]
    assert window.stats(2006.0) == metrics_mod.Stats(1, 9, 13, 3)
    assert window.stats(2062.0) == metrics_mod.Stats(9, 9, 9, 1)  # the bucket of 2000 left it


def test_exactly_once_latency_counts_from_the_commit():
    p = eos_writer._Partition("t", 0, "a.t", producer=None, txn_id="mirrorflow-a->b-driver")
    for ts in (1_000, 1_500, 2_000):
        eos_writer._add(p.timestamps, ts)
    p.committed_at_ms = 2_100
    assert eos_writer._latency(p) == [100, 1_100, 3 * 2_100 - 4_500, 3]


EXACTLY_ONCE = (
    "secondary.exactly.once.source.support = enabled",
    "primary.consumer.isolation.level = read_committed",
)


def test_the_endpoint_serves_on_loopback_and_a_taken_port_fails_in_one_line():
    m = metrics_mod.Metrics()
    m.flow("a", "b").state("IDLE")
    port = m.serve(0)
    try:
        samples = scrape(port)
        [idle] = [s for s in samples["mirrorflow_flow_state"] if s.value == 1]
        assert idle.labels["mirrorflow_flow_state"] == "IDLE"
        with pytest.raises(MirrorflowError, match=f"cannot listen on 127.0.0.1:{port}"):
            metrics_mod.Metrics().serve(port)
    finally:
        m.close()


def record_bytes(records: list) -> dict[int, int]:
    """Bytes of keys, values, header keys and values per partition (MM2's byte-count)."""
    sizes: dict[int, int] = {}
    for r in records:
        size = len(r["key"] or b"") + len(r["value"] or b"")
        size += sum(len(k.encode()) + len(v or b"") for k, v in r["headers"] or [])
        sizes[r["partition"]] = sizes.get(r["partition"], 0) + size
    return sizes


def stats(samples: dict[str, list], name: str, topic: str) -> dict[int, dict[str, float]]:
    """``{partition: {stat: value}}`` of a min/max/avg gauge."""
    found: dict[int, dict[str, float]] = {}
    for s in samples.get(name, []):
        if s.labels["topic"] == topic:
            found.setdefault(int(s.labels["partition"]), {})[s.labels["stat"]] = s.value
    return found


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_scraped_record_counts_match_the_target_and_the_endpoint_is_loopback_only(
    sandbox, topic_name, tmp_path, exactly_once
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("metrics")
    remote = f"primary.{topic}"
    create_topics(primary, topic, partitions=2)
    group = f"{topic}-readers"
    # 51 records in partition 0, 50 in partition 1, stamped an hour ago
    sent = produce(primary, topic, 2, 101)
    lines = [
        f"primary->secondary.groups = {group}",
        "emit.checkpoints.interval.seconds = 1",
        "refresh.groups.interval.seconds = 1",
        *(EXACTLY_ONCE if exactly_once else ()),
    ]
    config = flow_file(tmp_path, sandbox, topic, *lines)
    state, log, port = tmp_path / "state", tmp_path / "mirror.log", free_port()
    stop_file = launch.stop_file_for(state, "primary->secondary")
    job = start_mirror(
        config,
        "primary->secondary",
        state,
        log,
        "--metrics-port",
        str(port),
        "--stop-file",
        str(stop_file),
        # at-least-once: the first batch (101 records) on the executors, the second copied by
        # the flow's stream, once caught up
        "--local-batch-max-records",
        "50",
    )
    try:
        wait_for(lambda: progress(state).get("records", 0) >= 101, 180, "the first copies")
        commit(primary, group, {(topic, 0): 30, (topic, 1): 30})
        # a second batch while the job runs, stamped now
        sent += produce_fresh(primary, topic, 2, 40, start=101)
        wait_for(lambda: progress(state).get("records", 0) >= 141, 120, "the second copies")

        def caught_up():
            samples = scrape(port)
            lag = per_partition(samples, "mirrorflow_lag_records", remote)
            return samples if lag == {0: 0, 1: 0} else None

        samples = wait_for(caught_up, 60, "lag 0 on both partitions")
        counts = per_partition(samples, "mirrorflow_record_count_total", remote)
        assert counts == {0: 71, 1: 70}
        on_target = {p: len(records) for p, records in read_topic(secondary, remote).items()}
        assert counts == on_target, "the metrics and the records on the target differ"
        if not exactly_once:  # exactly-once: transaction markers take offsets too
            assert counts == end_offsets(secondary, remote, 2)
        flow = {"source": "primary", "target": "secondary"}
        byte_counts = per_partition(samples, "mirrorflow_byte_count_total", remote)
        assert byte_counts == record_bytes(sent)

        # progress.json counts the flow's bytes in all its topics: with the heartbeats that
        # earlier tests' reverse flows left on the shared source, if any (two, 60 bytes, were).
        def flow_bytes(samples) -> float:
            return sum(
                s.value
                for s in samples.get("mirrorflow_byte_count_total", [])
                if (s.labels["source"], s.labels["target"]) == ("primary", "secondary")
            )

        wait_for(
            lambda: flow_bytes(scrape(port)) == progress(state)["bytes"],
            30,
            "the metrics' bytes and progress.json's to agree",
        )
        if not exactly_once:  # both copier paths: a batch on the executors, then the stream
            assert progress(state)["batches"] - progress(state)["local_batches"] >= 1
            assert "copying continuously" in log.read_text()

        # Both batches are within the minute: the old records' ages and latencies are over an
        # hour, the fresh ones' small; a copy is acknowledged after it was read.
        ages = stats(samples, "mirrorflow_record_age_ms", remote)
        latencies = stats(samples, "mirrorflow_replication_latency_ms", remote)
        assert set(ages) == set(latencies) == {0, 1}
        for p in (0, 1):
            age, latency = ages[p], latencies[p]
            assert 0 <= age["min"] <= age["avg"] <= age["max"], age
            assert 0 <= latency["min"] <= latency["avg"] <= latency["max"], latency
            assert age["max"] >= 3_600_000 - 200 and latency["max"] >= age["max"], (age, latency)
            assert latency["min"] < 60_000, latency  # fresh records, copied within seconds
            assert age["min"] <= latency["min"], (age, latency)
        lag_seconds = per_partition(samples, "mirrorflow_lag_seconds", remote)
        assert lag_seconds == {0: 0, 1: 0}

        def checkpointed():
            found = {
                int(s.labels["partition"]): s.value
                for s in scrape(port).get("mirrorflow_checkpoint_latency_ms", [])
                if s.labels["group"] == group and s.labels["stat"] == "max"
            }
            return found if set(found) == {0, 1} else None

        checkpoint_latency = wait_for(checkpointed, 60, "checkpoint latencies of both partitions")
        assert all(0 <= ms < 30_000 for ms in checkpoint_latency.values()), checkpoint_latency
        # The shipped alert rules and dashboard query only metrics this job serves.
        served = scrape(port)
        missing = queried_metrics() - set(served)
        assert not missing, f"monitoring/ queries metrics the job does not serve: {missing}"
        [checked] = served["mirrorflow_checkpoint_timestamp_seconds"]
        assert checked.labels == flow and time.time() - checked.value < 30
        current = [
            s.labels["mirrorflow_flow_state"]
            for s in samples["mirrorflow_flow_state"]
            if s.value == 1
        ]
        assert current in (["RUNNING"], ["IDLE"])
        # Heartbeats every second (the harness's flow file): the last one is fresh.
        [beat] = samples["mirrorflow_heartbeat_timestamp_seconds"]
        assert beat.labels == flow and time.time() - beat.value < 30

        found = [
            listener
            for listener in exposure.listeners(exposure.session_members(job.pid))
            if listener.port == port
        ]
        assert found, "no process of the job listens on the metrics port"
        assert all(listener.address == "127.0.0.1" for listener in found), found

        stop_file.parent.mkdir(parents=True, exist_ok=True)
        stop_file.touch()  # a clean stop after the batch, as `mirrorflow mirror` asks for it
        assert job.wait(120) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        stop_job(job)
    assert "Traceback" not in log.read_text(errors="replace")


def test_the_backlog_keeps_the_ends_that_date_the_oldest_record_not_copied():
    backlog = Backlog()
    tp = ("t", 0)
    backlog.planned_ends, backlog.plan_at = {tp: 10}, 3.0
    # Ends observed at 1 s, 1.5 s, 2 s, 3 s while the position stays at 4: of those at or below
    # the position only the last is kept (the oldest record not copied was written after it).
    backlog.observe({tp: 4}, {tp: 4}, 1_000)
    backlog.observe({tp: 4}, {tp: 4}, 1_500)  # still caught up: known later
    backlog.observe({tp: 7}, {tp: 4}, 2_000)
    backlog.observe({tp: 10}, {tp: 4}, 3_000)
    history = backlog.observed({tp: 4})["source_end_history"]
    assert history == {"t": {"0": [[1_500, 4], [2_000, 7], [3_000, 10]]}}
    backlog.observe({tp: 10}, {tp: 8}, 4_000)  # copied past 7: the entries below it go
    history = backlog.observed({tp: 8})["source_end_history"]
    assert history == {"t": {"0": [[2_000, 7], [3_000, 10]]}}
    backlog.observe({tp: 10}, {tp: 10}, 5_000)  # caught up: nothing to date
    assert backlog.history[tp] == [(5_000, 10)]
    assert backlog.observed({tp: 10})["source_end_history"] == {}
