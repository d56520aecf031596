"""A flow's last hour as series a person can read: lag, records/s, replication latency.

From the samples its job wrote to ``S-T/trend.json`` (:mod:`mirrorflow.runtime.trend`, one per
report, every 10 s), pure logic with the time passed in:

- ``lag_records``, ``lag_seconds`` and ``latency_ms`` are the samples' own figures;
- ``rate`` (records/s) is the difference of two consecutive samples' counters of records copied
  over the time between them, placed at the later one. A sample of another ``run`` than the one
  before it, or whose counter went down, means the job restarted (its counters began again at
  0, as Prometheus counters do): it is a **restart**, with no rate, never a negative one;
- a time without samples for more than :data:`GAP_INTERVALS` intervals (the job frozen, stopped,
  or not yet started) is a **gap**: series break there, never bridged by a line.

The trend spans the last hour, or less when the samples began later (at least
:data:`MIN_SPAN_S`): a flow whose history is five minutes old shows those five minutes across
its charts, not squeezed into their last pixels.

Each series has its current value (the last sample's, unless that is older than a gap: then
none), and its minimum and maximum over the hour.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, overload

from mirrorflow.runtime import trend as sampled

GAP_INTERVALS = 2.5  # no sample for this many intervals: the job did not report, a gap
MIN_SPAN_S = 300.0  # the shortest time a trend spans
SERIES = {  # name: (what it shows, its unit)
    "lag_records": ("Lag", "records"),
    "lag_seconds": ("Lag", "s"),
    "rate": ("Copied", "records/s"),
    "latency_ms": ("Replication latency, max", "ms"),
}

Point = tuple[float, float]


@dataclass
class Series:
    """One figure over the window: its drawn segments (points, oldest first; a segment ends
    at a gap, a missing value or, for the rate, a restart), current value, min and max."""

    name: str
    title: str
    unit: str
    segments: list[list[Point]] = field(default_factory=list)
    current: float | None = None
    low: float | None = None
    high: float | None = None

    @property
    def points(self) -> list[Point]:
        return [p for segment in self.segments for p in segment]


@dataclass
class Trend:
    """A flow's last hour (or less, see :func:`derive`): from ``start`` to ``end`` (now), its
    series, the times without samples (``gaps``, as (from, to)) and the job's restarts."""

    start: float
    end: float
    interval_s: float
    samples: int
    last_sample_at: float | None
    gaps: list[tuple[float, float]]
    restarts: list[float]
    series: dict[str, Series]

    def as_dict(self, points: bool = True) -> dict[str, Any]:
        """As JSON: every series with its points (``points``), else only its figures."""
        data = asdict(self)
        for name, series in self.series.items():
            entry = data["series"][name]
            entry.pop("segments")
            if points:
                entry["segments"] = [[list(p) for p in s] for s in series.segments]
        return data


def derive(
    samples: list[dict[str, Any]],
    now: float,
    interval_s: float = sampled.INTERVAL_S,
    window_s: float = sampled.WINDOW_S,
) -> Trend:
    """The trend at ``now`` of ``samples`` (a job's, any order; those outside the window are
    left out). It starts at the first sample, at most ``window_s`` and at least
    :data:`MIN_SPAN_S` before ``now``."""
    start, bound = now - window_s, GAP_INTERVALS * interval_s
    kept = sorted(
        (s for s in samples if start <= _number(s.get("t"), -1.0) <= now),
        key=lambda s: float(s["t"]),
    )
    if kept:
        start = max(start, min(float(kept[0]["t"]), now - MIN_SPAN_S))
    series = {name: Series(name, *about) for name, about in SERIES.items()}
    gaps: list[tuple[float, float]] = []
    restarts: list[float] = []
    previous: dict[str, Any] | None = None
    drawing = dict.fromkeys(SERIES, False)  # whether the series' last segment goes on
    for sample in kept:
        t = float(sample["t"])
        gap = previous is None or t - float(previous["t"]) > bound
        if previous is None and t - start > bound:
            gaps.append((start, t))
        elif previous is not None and gap:
            gaps.append((float(previous["t"]), t))
        restarted = previous is not None and _restarted(previous, sample)
        if restarted:
            restarts.append(t)
        values = {name: _number(sample.get(name)) for name in SERIES if name != "rate"}
        values["rate"] = None if gap or restarted else _rate(previous, sample)
        for name, value in values.items():
            if value is None:  # nothing to draw: the line stops here
                drawing[name] = False
                continue
            if gap or not drawing[name]:
                series[name].segments.append([])
            series[name].segments[-1].append((t, value))
            drawing[name] = True
        previous = sample
    last = float(previous["t"]) if previous is not None else None
    if last is None:
        gaps.append((start, now))
    elif now - last > bound:
        gaps.append((last, now))
    fresh = last is not None and now - last <= bound
    for s in series.values():
        drawn = [v for _t, v in s.points]
        s.low, s.high = (min(drawn), max(drawn)) if drawn else (None, None)
        ended = s.segments and s.segments[-1] and s.segments[-1][-1][0] == last
        s.current = s.segments[-1][-1][1] if fresh and ended else None
    return Trend(start, now, interval_s, len(kept), last, gaps, restarts, series)


def flow_trend(flow_dir: Path, now: float) -> Trend:
    """The trend of the flow whose job's files are in ``flow_dir``."""
    data = sampled.read(flow_dir)
    return derive(data["samples"], now, data["interval_s"], data["window_s"])


def _restarted(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """A new job's counters: another run, or a counter that went down."""
    if before.get("run") != after.get("run"):
        return True
    old, new = _number(before.get("records")), _number(after.get("records"))
    return old is not None and new is not None and new < old


def _rate(before: dict[str, Any] | None, after: dict[str, Any]) -> float | None:
    if before is None:
        return None
    old, new = _number(before.get("records")), _number(after.get("records"))
    elapsed = float(after["t"]) - float(before["t"])
    if old is None or new is None or new < old or elapsed <= 0:
        return None
    return (new - old) / elapsed


@overload
def _number(value: object, default: float) -> float: ...
@overload
def _number(value: object, default: None = None) -> float | None: ...
def _number(value: object, default: float | None = None) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return default
