"""A flow's periodic work as named tasks, each on its own MirrorMaker 2 interval.

MirrorMaker 2 refreshes its topic list every ``refresh.topics.interval.seconds`` and emits
heartbeats every ``emit.heartbeats.interval.seconds``; checkpoints and config sync follow the same
pattern. Here each such job is a :class:`PeriodicTask`: named, run at its interval on the
scheduler's daemon thread (or, ``alone``, on a thread of its own: the heartbeats and the
progress reports keep their pace while a sync waits out a cluster's timeout), timed, logged,
and with its failures counted, so a failing task shows up in the log
and in :meth:`Scheduler.stats` without taking the flow down. A task that must end the flow
records its error with :meth:`Scheduler.fail`; the flow's loop checks :attr:`Scheduler.error`;
a task whose run failed but must not end the flow raises :class:`TaskFailed`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mirrorflow.errors import ClusterUnreachable, MirrorflowError

log = logging.getLogger(__name__)


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` in the OS as well (its first 15 bytes, Linux's limit),
    so that ``top -H -p <driver pid>`` and ``ps -L`` show which task a thread runs (Python
    before 3.14 leaves every thread named ``python``). Nothing where ``prctl`` is missing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


class TaskFailed(Exception):
    """A task's run failed (a refused sync, say): counted and logged, and the flow goes on."""


@dataclass
class PeriodicTask:
    """One named job run every ``interval_s`` seconds (the first run at once)."""

    name: str
    interval_s: float
    run: Callable[[], object]
    runs: int = 0
    failures: int = 0
    last_duration_s: float = 0.0
    last_error: str | None = None
    last_run_at: float | None = None  # Unix time when the last run ended
    last_success_at: float | None = None  # Unix time when the last successful run ended
    next_due: float = field(default=0.0, repr=False)
    # Since when (monotonic) every run failed because a cluster did not answer, and the last
    # such error; None once a run succeeds or fails otherwise.
    unreachable_since: float | None = field(default=None, repr=False)
    unreachable: ClusterUnreachable | None = field(default=None, repr=False)
    alone: bool = field(default=False, repr=False)  # runs on a thread of its own


class Scheduler:
    """Runs :class:`PeriodicTask` s on one daemon thread (those ``alone``, each on its own)
    until :meth:`stop`.

    A :class:`~mirrorflow.errors.ClusterUnreachable` is counted and logged, and the task runs
    again at its next interval; any other :class:`~mirrorflow.errors.MirrorflowError` ends the
    flow (:attr:`error`). Other exceptions are counted and logged, never raised.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.tasks: list[PeriodicTask] = []
        self.error: MirrorflowError | None = None
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []

    def add(
        self, name: str, interval_s: float, run: Callable[[], object], *, alone: bool = False
    ) -> PeriodicTask:
        """A task run every ``interval_s`` (first in ``interval_s``); ``alone``: on a thread of
        its own, so that no other task's slow run delays it (add such tasks before
        :meth:`start`)."""
        if interval_s <= 0:
            raise ValueError(f"task {name}: the interval must be positive, not {interval_s}")
        task = PeriodicTask(
            name, interval_s, run, next_due=time.monotonic() + interval_s, alone=alone
        )
        self.tasks.append(task)
        self._wake.set()
        return task

    def run_soon(self, name: str) -> None:
        """Run the shared task ``name`` (not ``alone``) as soon as the scheduler's thread is free,
        rather than at its next interval (any thread); nothing if there is no such task."""
        for task in self.tasks:
            if task.name == name and not task.alone:
                task.next_due = time.monotonic()
                self._wake.set()

    def run_now(self, task: PeriodicTask) -> None:
        """Run ``task`` on the calling thread, counted and timed like a scheduled run."""
        started = time.monotonic()
        unreachable = False
        try:
            task.run()
            task.last_error = None
            task.last_success_at = time.time()
        except ClusterUnreachable as exc:
            unreachable = True
            if task.unreachable_since is None:
                task.unreachable_since = started
            task.unreachable = exc
            self._failed(task, exc)
        except MirrorflowError as exc:
            self._failed(task, exc)
            self.fail(exc)
        except Exception as exc:  # a periodic task must never kill the thread silently
            self._failed(task, exc)
        finally:
            if not unreachable:
                task.unreachable_since, task.unreachable = None, None
            task.runs += 1
            task.last_run_at = time.time()
            task.last_duration_s = time.monotonic() - started
            task.next_due = started + task.interval_s

    def _failed(self, task: PeriodicTask, exc: Exception) -> None:
        task.failures += 1
        task.last_error = str(exc)
        log.warning("%s: task %s failed (%d so far): %s", self.owner, task.name, task.failures, exc)

    def fail(self, error: MirrorflowError) -> None:
        if self.error is None:
            self.error = error

    def start(self) -> None:
        loops: list[tuple[str, Callable[..., None], tuple[PeriodicTask, ...]]]
        loops = [(f"tasks {self.owner}", self._loop, ())]
        loops += [(f"{t.name} {self.owner}", self._alone, (t,)) for t in self.tasks if t.alone]
        for name, target, args in loops:
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()

    def _loop(self) -> None:
        name_os_thread("tasks")
        while not self._stopped.is_set():
            now = time.monotonic()
            shared = [t for t in self.tasks if not t.alone]
            for task in shared:
                if task.next_due <= now and not self._stopped.is_set():
                    self.run_now(task)
            # Until the next task is due: add, run_soon and stop wake it sooner.
            due = min((t.next_due for t in shared), default=now + 60.0)
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()

    def _alone(self, task: PeriodicTask) -> None:
        name_os_thread(task.name)
        while not self._stopped.wait(max(0.0, task.next_due - time.monotonic())):
            self.run_now(task)

    def stop(self, wait_s: float = 30.0) -> None:
        """Stop the tasks; wait up to ``wait_s`` in all for the runs in progress to end."""
        self._stopped.set()
        self._wake.set()
        deadline = time.monotonic() + wait_s
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def unreachable(self) -> tuple[float, ClusterUnreachable] | None:
        """The longest run of failures because a cluster did not answer, among the tasks
        failing so now: since when (monotonic), and its last error; None if no task is."""
        failing = [t for t in self.tasks if t.unreachable_since is not None and t.unreachable]
        if not failing:
            return None
        task = min(failing, key=lambda t: t.unreachable_since or 0.0)
        assert task.unreachable_since is not None and task.unreachable is not None
        return task.unreachable_since, task.unreachable

    def stats(self) -> dict[str, dict[str, object]]:
        """Per task: runs, failures, the last run's duration and error, and when the last run
        and the last successful run ended (Unix time, None before the first)."""
        return {
            t.name: {
                "interval_s": t.interval_s,
                "runs": t.runs,
                "failures": t.failures,
                "last_duration_s": round(t.last_duration_s, 3),
                "last_error": t.last_error,
                "last_run_at": _rounded(t.last_run_at),
                "last_success_at": _rounded(t.last_success_at),
            }
            for t in self.tasks
        }


def _rounded(at: float | None) -> float | None:
    return None if at is None else round(at, 3)
