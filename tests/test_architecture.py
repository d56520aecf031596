"""The package's architecture holds: each layer imports only the layers below it, only
``mirrorflow.airflow`` imports Airflow, and MirrorMaker 2's concepts, the flow definitions and
the replication layer import no Spark (contracts in ``[tool.importlinter]``, pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": str(lint_imports.parent)},
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in result.stdout
