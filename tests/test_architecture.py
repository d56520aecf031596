"""The package's architecture holds: each layer imports only the layers below it, only
``mirrorflow.airflow`` imports Airflow, MirrorMaker 2's concepts, the flow definitions and
the replication layer import no Spark, and the checkpoint modules import only those below them
(contracts in ``[tool.importlinter]``, pyproject.toml); every Kafka client is made by one
module."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
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
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert f"Contracts: {len(contracts['contracts'])} kept, 0 broken." in result.stdout


# The sandbox's and the fault tests' own probes of clusters being started and killed: silenced
# (``log_level`` 0), as a cluster that does not answer is what they wait out.
SILENT_PROBES = {"mirrorflow/devtools/broker.py", "mirrorflow/devtools/faults.py"}


def test_every_kafka_client_is_made_by_the_clients_module():
    """A client made elsewhere would print librdkafka's line per failed connection attempt
    again (issue 24): every confluent-kafka client comes from mirrorflow.replication.clients."""
    made_elsewhere = []
    for path in sorted((ROOT / "mirrorflow").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name == "mirrorflow/replication/clients.py" or name in SILENT_PROBES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else None
                called = node.func.id if isinstance(node.func, ast.Name) else called
                if called in ("Consumer", "Producer", "AdminClient"):
                    made_elsewhere.append(f"{name}:{node.lineno}: {called}(")
    assert made_elsewhere == []


def test_no_code_changes_the_working_directory():
    """The working directory is the whole process's (an Airflow worker's other tasks, the UI's
    other requests): a relative path is resolved against a directory named for it instead
    (``base_dir`` of :func:`mirrorflow.config.topology.load_topology`)."""
    changed = []
    for path in sorted((ROOT / "mirrorflow").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute | ast.Name) and "chdir" in (
                node.attr if isinstance(node, ast.Attribute) else node.id
            ):
                changed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert changed == []
