"""Airflow's scheduler restarted under a running flow: the mirror DAG on a real scheduler
(LocalExecutor), records flowing, the scheduler's whole session SIGKILLed (a crashed host or
container: the task and its job go with it) and then its process alone (the task's supervisor
lives on), each time started again.

Nothing is lost and, exactly-once, nothing is repeated; no two jobs of the flow ever run at once;
the restarted scheduler resets the dead scheduler's task and the flow resumes from its positions.
See docs/development.md, *Faults and soak*.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from mirrorflow.airflow import rendering
from mirrorflow.devtools import faults
from mirrorflow.devtools.local_airflow import LocalAirflow
from mirrorflow.devtools.sandbox import free_port_block
from mirrorflow.runtime import jobs, launch
from tests.conftest import create_topics
from tests.mirror_harness import flow_file, progress, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.airflow]

FLOW = "primary->secondary"
# A restarted scheduler takes over the task of a scheduler whose heartbeat is older than
# `scheduler_health_check_threshold` (30 s by default), when it looks for orphaned tasks (at its
# start, then every `orphaned_tasks_check_interval`: 300 s by default). With LocalExecutor it
# cannot adopt them, so it resets them and they run again. These bound a flow's outage after a
# scheduler crash; docs/development.md says so. Shortened here.
ORPHAN_CHECK_S = 15


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAirflow]:
    base = tmp_path_factory.mktemp("scheduler")
    local = LocalAirflow(
        base / "airflow",
        base / "state",
        say=lambda _line: None,
        settings={
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": str(ORPHAN_CHECK_S),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": str(ORPHAN_CHECK_S),
        },
    )
    local.choose_port(free_port_block(1))  # not 8080: another test's api-server may be there
    local.migrate()
    local.dags_folder.mkdir(parents=True, exist_ok=True)
    leaders: list[int] = []
    try:
        local.start_services(("api-server", "dag-processor", "scheduler"))
        local.wait_for_api()
        yield local
    finally:
        leaders = list(local.running_services().values()) + KILLED_SESSIONS
        local.stop_services(say=lambda _line: None)
        # Whatever a killed scheduler's session left: its LocalExecutor's workers outlive a
        # scheduler killed alone (their parent gone, they ignore SIGTERM).
        for leader in leaders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, signal.SIGKILL)


class Traffic:
    """Numbered records (:func:`faults.produce_numbered`) produced on a thread, a batch a
    second, until stopped."""

    def __init__(self, cluster, topic: str, per_second: int = 40) -> None:
        self._cluster, self._topic, self._per_second = cluster, topic, per_second
        self._producer = Producer(
            {**cluster.client_config(), "enable.idempotence": True, "log_level": 0}
        )
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            faults.produce_numbered(
                self._cluster, self._topic, 2, self.sent, self._per_second, producer=self._producer
            )
            self.sent += self._per_second

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        assert self._producer.flush(30) == 0
        return self.sent


class JobWatch:
    """Samples the flow's mirror drivers on this machine; remembers the most seen at once."""

    def __init__(self, state: Path) -> None:
        self.state, self.most, self.seen = state, 0, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = jobs.mirror_processes(self.state, FLOW)
            self.most = max(self.most, len(pids))
            self.seen.update(pids)
            time.sleep(0.3)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


KILLED_SESSIONS: list[int] = []  # schedulers' sessions whose leader alone was killed


def scheduler_session(airflow: LocalAirflow) -> int:
    return airflow.running_services()["scheduler"]


def restart_and_resume(
    airflow: LocalAirflow, state: Path, topic: str, gone: int | None, restart: bool = True
) -> int:
    """Start the scheduler again; wait until a job (not ``gone``) copies more of the topic."""
    before = copied_positions(state, topic)
    if restart:
        airflow.start_services(("scheduler",))
    wait_for(
        lambda: driver(state) not in (None, gone) and copied_positions(state, topic) > before + 80,
        3 * ORPHAN_CHECK_S + 300,
        "the flow to go on after the scheduler's restart",
    )
    return driver(state)


def copied_positions(state: Path, topic: str) -> int:
    """How many of the topic's records the flow has copied (its positions on the source, which
    has no transaction markers), whichever job copied them."""
    positions = progress(state).get("source_positions", {}).get(topic, {})
    return sum(positions.values())


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)  # shown when the test fails


def driver(state: Path) -> int | None:
    pids = jobs.mirror_processes(state, FLOW)
    return pids[0] if len(pids) == 1 else None


@pytest.mark.timeout(1500)  # Airflow and two Spark jobs start: minutes on a busy machine
def test_a_restarted_scheduler_loses_and_repeats_nothing_and_runs_one_job(
    airflow: LocalAirflow, sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("sched")
    create_topics(primary, topic, partitions=2)
    config = flow_file(
        tmp_path,
        sandbox,
        topic,
        "secondary.exactly.once.source.support = enabled",
        "primary.consumer.isolation.level = read_committed",
    )
    result = rendering.render(
        [config], rendering.RenderOptions(retry_delay_seconds=5, max_retry_delay_seconds=10)
    )
    rendering.write(result, airflow.dags_folder)
    (mirror_dag,) = [d.dag_id for d in result.dags if d.kind == "mirror"]
    api = airflow.api()
    airflow.wait_for_dags(api, [mirror_dag])
    state = airflow.state / "flows"  # the tasks' MIRRORFLOW_STATE

    traffic = Traffic(primary, topic)
    watch = JobWatch(state)
    try:
        api.unpause(mirror_dag)
        wait_for(lambda: copied_positions(state, topic) >= 100, 300, "the DAG's first copies")
        first = driver(state)
        assert first is not None
        say(f"job {first} copies; the scheduler's session is killed")

        # 1. The scheduler's session dies at once (its host or container crashed): its
        # LocalExecutor's task, and with it the job, go too; nothing is left running.
        os.killpg(scheduler_session(airflow), signal.SIGKILL)
        wait_for(lambda: not jobs.process_alive(first), 30, "the job to die with its task")
        say("the job died with its task; the scheduler starts again")
        second = restart_and_resume(airflow, state, topic, first)

        # 2. The scheduler process alone is killed: its executor's worker and the task's
        # supervisor live on (still heartbeating to the api-server) until the restarted
        # scheduler resets the orphaned task; the flow goes on, in one job at a time.
        say(f"job {second} copies; the scheduler process alone is killed")
        KILLED_SESSIONS.append(scheduler_session(airflow))
        os.kill(KILLED_SESSIONS[-1], signal.SIGKILL)
        restart_and_resume(airflow, state, topic, None)
        time.sleep(3 * ORPHAN_CHECK_S)  # past the orphaned-task check: the flow goes on
        restart_and_resume(airflow, state, topic, None, restart=False)
        say(f"job {driver(state)} copies after the second restart")
    except BaseException:
        scheduler_log = (airflow.home / "logs" / "scheduler.log").read_text(errors="replace")
        for line in scheduler_log.splitlines():
            if any(w in line for w in ("orphan", "SchedulerJob", "UP_FOR_RETRY", "try_number")):
                print(line[:300])
        raise
    finally:
        sent = traffic.stop()
        say(f"{sent} records produced")
    try:
        wait_for(lambda: copied_positions(state, topic) >= sent, 180, "every record to be copied")
    finally:
        watch.stop()
        # Stopped as a user stops it: the DAG paused, its job asked to stop (its stop file).
        api.pause(mirror_dag)
        stop_file = launch.stop_file_for(state, FLOW)
        stop_file.parent.mkdir(parents=True, exist_ok=True)
        stop_file.touch()
        wait_for(lambda: not jobs.mirror_processes(state, FLOW), 120, "the job to stop")
    assert watch.most == 1, f"{watch.most} jobs of {FLOW} ran at once: {sorted(watch.seen)}"
    verdict = faults.verify(
        primary, topic, secondary, f"primary.{topic}", "mm2-offset-syncs.secondary.internal"
    )
    assert verdict.records == sent
    assert (verdict.total_lost, verdict.total_repeated) == (0, 0), verdict
    assert verdict.syncs and not verdict.wrong_syncs, verdict
