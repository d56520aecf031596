"""A flow's trends drawn for the Replication pages: charts and sparklines as SVG geometry.

Pure geometry, no Airflow and no files, as :mod:`.graph` draws the topology: :func:`chart`
turns a :class:`~mirrorflow.health.trends.Series` of the last hour into the paths, gap areas,
restart marks and axis ticks (labels with their units and thousands separators) that the
pages' templates (``templates/ui/charts.html.j2``) write as inline SVG; :func:`sparkline` is its
small form for the flows' table. Time runs left to right over the trend's window, ending now;
values from 0 up to a round number above the highest. A gap (no sample: the job did not run)
is a shaded area with no line across it; a restart is a dashed vertical mark; a lone point
between two breaks is a dot.
"""

from __future__ import annotations

import math
from typing import Any

from mirrorflow.health.numbers import thousands
from mirrorflow.health.trends import Series, Trend

CHART_W, CHART_H = 560.0, 180.0
LEFT, RIGHT, TOP, BOTTOM = 72.0, 14.0, 24.0, 30.0  # the plot's margins (axis labels)
SPARK_W, SPARK_H = 150.0, 30.0
TICK_STEPS_MIN = (1, 2, 5, 10, 15)  # the time axis' steps: the smallest giving at most 4 ticks


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (1 for 0)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power


def _decimals(value: float) -> int:
    """The decimals a round axis value needs: 0 (``1,000``), 1 (``0.5``) or 2 (``1.25``)."""
    return next((d for d in (0, 1) if round(value, d) == round(value, 6)), 2)


def time_ticks(span_s: float) -> list[int]:
    """Minutes before now to mark on a time axis spanning ``span_s`` seconds, now last."""
    span_min = span_s / 60
    step = next((m for m in TICK_STEPS_MIN if span_min / m <= 4), 15)
    return [step * k for k in range(int(span_min // step + 1e-9), -1, -1)]


def value_text(value: float | None, unit: str) -> str:
    """A value with its unit: ``1,234 records``, ``12.5 records/s``, ``250 ms``, ``—``."""
    if value is None:
        return "—"
    decimals = 1 if unit == "records/s" and 0 < abs(value) < 10 else 0
    return f"{thousands(value, decimals)} {unit}"


def _scale(trend: Trend, series: Series, left: float, top: float, width: float, height: float):
    """Functions from time and value to x and y in a box, and the value axis' top."""
    span = max(trend.end - trend.start, 1.0)
    top_value = nice_ceiling(series.high or 0.0)

    def x(t: float) -> float:
        return round(left + (t - trend.start) / span * width, 1)

    def y(value: float) -> float:
        return round(top + height - min(value, top_value) / top_value * height, 1)

    return x, y, top_value


def _lines(series: Series, x, y) -> tuple[list[str], list[dict[str, float]]]:
    """The series' segments as SVG paths, and lone points as dots."""
    paths, dots = [], []
    for segment in series.segments:
        if len(segment) == 1:
            (t, value), *_ = segment
            dots.append({"x": x(t), "y": y(value)})
        elif segment:
            path = " ".join(
                f"{'M' if i == 0 else 'L'} {x(t)} {y(v)}" for i, (t, v) in enumerate(segment)
            )
            paths.append(path)
    return paths, dots


def chart(trend: Trend, name: str) -> dict[str, Any]:
    """The chart of the series ``name`` of ``trend``: its size, plot box, lines, dots, gaps,
    restarts, ticks (each with its position and label), title and figures as text."""
    series = trend.series[name]
    width, height = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    x, y, top_value = _scale(trend, series, LEFT, TOP, width, height)
    paths, dots = _lines(series, x, y)
    y_ticks = [
        {"y": y(value), "label": thousands(value, _decimals(value))}
        for value in (0.0, top_value / 2, top_value)
    ]
    x_ticks = [
        {
            "x": x(trend.end - minutes * 60),
            "label": "now" if minutes == 0 else f"\u2212{minutes} min",
            "anchor": "end" if minutes == 0 else "middle",
        }
        for minutes in time_ticks(trend.end - trend.start)
    ]
    return {
        "name": name,
        "title": f"{series.title} ({series.unit})",
        "unit": series.unit,  # the value axis' title
        "width": CHART_W,
        "height": CHART_H,
        "left": LEFT,
        "top": TOP,
        "right": CHART_W - RIGHT,
        "bottom": CHART_H - BOTTOM,
        "paths": paths,
        "dots": dots,
        "gaps": _gaps(trend, x),
        "restarts": [x(t) for t in trend.restarts],
        "y_ticks": y_ticks,
        "x_ticks": x_ticks,
        "current": series.current,
        "low": series.low,
        "high": series.high,
        "current_text": value_text(series.current, series.unit),
        "low_text": value_text(series.low, series.unit),
        "high_text": value_text(series.high, series.unit),
    }


def sparkline(trend: Trend, name: str) -> dict[str, Any]:
    """The series ``name`` small, without axes: lines, dots, gaps and restarts, figures as
    text (for the flows' table)."""
    series = trend.series[name]
    x, y, _top = _scale(trend, series, 1.0, 2.0, SPARK_W - 2, SPARK_H - 4)
    paths, dots = _lines(series, x, y)
    return {
        "name": name,
        "unit": series.unit,
        "width": SPARK_W,
        "height": SPARK_H,
        "paths": paths,
        "dots": dots,
        "gaps": _gaps(trend, x, 0.0, SPARK_H),
        "restarts": [x(t) for t in trend.restarts],
        "current": series.current,
        "high": series.high,
        "current_text": value_text(series.current, series.unit),
        "high_text": value_text(series.high, series.unit),
    }


def _gaps(trend: Trend, x, top: float = TOP, bottom: float = CHART_H - BOTTOM) -> list[dict]:
    """The times without samples as areas (x, width, top, height)."""
    return [
        {"x": x(a), "width": max(round(x(b) - x(a), 1), 1.0), "top": top, "height": bottom - top}
        for a, b in trend.gaps
    ]
