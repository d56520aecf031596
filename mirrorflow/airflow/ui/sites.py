"""The sites the UI page shows: the mirror DAGs ``mirrorflow render`` wrote into Airflow's DAGs
folder, read as text (never imported: a DAG file is code), and their DAGs' pause in Airflow.

A generated mirror DAG names its flow files (``FLOW_FILES``) and each flow it runs with its
flow DAG (``FLOW_DAGS``); the page reads the flows' settings from those files, relative paths
against the project root, as the DAG's own task does. Its ``mirror`` task's latest run says where
the job's log is in Airflow's UI (:func:`mirror_tasks`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from mirrorflow.airflow import rendering
from mirrorflow.paths import project_root

MIRROR_TASK = "mirror"  # the task of a generated mirror DAG (templates/mirror_dag.py.j2)


@dataclass(frozen=True)
class SiteDagFile:
    """One generated mirror DAG: its id, file, flow files and ``{flow: flow DAG id}``."""

    dag_id: str
    path: Path
    flow_files: tuple[Path, ...]
    flow_dags: dict[str, str]


def site_dags(dags_folder: Path) -> list[SiteDagFile]:
    """The generated mirror DAGs in ``dags_folder`` (and its subfolders), by DAG id."""
    found = []
    for path in sorted(dags_folder.rglob("mirror__*.py")) if dags_folder.is_dir() else []:
        site = read_site_dag(path)
        if site is not None:
            found.append(site)
    return sorted(found, key=lambda s: s.dag_id)


def read_site_dag(path: Path) -> SiteDagFile | None:
    """A generated mirror DAG file's names and paths (None if it is not one)."""
    if not rendering.is_generated(path):
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    values: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("FLOW_FILES", "FLOW_DAGS"):
                values[target.id] = _literal(node.value)
        elif isinstance(node, ast.keyword) and node.arg == "dag_id":
            values.setdefault("dag_id", _literal(node.value))
    files, flow_dags, dag_id = (
        values.get("FLOW_FILES"),
        values.get("FLOW_DAGS"),
        values.get("dag_id"),
    )
    if not (isinstance(files, list) and isinstance(flow_dags, dict) and isinstance(dag_id, str)):
        return None
    root = project_root()
    paths = tuple(p if p.is_absolute() else root / p for p in map(Path, map(str, files)))
    return SiteDagFile(dag_id, path, paths, {str(k): str(v) for k, v in flow_dags.items()})


def _literal(node: ast.expr) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def dags_paused(dag_ids: list[str]) -> dict[str, bool]:
    """Whether each DAG Airflow knows is paused (a DAG it has not parsed yet is absent)."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    if not dag_ids:
        return {}
    with create_session() as session:
        rows = session.execute(
            select(DagModel.dag_id, DagModel.is_paused).where(DagModel.dag_id.in_(dag_ids))
        )
        return {dag_id: bool(paused) for dag_id, paused in rows}


def mirror_tasks(dag_ids: list[str], runs: int = 5) -> dict[str, dict[str, object]]:
    """Per mirror DAG Airflow has runs of, its ``mirror`` task in the latest of its last
    ``runs`` runs that started it (else the latest run): ``dag_id``, ``run_id``, ``task_id``,
    ``try_number`` (0: not started yet) and ``state``; where its log is in Airflow's UI."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session
    from sqlalchemy import and_, select

    found: dict[str, dict[str, object]] = {}
    with create_session() as session:
        for dag_id in dag_ids:
            rows = session.execute(
                select(TI.run_id, TI.try_number, TI.state)
                .join(DagRun, and_(DagRun.dag_id == TI.dag_id, DagRun.run_id == TI.run_id))
                .where(TI.dag_id == dag_id, TI.task_id == MIRROR_TASK)
                .order_by(DagRun.id.desc())
                .limit(runs)
            ).all()
            if rows:
                run_id, try_number, state = next((r for r in rows if r[1]), rows[0])
                found[dag_id] = {
                    "dag_id": dag_id,
                    "run_id": run_id,
                    "task_id": MIRROR_TASK,
                    "try_number": try_number or 0,
                    "state": getattr(state, "value", state),  # None: not scheduled yet
                }
    return found
