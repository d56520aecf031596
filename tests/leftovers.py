"""Processes a test run leaves behind, checked after pytest has exited (``make test``).

Every process the run starts inherits ``MIRRORFLOW_TEST_RUN`` (set by ``make test``, else by
``tests/conftest.py``). Once pytest has exited, any process still carrying the run's id is a
leftover: it is ended, named, and fails the run. A process that ends with pytest (pyspark's
gateway, the MirrorMaker 2 oracle: they read pytest's end of a pipe) is gone by then.

    python -m tests.leftovers RUN_ID
"""

from __future__ import annotations

import sys

import psutil

from mirrorflow.runtime.processes import alive

VARIABLE = "MIRRORFLOW_TEST_RUN"
GRACE_S = 10.0  # processes ending with the run may take this long


def find(run_id: str) -> list[psutil.Process]:
    """The processes still running whose environment names the run."""
    found = []
    for process in psutil.process_iter(["environ"]):
        environment = process.info["environ"] or {}
        if environment.get(VARIABLE) == run_id and alive(process.pid):
            found.append(process)
    return found


def end(run_id: str) -> list[str]:
    """Wait :data:`GRACE_S` for the run's processes to end, SIGKILL those that did not, and
    describe them (pid, command line), one line each."""
    leftovers = find(run_id)
    if leftovers:
        psutil.wait_procs(leftovers, timeout=GRACE_S)
        leftovers = [p for p in leftovers if alive(p.pid)]
    described = []
    for process in leftovers:
        try:
            described.append(f"pid {process.pid}: {' '.join(process.cmdline())[:300]}")
            process.kill()
        except psutil.Error:
            continue
    return described


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0]:
        print("usage: python -m tests.leftovers RUN_ID", file=sys.stderr)
        return 2
    described = end(argv[0])
    for line in described:
        print(f"left behind by the test run (ended now): {line}", file=sys.stderr)
    return 1 if described else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
