"""The flow's periodic tasks: each on its own interval, failures counted, fatal ones surfaced."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.scheduler import Scheduler
from mirrorflow.runtime.launch import stop_file_for


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_each_task_runs_on_its_own_interval_and_its_runs_are_counted():
    scheduler = Scheduler("a->b")
    fast, slow = [], []
    scheduler.add("fast", 0.05, lambda: fast.append(time.monotonic()))
    scheduler.add("slow", 10.0, lambda: slow.append(time.monotonic()))
    scheduler.start()
    try:
        wait_until(lambda: len(fast) >= 4)
    finally:
        scheduler.stop()
    assert slow == [], "a task ran before its interval had passed"
    stats = scheduler.stats()
    assert stats["fast"]["runs"] == len(fast) and stats["fast"]["failures"] == 0
    assert stats["slow"]["runs"] == 0


def test_a_task_asked_to_run_soon_runs_at_once_then_keeps_its_interval():
    scheduler = Scheduler("a->b")
    runs: list[float] = []
    scheduler.add("refresh-topics", 60.0, lambda: runs.append(time.monotonic()))
    scheduler.start()
    try:
        time.sleep(0.2)
        assert runs == []  # first due in 60 s
        asked = time.monotonic()
        scheduler.run_soon("refresh-topics")
        wait_until(lambda: len(runs) == 1, 2.0)
        assert runs[0] - asked < 1.0
        scheduler.run_soon("no-such-task")  # nothing
        time.sleep(0.3)
        assert len(runs) == 1  # next due 60 s after that run
    finally:
        scheduler.stop()


def test_top_shows_which_task_a_thread_runs():
    """``top -H -p <driver pid>`` names each task's thread (the shared loop: ``tasks``)."""

    def os_name() -> str:
        return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()

    scheduler = Scheduler("a->b")
    seen: dict[str, str] = {}
    scheduler.add("renew-lease", 0.05, lambda: seen.setdefault("lease", os_name()), alone=True)
    scheduler.add(
        "report-progress-and-more", 0.05, lambda: seen.setdefault("report", os_name()), alone=True
    )
    scheduler.add("refresh-topics", 0.05, lambda: seen.setdefault("shared", os_name()))
    scheduler.start()
    try:
        wait_until(lambda: len(seen) == 3)
    finally:
        scheduler.stop()
    # Linux keeps 15 bytes of a name
    assert seen == {"lease": "renew-lease", "report": "report-progress", "shared": "tasks"}


def test_an_unreachable_cluster_is_counted_and_retried_but_other_errors_end_the_flow():
    scheduler = Scheduler("a->b")
    calls = []

    def flaky() -> None:
        calls.append(1)
        raise ClusterUnreachable("cluster b did not answer")

    task = scheduler.add("heartbeats", 1.0, flaky)
    scheduler.run_now(task)
    scheduler.run_now(task)
    assert scheduler.stats()["heartbeats"]["failures"] == 2
    assert "did not answer" in scheduler.stats()["heartbeats"]["last_error"]
    assert scheduler.error is None, "a retriable failure ended the flow"

    refused = MirrorflowError("cluster a refused principal bob while listing topics")
    scheduler.run_now(scheduler.add("refresh-topics", 1.0, lambda: (_ for _ in ()).throw(refused)))
    assert scheduler.error is refused


def test_an_unexpected_exception_is_counted_and_the_task_keeps_its_schedule():
    scheduler = Scheduler("a->b")
    runs = []

    def broken() -> None:
        runs.append(1)
        raise ValueError("bug")

    scheduler.add("broken", 0.05, broken)
    scheduler.start()
    try:
        wait_until(lambda: len(runs) >= 3)
    finally:
        scheduler.stop()
    assert scheduler.stats()["broken"]["failures"] >= 3
    assert scheduler.error is None


def test_one_stop_file_per_flow_and_one_per_application_of_several_flows(tmp_path):
    assert stop_file_for(tmp_path, "a->b") == tmp_path / "a-b" / "stop"
    assert stop_file_for(tmp_path, ["a->b"]) == tmp_path / "a-b" / "stop"
    assert stop_file_for(tmp_path, ["a->t", "c->t"]) == tmp_path / "to-t" / "stop"
    mixed = stop_file_for(tmp_path, ["a->b", "c->d"])
    assert mixed.parent.name.startswith("app-")
    assert mixed == stop_file_for(tmp_path, ["c->d", "a->b"]), "depends on the flows' order"
