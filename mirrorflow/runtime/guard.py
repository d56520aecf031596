"""A mirror job dies with whoever launched it: the guard between a launcher and ``spark-submit``.

    python -m mirrorflow.runtime.guard [--stop-file PATH] [--grace SECONDS] -- spark-submit …

A mirror job is three processes: ``spark-submit`` (a script that becomes the ``java``
``SparkSubmit`` JVM, whose threads are the executors in local mode), the Python driver the JVM
starts (``spark_jobs/mirror.py``), and, in exactly-once mode, the JVM's Python workers. The
launcher (``mirrorflow mirror``, an Airflow task, a test) starts the job in a process group of its
own, so that a signal meant for the launcher never cuts a batch short; without more, killing the
launcher (``kill -9 -<pgid>``, a crash) left the whole job running.

The guard is that process group's leader and the JVM's parent. It runs the command with
``PR_SET_PDEATHSIG`` (:func:`die_with_parent`): the kernel kills the JVM when the guard ends,
however it ends. The driver sets the same on itself (its parent is the JVM), and the Python
workers end when the JVM closes their input. The guard forwards SIGTERM and SIGINT to the JVM,
and watches its own launcher, whose pid the launcher writes on the guard's command line
(``--launcher``): a launcher that died before the guard's Python started is noticed as surely
as one that dies later (read from the guard itself, the parent could already be pid 1).

Once the launcher is gone:

* a job that has not begun copying is killed at once, with everything it started (nothing is
  lost: it holds no batch); if the launcher died before the job was started, it never is;
* a job that is copying (its driver said so: :func:`copying`) gets its grace period: the guard
  asks it to stop after its batch (``--stop-file``, unless the launcher asked first, e.g. an
  Airflow task marked failed) and kills it only ``--grace`` seconds after the request. So an
  Airflow task that is SIGKILLed, with or without a SIGTERM first, never cuts a batch short.

Whatever it writes cannot end it: a launcher that read its output through a pipe and died
leaves that pipe broken, and the guard's messages are then dropped, not raised. It exits with
the job's exit code, after removing the values its launcher handed the job
(:func:`mirrorflow.config.providers.hand_over`) if the driver has not already.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.1
GUARD_PID_ENV = "MIRRORFLOW_GUARD_PID"  # set for the job: where the driver says it is copying
COPYING_SIGNAL = signal.SIGUSR1

_prctl: Callable[..., int] | None
try:  # looked up here, not in a forked child (``preexec_fn``), where loading could deadlock
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent ends (Linux
    ``prctl(PR_SET_PDEATHSIG)``; it survives ``exec``, and follows the parent *thread* that
    started the process). A no-op where there is no prctl. Safe as a ``preexec_fn``."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def guarded(command: list[str], stop_file: Path | None = None, grace_s: float = 120.0) -> list[str]:
    """``command`` run by the guard: it ends when its launcher does (see the module). The
    launcher is the process calling this, which must start the command itself."""
    prefix = [sys.executable, "-m", "mirrorflow.runtime.guard", "--grace", str(grace_s)]
    prefix += ["--launcher", str(os.getpid())]
    if stop_file is not None:
        prefix += ["--stop-file", str(stop_file)]
    return [*prefix, "--", *command]


def _stop_deadline(stop_file: Path | None, grace_s: float) -> float | None:
    """When a job asked to stop must have ended (wall clock), or None if no stop was asked."""
    if stop_file is None:
        return None
    try:
        return stop_file.stat().st_mtime + grace_s
    except OSError:
        return None


def copying() -> None:
    """Tell the job's guard that the job is copying (its driver holds its flows' leases), so
    that losing the launcher from now on asks the job to stop instead of killing it. A no-op
    for a job run without a guard."""
    pid = os.environ.get(GUARD_PID_ENV, "")
    if not pid.isdigit():
        return
    import psutil

    with contextlib.suppress(psutil.Error, OSError):
        if int(pid) in {p.pid for p in psutil.Process().parents()}:  # not a reused pid
            os.kill(int(pid), COPYING_SIGNAL)


def _say(message: str) -> None:
    """Write a line for the launcher's log, which may be a pipe nobody reads any more."""
    with contextlib.suppress(OSError, ValueError):
        print(f"mirrorflow: {message}", file=sys.stderr, flush=True)


def _kill_job(job: subprocess.Popen) -> None:
    """End the job at once: the JVM and whatever it started (spark-submit's launcher too)."""
    from mirrorflow.runtime import processes

    below = processes.descendants(job.pid)
    with contextlib.suppress(OSError):
        job.kill()  # the JVM; its driver and workers follow it (PR_SET_PDEATHSIG)
    for pid in below:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def run(command: list[str], stop_file: Path | None, grace_s: float, launcher: int | None) -> int:
    """Run ``command`` until it ends or this process's launcher is gone (see the module)."""
    launcher = launcher or os.getppid()
    if os.getppid() != launcher:  # gone before this Python started: nothing to start
        _say("the launcher of this mirror job is gone before the job started: not starting it")
        return 128 + signal.SIGKILL
    is_copying = []
    signal.signal(COPYING_SIGNAL, lambda *_: is_copying.append(True))
    job = subprocess.Popen(
        command,
        preexec_fn=die_with_parent,
        env={**os.environ, GUARD_PID_ENV: str(os.getpid())},
    )

    def forward(signum, _frame):
        if job.poll() is None:
            job.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    deadline: float | None = None
    while job.poll() is None:
        if os.getppid() != launcher:
            if deadline is None:
                deadline = _orphaned(stop_file, grace_s, bool(is_copying))
            if time.time() >= deadline:
                _kill_job(job)
                break
        time.sleep(WATCH_INTERVAL_S)
    code = job.wait()
    from mirrorflow.config.providers import discard_handoff

    discard_handoff(os.environ)  # the driver deletes it at start; it may not have started
    return code if code >= 0 else 128 - code


def _orphaned(stop_file: Path | None, grace_s: float, is_copying: bool) -> float:
    """The launcher is gone: when the job must have ended (wall clock), asking a copying job
    to stop after its batch if nobody has yet."""
    if not is_copying or stop_file is None:
        _say("the launcher of this mirror job is gone: ending the job now")
        return 0.0
    deadline = _stop_deadline(stop_file, grace_s)
    if deadline is None:
        with contextlib.suppress(OSError):
            stop_file.parent.mkdir(parents=True, exist_ok=True)
            stop_file.touch()
        deadline = time.time() + grace_s
    _say(
        "the launcher of this mirror job is gone: the job has "
        f"{max(0.0, deadline - time.time()):.0f}s to finish its batch"
    )
    return deadline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mirrorflow.runtime.guard")
    parser.add_argument("--stop-file", type=Path, default=None)
    parser.add_argument("--grace", type=float, default=120.0)
    parser.add_argument("--launcher", type=int, default=None, help="the launcher's pid")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    return run(command, args.stop_file, args.grace, args.launcher)


if __name__ == "__main__":
    sys.exit(main())
