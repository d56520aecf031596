"""Health alerts of the mirror DAG's task (``mirrorflow.airflow.alerts``): a real mirror job run
by a real Airflow task (``dag.test()``) on the sandbox, frozen with SIGSTOP, turns STALLED; the
task logs the alert at ERROR, calls the DAG author's ``on_alert``, stops the job and fails, and
its retry starts the job again. The transitions themselves (LAGGING, back to RUNNING, a failing
callback) are checked on progress files alone."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import textwrap
import time
from pathlib import Path

import pytest

from mirrorflow.airflow.alerts import HealthAlerts
from mirrorflow.runtime import jobs
from tests.conftest import create_topics
from tests.dag_harness import finish, start_dag_test
from tests.mirror_harness import flow_file, produce, progress, wait_for
from tests.test_mirror_dag import stop_everything

FLOW = "primary->secondary"
STALL_TIMEOUT_S = 15


def test_lagging_and_recovered_flows_are_alerted_once_each(tmp_path, caplog):
    config = tmp_path / "mm2.properties"
    config.write_text(
        "clusters = a, b\na.bootstrap.servers = 127.0.0.1:1\nb.bootstrap.servers = 127.0.0.1:1\n"
        "a->b.enabled = true\na->b.topics = t\na->b.health.lag.max.seconds = 60\n"
    )
    flow_dir = tmp_path / "flows" / "a-b"
    flow_dir.mkdir(parents=True)
    now = time.time()

    def report(caught_up_at: float) -> None:
        (flow_dir / "progress.json").write_text(
            json.dumps(
                {  # a job on another host: its process cannot be checked, its reports can
                    "state": "RUNNING",
                    "updated": now,
                    "caught_up_at": caught_up_at,
                    "lag_records": 7,
                    "pid": 1,
                    "host": "not-" + socket.gethostname(),
                }
            )
        )

    calls = []

    def on_alert(context, alert):
        calls.append((context, alert["state"], alert["previous"], alert["recovered"]))
        raise RuntimeError("the pager is down")  # must not stop the watch

    log = logging.getLogger("alerts-test")
    alerts = HealthAlerts(
        ["a->b"], [config], tmp_path / "flows", log=log, on_alert=on_alert, context="ctx"
    )
    report(now - 5)
    with caplog.at_level(logging.INFO, "alerts-test"):
        assert alerts.check(now) is None
        report(now - 300)
        assert alerts.check(now) is None and alerts.check(now) is None  # alerted once
        report(now - 5)
        assert alerts.check(now) is None
    assert calls == [("ctx", "LAGGING", "RUNNING", False), ("ctx", "RUNNING", "LAGGING", True)]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    # The reason says when the lag was known: here the job's last report, just now.
    assert errors[0] == (
        "mirrorflow alert: flow a->b is LAGGING: 300s behind (bound 60s) (measured 0s ago)"
    )
    assert errors[1].startswith("the on_alert callback failed for flow a->b: the pager is down")
    # Silent for a flow file it cannot read: the job itself says what is wrong.
    assert HealthAlerts(["x->y"], [config], tmp_path, log=log).check() is None


DAG_FILE = """
import json
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from mirrorflow.airflow.operators import MirrorFlowOperator

ALERTS = Path({alerts!r})


def page_someone(context, alert):
    # A DAG author's callback: here a file; in production an email, Slack or pager call.
    with ALERTS.open("a") as out:
        out.write(json.dumps({{**alert, "try": context["ti"].try_number}}) + "\\n")


with DAG("mirror_alerts", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    MirrorFlowOperator(
        task_id="mirror",
        flow_files=[{config!r}],
        flows=[{flow!r}],
        pause_check_interval=2,
        stop_grace_period=10,
        on_alert=page_someone,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )
"""


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.airflow
def test_a_frozen_job_is_alerted_stopped_and_started_again_by_its_task(
    sandbox, airflow_home, topic_name, tmp_path
):
    primary = sandbox["primary"]
    topic = topic_name("alerts")
    create_topics(primary, topic, partitions=2)
    produce(primary, topic, 2, 60)
    config = flow_file(
        tmp_path, sandbox, topic, f"{FLOW}.health.stall.timeout.seconds = {STALL_TIMEOUT_S}"
    )
    alerts = tmp_path / "alerts.jsonl"
    dag_file = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / "alerts" / "mirror_alerts.py"
    dag_file.parent.mkdir(parents=True, exist_ok=True)  # dag.test() runs DAGs of the folder
    dag_file.write_text(
        textwrap.dedent(DAG_FILE).format(alerts=str(alerts), config=str(config), flow=FLOW)
    )
    state, log = tmp_path / "state", tmp_path / "dag-test.log"
    flows = state / "flows"
    files = jobs.JobFiles.for_flow(FLOW, flows)
    run = start_dag_test(dag_file, state, log)
    frozen = None
    try:

        def copied(at_least: int, not_by: int | None = None) -> bool:
            assert run.poll() is None, "dag.test() ended:\n" + log.read_text()[-3000:]
            now = progress(flows)
            return now.get("pid") != not_by and now.get("records", 0) >= at_least

        wait_for(lambda: copied(60), 180, "the first copy")
        frozen, driver = files.running_pid(), progress(flows)["pid"]
        assert frozen is not None
        os.killpg(frozen, signal.SIGSTOP)  # the job hangs: no progress report, no heartbeat
        stalled_at = time.monotonic()
        wait_for(alerts.exists, STALL_TIMEOUT_S + 60, "the STALLED alert")
        alerted_after = time.monotonic() - stalled_at
        restarted = wait_for(
            lambda: (pid := files.running_pid()) not in (None, frozen) and pid,
            120,
            "the retry to start the job again",
        )
        produce(primary, topic, 2, 20, start=60)
        wait_for(
            lambda: (
                progress(flows).get("pid") != driver and progress(flows).get("records", 0) >= 20
            ),
            120,
            "copies after the restart",
        )
        assert not jobs.process_alive(frozen), "the frozen job was not stopped"
        files.request_stop()
        result = finish(run, log)
    finally:
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(frozen, signal.SIGCONT)
        stop_everything(run, files)
    assert result == {"state": "success", "tasks": {"mirror": ["success", 2]}}, result
    [alert] = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert (alert["flow"], alert["state"], alert["try"]) == (FLOW, "STALLED", 1), alert
    # Both bounds are the same: the frozen job's last report or its last acknowledged heartbeat,
    # whichever the task sees pass first, names the stall.
    stalls = ("no progress report from its mirror job for", "no heartbeat acknowledged by the")
    assert alert["reason"].startswith(stalls), alert
    assert alert["dag_id"] == "mirror_alerts" and not alert["recovered"]
    output = log.read_text()
    assert f"mirrorflow alert: flow {FLOW} is STALLED: {alert['reason']}" in output
    assert f"the mirror job of {FLOW} stalled, so it was stopped: flow {FLOW}: " in output
    assert not jobs.process_alive(restarted)
    print(f"STALLED alerted {alerted_after:.0f}s after the job froze (bound {STALL_TIMEOUT_S}s)")
    assert alerted_after <= STALL_TIMEOUT_S + 30, alerted_after
