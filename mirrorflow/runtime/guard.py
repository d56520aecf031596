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
and watches its own launcher: once that is gone, it kills the job at once — unless a stop was
asked first (``--stop-file`` exists: the launcher was killed while the job was finishing its
batch, e.g. an Airflow task marked failed), in which case the job has until ``--grace`` seconds
after the request to end by itself. It exits with the job's exit code, after removing the
values its launcher handed the job (:func:`mirrorflow.config.providers.hand_over`) if the driver
has not already.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.2

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
    """``command`` run by the guard: it ends when its launcher does (see the module)."""
    prefix = [sys.executable, "-m", "mirrorflow.runtime.guard", "--grace", str(grace_s)]
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


def run(command: list[str], stop_file: Path | None, grace_s: float) -> int:
    """Run ``command`` until it ends or this process's launcher is gone (see the module)."""
    launcher = os.getppid()
    job = subprocess.Popen(command, preexec_fn=die_with_parent)

    def forward(signum, _frame):
        if job.poll() is None:
            job.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    orphaned = False
    while job.poll() is None:
        if os.getppid() != launcher:
            deadline = _stop_deadline(stop_file, grace_s)
            if not orphaned:
                orphaned = True
                print(
                    "mirrorflow: the launcher of this mirror job is gone: "
                    + (
                        "ending the job now"
                        if deadline is None
                        else f"the job has {max(0.0, deadline - time.time()):.0f}s to finish "
                        "its batch"
                    ),
                    file=sys.stderr,
                    flush=True,
                )
            if deadline is None or time.time() >= deadline:
                job.kill()  # the JVM; its driver and workers follow it
                break
        time.sleep(WATCH_INTERVAL_S)
    code = job.wait()
    from mirrorflow.config.providers import discard_handoff

    discard_handoff(os.environ)  # the driver deletes it at start; it may not have started
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mirrorflow.runtime.guard")
    parser.add_argument("--stop-file", type=Path, default=None)
    parser.add_argument("--grace", type=float, default=120.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    return run(command, args.stop_file, args.grace)


if __name__ == "__main__":
    sys.exit(main())
