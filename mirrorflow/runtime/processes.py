"""Processes on this machine, read through psutil (never by parsing ``/proc`` by hand).

A zombie (a process that has ended but that its parent has not reaped yet) counts as ended
everywhere here: a parent that reaps late (a test session that started a broker another
process killed) must not make a process look alive. For the same reason waits poll
:func:`alive` instead of ``psutil.wait_procs``, which waits out a zombie that is not this
process's child and reaps one that is, taking its exit status from the ``subprocess.Popen``
that started it.
"""

from __future__ import annotations

import contextlib
import os
import time

import psutil

_ENDED = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() not in _ENDED
    except psutil.Error:
        return False


def wait_for_exit(pid: int, timeout: float, interval: float = 0.25, reap: bool = False) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to end (see :func:`alive`); True if it did.
    ``reap``: collect its exit as well, should it be this process's child (only for one that no
    ``subprocess.Popen`` will ask for its exit status)."""
    deadline = time.monotonic() + timeout
    while True:
        ended = not alive(pid)
        if reap:  # after the check: one that ended between a reap and the check is reaped too
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if ended:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def command_line(pid: int) -> list[str]:
    """``pid``'s arguments (empty when it has ended or cannot be read)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def created(pid: int) -> float | None:
    """When ``pid`` started (epoch seconds; None: no such process): with the pid, its
    identity, which outlives a renamed command line."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children ...), ended ones not yet reaped
    included."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def session_members(session: int) -> list[int]:
    """Every live process of the session ``session`` (a process started with
    ``start_new_session``: its pid), however far below it or orphaned."""
    members = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError):
            if os.getsid(pid) == session and alive(pid):
                members.append(pid)
    return members
