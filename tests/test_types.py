"""The code type-checks: mypy, run as a developer runs it (``python -m mypy`` in the checkout,
no arguments), finds no error. What it checks and how strictly is ``[tool.mypy]`` in
pyproject.toml; docs/development.md says why that strictness."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from mirrorflow import paths
from tests.test_dependencies import SHIPPED

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_error():
    # Cold about 30-40 s on two busy cores; warm, a few. Its cache is kept with the project's
    # other caches, outside the checkout, so a fresh clone (CI's) starts warm: mypy checks a
    # module again when it or a module it depends on changed, and reports errors at every run.
    cache = paths.cache_dir() / f"mypy-{sys.version_info.major}.{sys.version_info.minor}"
    result = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "MYPY_FORCE_COLOR": "0",
            "MYPY_CACHE_DIR": str(cache),
        },
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
