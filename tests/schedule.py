"""The order in which pytest-xdist hands out the test files: the longest first.

``make test`` runs ``--dist loadfile --no-loadscope-reorder``: whole files go to the pytest
processes in collection order, each process taking the next file once two tests of its current
ones are left. Handing out the longest files first (longest processing time first) keeps the run
from ending with one process running a long scenario file alone while the others are idle.

How long each file takes is kept in ``tests/durations.json`` (seconds per file, setup and
teardown included, from a ``make test`` run on the 2-core machine); ``--record-durations PATH``
writes it from a run. A file it does not list (a new one) is estimated from its tests' marks.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")

# Estimates for a file durations.json does not list, per test: one that starts Spark, one that
# needs clusters or Airflow, one that needs no service (the medians of a recorded run, rounded).
SPARK_TEST_S, SERVICE_TEST_S, PLAIN_TEST_S = 30.0, 5.0, 0.1
SERVICE_MARKS = frozenset({"kafka", "airflow"})


def recorded(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test file (``tests/test_x.py``) as last recorded; none without the file."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def estimate(marks: Iterable[set[str]]) -> float:
    """Seconds a file of tests with these marks (one set per test) is expected to take."""
    total = 0.0
    for test in marks:
        if "spark" in test:
            total += SPARK_TEST_S
        elif test & SERVICE_MARKS:
            total += SERVICE_TEST_S
        else:
            total += PLAIN_TEST_S
    return total


def longest_files_first(
    items: list[pytest.Item], durations: dict[str, float] | None = None
) -> list[pytest.Item]:
    """``items`` with their files in order of their recorded seconds, longest first (a file
    not recorded: :func:`estimate`); within a file, its own order."""
    durations = recorded() if durations is None else durations
    marks: dict[str, list[set[str]]] = defaultdict(list)
    for item in items:
        marks[item.location[0]].append({mark.name for mark in item.iter_markers()})
    seconds = {path: durations.get(path, estimate(tests)) for path, tests in marks.items()}
    position = {path: n for n, path in enumerate(marks)}
    return sorted(items, key=lambda i: (-seconds[i.location[0]], position[i.location[0]]))


class DurationRecorder:
    """Adds up each file's tests' setup, call and teardown seconds; writes them at the end
    (``--record-durations``; in the process that gets every report, xdist's controller)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.location[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        ordered = dict(sorted(((k, round(v, 1)) for k, v in self.seconds.items()), key=_longest))
        self.path.write_text(json.dumps(ordered, indent=1) + "\n")


def _longest(entry: tuple[str, float]) -> tuple[float, str]:
    return -entry[1], entry[0]
