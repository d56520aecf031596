"""The code type-checks: mypy, run as a developer runs it (``python -m mypy`` in the checkout,
no arguments), finds no error. What it checks and how strictly is ``[tool.mypy]`` in
pyproject.toml; docs/development.md says why that strictness."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.test_dependencies import SHIPPED

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_error():
    # Cold (no .mypy_cache in the checkout, as in CI) about 40 s on two busy cores; warm, 1 s.
    result = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MYPY_FORCE_COLOR": "0"},
        timeout=300,
    )
    report = result.stdout[-8000:] + result.stderr[-2000:]
    assert result.returncode == 0, "mypy found errors:\n" + report
    assert "Success: no issues found" in result.stdout, report


def test_mypy_checks_every_shipped_folder():
    """pyproject's ``files`` names the package and every folder that ships with it, so none
    escapes the check."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert set(config["files"]) == set(SHIPPED)
