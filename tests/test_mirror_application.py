"""Several flows in one Spark application: MirrorMaker 2's one process per site, with each flow
keeping its own progress, errors, pause and restart."""

from __future__ import annotations

import time

import pytest

from mirrorflow.runtime import jobs, launch
from tests.mirror_harness import (
    produce,
    progress,
    read_topic,
    site_flow_file,
    start_mirror,
    stop_job,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def count(cluster, topic: str) -> int:
    return sum(map(len, read_topic(cluster, topic).values()))


def test_flows_into_one_site_share_an_application_and_one_pauses_or_restarts_alone(
    sandbox, topic_name, tmp_path
):
    primary, secondary, tertiary = sandbox["primary"], sandbox["secondary"], sandbox["tertiary"]
    a, b = topic_name("site-a"), topic_name("site-b")
    topics = {"primary->secondary": a, "tertiary->secondary": b}
    config = site_flow_file(tmp_path, sandbox, topics, records=100)
    state, log = tmp_path / "state", tmp_path / "mirror.log"
    flows = ["primary->secondary", "tertiary->secondary"]
    stop_file = launch.stop_file_for(state, flows)
    job = start_mirror(config, flows, state, log, "--stop-file", str(stop_file))
    try:
        wait_for(lambda: progress(state, "primary-secondary").get("records", 0) >= 100, 120, "a")
        wait_for(lambda: progress(state, "tertiary-secondary").get("records", 0) >= 100, 60, "b")
        # Pause one flow (what its DAG's pause does): it ends, the other goes on.
        (state / "tertiary-secondary" / "paused").touch()
        wait_for(
            lambda: progress(state, "tertiary-secondary").get("state") == "PAUSED", 60, "a pause"
        )
        produce(primary, a, 2, 50, start=100)
        produce(tertiary, b, 2, 50, start=100)
        wait_for(lambda: count(secondary, f"primary.{a}") >= 150, 60, "the running flow's copies")
        time.sleep(3)
        assert count(secondary, f"tertiary.{b}") == 100, "the paused flow copied records"
        assert job.poll() is None, "the application ended with one flow paused"
        # Unpaused, the flow resumes from its positions.
        (state / "tertiary-secondary" / "paused").unlink()
        wait_for(lambda: count(secondary, f"tertiary.{b}") >= 150, 120, "the resumed flow")
        # A restart request (what the flow's DAG writes): the running flow starts over from
        # the requested position, the other flow and the application go on.
        jobs.request_restart(state / "tertiary-secondary", "earliest")
        wait_for(lambda: count(secondary, f"tertiary.{b}") >= 300, 120, "the restarted flow")
        assert jobs.restart_request(state / "tertiary-secondary") is None
        assert job.poll() is None
        stop_file.parent.mkdir(parents=True, exist_ok=True)
        stop_file.touch()  # what `mirrorflow mirror` and the operator do to stop the job
        assert job.wait(120) == 0
    finally:
        stop_job(job)
    # Resumed from its positions, then started over from the earliest: every record twice.
    assert count(secondary, f"tertiary.{b}") == 300, "the resumed or restarted flow's copies"
    assert count(secondary, f"primary.{a}") == 150
    assert "Traceback" not in log.read_text(errors="replace")
    for flow_dir in ("primary-secondary", "tertiary-secondary"):
        assert progress(state, flow_dir)["state"] == "STOPPED"
