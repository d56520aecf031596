"""Generated DAGs run by a real Airflow in the tests: rendered into the tests' DAG folder, then
``dag.test()`` in a fresh Python, as a developer would run one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from mirrorflow.airflow import rendering

ROOT = Path(__file__).resolve().parent.parent
# Fast restarts for the tests; everything else as in production DAGs.
OPTIONS = rendering.RenderOptions(retry_delay_seconds=1, stop_grace_seconds=30)


def add_connection(directory: Path, conn_id: str, fields: dict) -> None:
    """Store an Airflow connection in the session's metadata DB as a user does, from a private
    file (``airflow connections import``), so its password is on no command line."""
    source = directory / f"{conn_id}.json"
    source.touch(mode=0o600)
    source.write_text(json.dumps({conn_id: fields}))
    airflow = str(Path(sys.executable).parent / "airflow")
    try:
        result = subprocess.run(
            [airflow, "connections", "import", str(source), "--overwrite"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        source.unlink()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def render_into_dags_folder(flow_file: Path, kind: str = "mirror", flow: str | None = None) -> Path:
    """Render the flow file's DAGs where Airflow looks for DAGs; return the file of its DAG of
    ``kind`` (there is one target site in the tests' flow files), of ``flow`` if given."""
    folder = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / "mirrorflow"
    result = rendering.render([flow_file], OPTIONS)
    rendering.write(result, folder)
    (dag,) = [d for d in result.dags if d.kind == kind and (flow is None or flow in d.flows)]
    return folder / dag.filename


def start_dag_test(
    dag_file: Path, state: Path, log: Path, run_conf: dict | None = None, **env: str
) -> subprocess.Popen:
    """``dag.test(run_conf=…)`` of the DAG file in a fresh Python; its output goes to ``log``."""
    script = textwrap.dedent(f"""
        import json, runpy
        dag = runpy.run_path({str(dag_file)!r})["dag"]
        run = dag.test(run_conf=json.loads({json.dumps(run_conf or {})!r}))
        tries = {{ti.task_id: [str(ti.state), ti.try_number] for ti in run.get_task_instances()}}
        print("RESULT=" + json.dumps({{"state": str(run.state), "tasks": tries}}), flush=True)
    """)
    environment = {**os.environ, "MIRRORFLOW_STATE": str(state), **env}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=environment,
            start_new_session=True,
        )


def finish(run: subprocess.Popen, log: Path, timeout: float = 120) -> dict:
    """Wait for ``dag.test()`` to return; its run's state and each task's (state, tries)."""
    try:
        run.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        raise AssertionError("dag.test() did not return:\n" + log.read_text()[-4000:]) from None
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("RESULT=")]
    assert lines, log.read_text()[-6000:]
    return json.loads(lines[-1].removeprefix("RESULT="))
