"""When a streaming flow reads its remote topics' size limits again: at every topic refresh
while it copies in batches; while it streams, at once when its producer splits a refused
batch, else every ``sync.topic.configs.interval.seconds`` (pure logic; the stream's real
case, a limit lowered under its batches, is in ``test_continuous.py``)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from mirrorflow.replication.scheduler import Scheduler
from mirrorflow.runtime.streaming import FlowStream


def stream(sync_interval_s: float) -> tuple[FlowStream, list[float]]:
    scheduler = Scheduler("a->b")
    refreshes: list[float] = []
    scheduler.add("refresh-topics", 30.0, lambda: refreshes.append(time.monotonic()))
    spec = SimpleNamespace(flow="a->b", sync_configs_interval_s=sync_interval_s)
    return FlowStream(SimpleNamespace(spec=spec, scheduler=scheduler)), refreshes


def test_batches_read_the_limits_at_every_refresh():
    flow, _ = stream(600.0)
    assert [flow.limits_due() for _ in range(3)] == [True, True, True]


def test_a_stream_reads_them_at_its_first_refresh_then_only_when_its_producer_splits_a_batch():
    flow, refreshes = stream(600.0)
    flow.running = True
    assert flow.limits_due()  # the first refresh since the stream started
    assert not flow.limits_due() and not flow.limits_due()
    flow.job.scheduler.start()
    try:
        flow._batches_split()
        deadline = time.monotonic() + 2
        while not refreshes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert refreshes, "the refresh did not run at once"
    finally:
        flow.job.scheduler.stop()
    assert flow.limits_due()
    assert not flow.limits_due()


def test_a_stream_reads_them_again_after_the_config_sync_interval():
    flow, _ = stream(0.2)
    flow.running = True
    assert flow.limits_due()
    assert not flow.limits_due()
    time.sleep(0.25)
    assert flow.limits_due()
