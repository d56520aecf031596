"""A flow's trend over the last hour, sampled by its running job: ``S-T/trend.json``.

Each run of the job's ``report-progress`` task (every 10 s, on the flow's periodic-task thread:
nothing is added to a batch) writes ``progress.json``, then :func:`sampled` appends one sample
to a ring of the last :data:`WINDOW_S` seconds and rewrites ``trend.json`` atomically (mode
0644: figures only, no secret). A sample holds:

- ``t``: when it was taken (Unix time);
- ``run``: which job's counters it read (the driver's pid, when the flow's job began, and a
  sequence number): a new run means the job restarted and its counters began again at 0;
- ``state``: the job's own state (STARTING, RUNNING, IDLE);
- ``lag_records`` and ``lag_seconds``: the flow's lag as its ``progress.json``, just written by
  ``report-progress``, gives it (the health model's rule: records as last planned or measured;
  seconds 0 when nothing is behind, else the age of the oldest record not copied; None when not
  known yet);
- ``records``: records copied since the job started (a counter, as Prometheus counters: it
  starts at 0 when the job starts);
- ``latency_ms``: the highest replication latency of the records the target acknowledged since
  the last sample (heartbeat topics left out: a stream copies those once a second), from the
  job's metrics (:meth:`FlowMetrics.take_latency`); None when
  nothing was copied meanwhile or the job has no metrics (no ``--metrics-port``).

Nothing is sampled while the job is frozen or stopped, so those times have no samples: the
reader (:mod:`mirrorflow.health.trends`) shows them as gaps, and derives records/s from
consecutive samples of one run.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mirrorflow import paths
from mirrorflow.replication import lag
from mirrorflow.runtime import jobs

if TYPE_CHECKING:
    from mirrorflow.runtime.driver import MirrorJob

log = logging.getLogger("mirrorflow.mirror")

TREND_FILE = "trend.json"
INTERVAL_S = 10.0  # as the flow's report-progress task (flow_tasks.REPORT_PROGRESS_S)
WINDOW_S = 3600.0  # the ring keeps the last hour
MODE = 0o644  # figures only: readable by whoever reads the state directory

Sample = dict[str, Any]
_JOBS = itertools.count(1)  # the jobs this process sampled


def read(flow_dir: Path) -> dict[str, Any]:
    """The flow's ``trend.json``: ``interval_s``, ``window_s`` and ``samples`` (oldest first;
    none when it has no file or an unreadable one)."""
    try:
        data = json.loads((flow_dir / TREND_FILE).read_text())
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    samples = data.get("samples")
    if not isinstance(samples, list):
        samples = []
    return {
        "interval_s": _number(data.get("interval_s")) or INTERVAL_S,
        "window_s": _number(data.get("window_s")) or WINDOW_S,
        "samples": [s for s in samples if isinstance(s, dict) and _number(s.get("t"))],
    }


def write(flow_dir: Path, flow: str, samples: list[Sample], interval_s: float) -> None:
    """Replace ``trend.json`` atomically: one sample a line, readable by people."""
    _write_lines(flow_dir, flow, [_line(sample) for sample in samples], interval_s)


def _line(sample: Sample) -> str:
    return json.dumps(sample, separators=(",", ":"))


def _write_lines(flow_dir: Path, flow: str, lines: list[str], interval_s: float) -> None:
    """:func:`write` of samples already encoded, a line each."""
    header = {"flow": flow, "interval_s": interval_s, "window_s": WINDOW_S}
    text = json.dumps(header)[:-1] + ', "samples": [\n' + ",\n".join(lines) + "\n]}\n"
    paths.write_atomically(flow_dir / TREND_FILE, text, MODE)


def lag_seconds(progress: dict[str, Any], now: float) -> float | None:
    """Seconds behind, as the health model reads ``progress.json``
    (:func:`mirrorflow.replication.lag.progress_lag`): 0 when nothing is behind, else the age of
    the oldest record not copied (None: not known yet)."""
    seconds = lag.progress_lag(progress, now)[1]
    return None if seconds is None else round(seconds, 1)


class Sampler:
    """One job's sampler (:func:`sampled` makes it): called every :data:`INTERVAL_S`."""

    def __init__(self, job: MirrorJob, interval_s: float) -> None:
        self._job = weakref.ref(job)
        self.flow, self.flow_dir, self.interval_s = job.spec.flow, job.flow_dir, interval_s
        # the driver's pid, when the job began (ms) and which of its jobs this is
        self.run = f"{os.getpid()}-{round(time.time() * 1000)}-{next(_JOBS)}"
        # (t, the sample's line): read from the file at the first sample, each encoded once (an
        # hour's 360, encoded at every write, took 1.8 ms of CPU per write)
        self.samples: deque[tuple[float, str]] | None = None
        self._failed = False

    def __call__(self) -> None:
        job = self._job()
        if job is None:
            return
        now = time.time()
        try:
            if self.samples is None:
                found = read(self.flow_dir)["samples"]
                self.samples = deque((float(s["t"]), _line(s)) for s in found)
            self.samples.append((now, _line(self.sample(job, now))))
            while self.samples and self.samples[0][0] < now - WINDOW_S:
                self.samples.popleft()
            lines = [line for _t, line in self.samples]
            _write_lines(self.flow_dir, self.flow, lines, self.interval_s)
            self._failed = False
        except OSError as exc:  # a full disk must not end the flow: said once, tried again
            if not self._failed:
                log.warning("%s: its trend could not be written: %s", self.flow, exc)
            self._failed = True

    def sample(self, job: MirrorJob, now: float) -> Sample:
        """The flow's figures now, from the ``progress.json`` the job just wrote and its
        metrics."""
        progress = jobs.read_progress(self.flow_dir)
        latency = None
        if job.metrics is not None:
            # Not the heartbeat topics': a stream copies them once a second, on purpose.
            stats = job.metrics.take_latency(job.spec.is_heartbeats_topic)
            latency = stats.high if stats.count else None
        return {
            "t": round(now, 2),
            "run": self.run,
            "state": progress.get("state"),
            "lag_records": progress.get("lag_records"),
            "lag_seconds": lag_seconds(progress, now),
            "records": progress.get("records"),
            "latency_ms": latency,
        }


# Each job's sampler, as long as the job lives (a sampler refers to its job weakly, or the job
# would never leave this map).
_SAMPLERS: weakref.WeakKeyDictionary[MirrorJob, Sampler] = weakref.WeakKeyDictionary()


def sampled(
    job: MirrorJob, report: Callable[[], None], interval_s: float = INTERVAL_S
) -> Callable[[], None]:
    """``report`` (the job's ``report-progress``), then a sample of what it wrote. The job's
    sampler is the same for every try of the job (after an outage its counters go on), a new
    one, with a new ``run``, for a new job (whose counters start at 0)."""
    if job not in _SAMPLERS:
        _SAMPLERS[job] = Sampler(job, interval_s)
    sample = _SAMPLERS[job]

    def report_and_sample() -> None:
        report()
        sample()

    return report_and_sample


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
