"""Where a Python process spends its CPU, by thread and function: a sampler for benchmarks.

Put this directory first on ``PYTHONPATH`` and set ``MIRRORFLOW_CPU_PROFILE`` to a path: every
Python process started with that environment (the benchmark, the mirror job's driver: spark-submit
keeps ``PYTHONPATH``) then runs a daemon thread that, every 50 ms, charges each thread's CPU
since the last sample (its own clock, ``pthread_getcpuclockid``) to the Python stack it is in at
that moment, and every 30 s writes the totals so far to ``<path>.<pid>.<seconds>.json``:
CPU-seconds per thread name (its first word: ``flow``, ``renew-lease``; ``C-thread`` for threads
Python did not start, librdkafka's calling back), per function (inclusive) and per stack (its
six innermost frames). Two files of one process subtract to a window (the idle phase, say).

Threads in C code without a Python frame (librdkafka's own work) are not seen; Python's
sampling costs a little CPU of its own (``cpu-sampler``, not counted). ::

    MIRRORFLOW_CPU_PROFILE=/tmp/prof/p PYTHONPATH=$PWD/benchmarks/cpu_sampler:$PWD \\
        $venv/bin/python benchmarks/scale.py --topology mesh6 --only mirrorflow-one-process
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time

SAMPLE_S = 0.05
WRITE_EVERY_S = 30.0


def _stack(frame, depth: int = 6) -> str:
    parts = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        parts.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(parts)


def _functions(frame) -> set[str]:
    names = set()
    while frame is not None:
        names.add(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")
        frame = frame.f_back
    return names


def _sample(path: str) -> None:
    last: dict[int, float] = {}
    totals: dict[str, collections.Counter] = {
        name: collections.Counter() for name in ("threads", "functions", "stacks")
    }
    me, started = threading.get_ident(), time.monotonic()
    write_at = started + WRITE_EVERY_S
    while True:
        time.sleep(SAMPLE_S)
        frames = sys._current_frames()
        named = {t.ident: t.name for t in threading.enumerate()}
        for ident in set(named) | set(frames):
            if ident == me or ident is None:
                continue
            try:
                cpu = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except OSError:  # the thread ended
                continue
            spent, last[ident] = cpu - last.get(ident, cpu), cpu
            if spent <= 0:
                continue
            thread = (named.get(ident) or "C-thread").split(" ")[0]
            totals["threads"][thread] += spent
            frame = frames.get(ident)
            if frame is not None:
                totals["stacks"][f"{thread} | {_stack(frame)}"] += spent
                for function in _functions(frame):
                    totals["functions"][function] += spent
        if time.monotonic() >= write_at:
            write_at += WRITE_EVERY_S
            elapsed = time.monotonic() - started
            with open(f"{path}.{os.getpid()}.{int(elapsed)}.json", "w") as out:
                json.dump({"elapsed": elapsed, **{k: dict(v) for k, v in totals.items()}}, out)


if os.environ.get("MIRRORFLOW_CPU_PROFILE"):
    _path = os.environ["MIRRORFLOW_CPU_PROFILE"]
    threading.Thread(target=_sample, args=(_path,), name="cpu-sampler", daemon=True).start()
