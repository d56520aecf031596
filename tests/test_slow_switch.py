"""The default suite leaves the ``slow`` tests out, and each documented switch brings them back
(docs/development.md, *Tests*): ``MIRRORFLOW_SLOW_TESTS=1``, ``-m slow``, or the test's node id."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLOW = "tests/test_job_lifecycle.py::test_killing_the_launchers_process_group_leaves_no_process_of_the_job_running[exactly-once]"  # noqa: E501
QUICK = SLOW.replace("[exactly-once]", "[at-least-once]")


def collected(*args: str, **env: str) -> list[str]:
    """The node ids pytest would run (``--collect-only``), with ``args`` and ``env`` added."""
    environment = {k: v for k, v in os.environ.items() if k != "MIRRORFLOW_SLOW_TESTS"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**environment, **env},
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_slow_tests_are_left_out_unless_a_documented_switch_asks_for_them() -> None:
    module = "tests/test_job_lifecycle.py"
    default = collected(module)
    assert QUICK in default and SLOW not in default, default
    assert SLOW in collected(module, MIRRORFLOW_SLOW_TESTS="1")
    assert collected(module, "-m", "slow") == [SLOW]
    assert collected(SLOW) == [SLOW]


def test_a_passing_session_removes_its_directory_and_a_failing_one_keeps_it(tmp_path) -> None:
    """Each pytest process of the suite keeps its clusters' data, Airflow home and state in a
    ``mirrorflow-tests-*`` directory: gone after a passing session, kept after a failing one."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    (tmp_path / "test_one.py").write_text(
        "import os\n\ndef test_one():\n    assert os.environ['FAIL'] != '1'\n"
    )

    def session(fail: str) -> tuple[subprocess.CompletedProcess[str], list[Path]]:
        plugins = ("-p", "no:cacheprovider", "-p", "tests.conftest")
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", *plugins, str(tmp_path / "test_one.py")],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "TMPDIR": str(scratch), "FAIL": fail},
            timeout=120,
        )
        return result, sorted(scratch.glob("mirrorflow-tests-*"))

    passed, left = session("0")
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]
    assert left == [], left
    failed, left = session("1")
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert len(left) == 1 and f"are kept in {left[0]}" in failed.stdout, failed.stdout[-3000:]
