"""The order of the test files handed to pytest-xdist: the longest first, as recorded, a new
file estimated from its marks; the recorder that writes ``tests/durations.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import schedule


@dataclass
class Mark:
    name: str


@dataclass
class Item:
    """What the ordering reads of a pytest item: its file and its marks."""

    path: str
    name: str
    marks: list[str] = field(default_factory=list)

    @property
    def location(self) -> tuple[str, int, str]:
        return self.path, 0, self.name

    def iter_markers(self):
        return (Mark(m) for m in self.marks)


def test_the_longest_recorded_files_go_first_and_a_new_file_by_its_marks() -> None:
    items = [
        Item("tests/test_quick.py", "a"),
        Item("tests/test_storm.py", "killed", ["kafka", "spark"]),
        Item("tests/test_quick.py", "b"),
        Item("tests/test_new.py", "one", ["spark"]),
        Item("tests/test_new.py", "two", ["kafka"]),
        Item("tests/test_storm.py", "frozen", ["kafka", "spark"]),
        Item("tests/test_dags.py", "x", ["airflow"]),
    ]
    recorded = {"tests/test_storm.py": 450.0, "tests/test_dags.py": 20.0, "tests/test_quick.py": 1}
    ordered = schedule.longest_files_first(items, recorded)
    # test_new.py is not recorded: one Spark test and one that needs clusters, 35 s.
    assert [(i.path, i.name) for i in ordered] == [
        ("tests/test_storm.py", "killed"),
        ("tests/test_storm.py", "frozen"),
        ("tests/test_new.py", "one"),
        ("tests/test_new.py", "two"),
        ("tests/test_dags.py", "x"),
        ("tests/test_quick.py", "a"),
        ("tests/test_quick.py", "b"),
    ]
    assert schedule.estimate([{"spark", "kafka"}, {"kafka"}, set()]) == pytest.approx(35.1)


@dataclass
class Report:
    location: tuple[str, int, str]
    duration: float


def test_the_recorder_adds_up_each_files_phases_and_writes_the_longest_first(
    tmp_path: Path,
) -> None:
    path = tmp_path / "durations.json"
    recorder = schedule.DurationRecorder(path)
    for where, seconds in [
        ("tests/test_a.py", 1.25),  # setup
        ("tests/test_a.py", 3.0),  # call
        ("tests/test_b.py", 40.0),
        ("tests/test_a.py", 0.5),  # teardown
    ]:
        recorder.pytest_runtest_logreport(Report((where, 1, "t"), seconds))
    recorder.pytest_sessionfinish(None, 0)
    assert list(json.loads(path.read_text()).items()) == [
        ("tests/test_b.py", 40.0),
        ("tests/test_a.py", 4.8),
    ]
    assert schedule.recorded(path) == {"tests/test_b.py": 40.0, "tests/test_a.py": 4.8}
    assert schedule.recorded(tmp_path / "none.json") == {}


def test_the_recorded_durations_name_only_files_that_exist() -> None:
    root = schedule.DURATIONS.parent.parent
    recorded = schedule.recorded()
    assert recorded, "tests/durations.json is missing or empty"
    assert [path for path in recorded if not (root / path).is_file()] == []
