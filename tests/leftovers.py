"""Processes a test session leaves behind: found at its end, ended, and named.

A process belongs to the session when it descends from pytest or, once its parent has died and
it was re-parented, when its command line or environment names the session (its run id, which
every process it starts inherits, or one of its directories). The py4j gateway of a Spark
session made in pytest's own process is no leftover: it ends with pytest (it reads pytest's
end of a pipe).
"""

from __future__ import annotations

import contextlib

import psutil

from mirrorflow.runtime.processes import alive

GRACE_S = 15.0  # processes being stopped at the session's end may take this long


def _is_gateway(process: psutil.Process, me: int) -> bool:
    with contextlib.suppress(psutil.Error):
        command = process.cmdline()
        return process.ppid() == me and "pyspark-shell" in command
    return False


def find(markers: tuple[str, ...]) -> list[psutil.Process]:
    """The processes still running that belong to this session (see the module)."""
    me = psutil.Process()
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        found.update({child.pid: child for child in me.children(recursive=True)})
    for process in psutil.process_iter(["cmdline", "environ"]):
        if process.pid == me.pid or process.pid in found:
            continue
        command = " ".join(process.info["cmdline"] or [])
        environment = "\n".join((process.info["environ"] or {}).values())
        if any(m in command or m in environment for m in markers):
            found[process.pid] = process
    return [p for p in found.values() if alive(p.pid) and not _is_gateway(p, me.pid)]


def end(markers: tuple[str, ...]) -> list[str]:
    """Wait :data:`GRACE_S` for this session's processes to end, SIGKILL those that did not,
    and describe them (pid, command line), one line each."""
    leftovers = find(markers)
    if leftovers:
        _gone, leftovers = psutil.wait_procs(leftovers, timeout=GRACE_S)
        leftovers = [p for p in leftovers if alive(p.pid)]
    described = []
    for process in leftovers:
        with contextlib.suppress(psutil.Error):
            described.append(f"pid {process.pid}: {' '.join(process.cmdline())[:300]}")
            process.kill()
    return described
