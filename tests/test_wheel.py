"""mirrorflow installed from its wheel works outside the checkout: ``validate``, ``render`` and
``mirror`` find their templates, Spark entry points and JVM sources in the package data, and in
that environment's Airflow, mirrorflow is a provider with its Replication page.

The wheel is built from the checkout (hatchling, offline), installed into a fresh virtual
environment with the locked dependencies (from uv's cache where bootstrap left them there), and
its ``mirrorflow`` runs in a temporary directory with the checkout nowhere on its path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mirrorflow import paths
from tests.conftest import create_topics
from tests.mirror_harness import copied, produce, read_topic, write_flow_file

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

ROOT = Path(__file__).resolve().parent.parent


def _uv() -> str:
    found = sorted(paths.cache_dir().glob("uv-*/bin/uv"))
    if not found:
        pytest.fail(f"no uv in {paths.cache_dir()}: run scripts/bootstrap.sh")
    return str(found[-1])


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, (
        f"{' '.join(command)} -> {result.returncode}\n{result.stdout[-3000:]}\n"
        f"{result.stderr[-3000:]}"
    )
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment with the built wheel installed; its bin directory."""
    work = tmp_path_factory.mktemp("wheel")
    _run(
        [
            sys.executable,
            "-c",
            f"import hatchling.build; hatchling.build.build_wheel({str(work)!r})",
        ],
        cwd=ROOT,
    )
    (wheel,) = work.glob("mirrorflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for resource in (
        "mirrorflow/_resources/templates/mirror_dag.py.j2",
        "mirrorflow/_resources/spark_jobs/mirror.py",
        "mirrorflow/_resources/spark_jobs/log4j2.properties",
        "mirrorflow/_resources/jvm/settings.xml",
        "mirrorflow/_resources/jvm/mirror-copier/src/org/mirrorflow/kafka/MirrorCopier.java",
        "mirrorflow/mm2/data/mm2_config_defs.json",
    ):
        assert resource in names, f"{resource} is not in the wheel"
    requirements = work / "requirements.txt"
    _run(
        [
            _uv(), "export", "--frozen", "--no-dev", "--no-emit-project",
            "--format", "requirements-txt", "-o", str(requirements),
        ],
        cwd=ROOT,
    )  # fmt: skip
    venv = work / "venv"
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    _run([_uv(), "venv", "--quiet", "--python", str(base_python), str(venv)])
    _run(
        [
            _uv(), "pip", "install", "--quiet", "--no-deps",
            "--python", str(venv / "bin" / "python"), "-r", str(requirements), str(wheel),
        ]
    )  # fmt: skip
    return venv / "bin"


def _environment(bin_dir: Path, state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(bin_dir), *env.get("PATH", "").split(os.pathsep)[1:]])
    env["PYSPARK_PYTHON"] = str(bin_dir / "python")
    env["MIRRORFLOW_STATE"] = str(state)
    return env


def test_the_installed_wheel_validates_renders_and_mirrors_outside_the_checkout(
    installed, sandbox, topic_name, tmp_path
):
    outside = tmp_path / "project"
    outside.mkdir()
    env = _environment(installed, tmp_path / "state")
    where = _run(
        [str(installed / "python"), "-c", "import mirrorflow; print(mirrorflow.__file__)"],
        cwd=outside,
        env=env,
    ).stdout.strip()
    assert where.startswith(str(installed.parent)), f"mirrorflow imported from {where}"
    assert not where.startswith(str(ROOT))

    topic = topic_name("wheel")
    create_topics(sandbox["primary"], topic, partitions=2)
    produce(sandbox["primary"], topic, 2, 40)
    write_flow_file(
        outside / "mm2.properties",
        sandbox,
        ["primary", "secondary"],
        ["primary->secondary.enabled = true", f"primary->secondary.topics = {topic}"],
    )
    mirrorflow = str(installed / "mirrorflow")
    validated = subprocess.run(
        [mirrorflow, "validate", "mm2.properties"], cwd=outside, env=env, capture_output=True
    )
    # 1: warnings only (the sandbox flow file sizes MirrorMaker 2's checkpoints topic).
    assert validated.returncode in (0, 1), validated.stdout + validated.stderr
    assert b"0 errors" in validated.stdout
    _run([mirrorflow, "render", "mm2.properties", "--out", "dags"], cwd=outside, env=env)
    rendered = sorted(p.name for p in (outside / "dags").glob("*.py"))
    assert rendered == [
        "drill__primary__secondary.py",
        "failback__primary__secondary.py",
        "failover__primary__secondary.py",
        "flow__primary__secondary.py",
        "mirror__secondary.py",
        "sync__secondary.py",
    ]
    site = (outside / "dags" / "mirror__secondary.py").read_text()
    assert '"mm2.properties"' in site and '"primary->secondary"' in site
    _run(
        [
            mirrorflow,
            "mirror",
            "mm2.properties",
            "--flow",
            "primary->secondary",
            "--once",
            "--master",
            "local[2]",
        ],
        cwd=outside,
        env=env,
    )
    source = read_topic(sandbox["primary"], topic)
    assert copied(read_topic(sandbox["secondary"], f"primary.{topic}")) == copied(source)
    # The failover's report templates travel too: a dry run of the caught-up flow reports.
    _run(
        [
            mirrorflow,
            "failover",
            "mm2.properties",
            "--flow",
            "primary->secondary",
            "--dry-run",
            "--groups",
            "none",
            "--run-id",
            "wheel",
        ],
        cwd=outside,
        env=env,
    )
    report = tmp_path / "state" / "reports" / "failover" / "wheel" / "report.md"
    assert report.read_text().startswith("# Failover of primary->secondary: success\n")


def test_installed_into_airflow_the_wheel_registers_its_provider_and_its_replication_page(
    installed, tmp_path
):
    """``pip install mirrorflow`` into an Airflow registers mirrorflow's provider (hook,
    operators) and its plugin through entry points: ``airflow providers list`` and ``airflow
    plugins`` show them with an empty plugins folder, and the Replication page is mounted on
    Airflow's api-server app (it asks an anonymous caller to log in, as Airflow's own API does)."""
    home = tmp_path / "airflow"
    (home / "plugins").mkdir(parents=True)  # nothing copied into it
    env = {
        **_environment(installed, tmp_path / "state"),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    airflow = str(installed / "airflow")
    listed = _run([airflow, "providers", "list", "-o", "json"], cwd=tmp_path, env=env).stdout
    providers = {p["package_name"]: p for p in json.loads(listed)}
    assert "mirrorflow" in providers, sorted(providers)
    assert providers["mirrorflow"]["version"] == "0.1.0"
    assert providers["mirrorflow"]["description"].startswith("Kafka replication")
    plugins = json.loads(_run([airflow, "plugins", "-o", "json"], cwd=tmp_path, env=env).stdout)
    [plugin] = [p for p in plugins if p["name"] == "mirrorflow"]
    assert "mirrorflow.airflow.ui.plugin" in json.dumps(plugin), plugin
    page = _run(
        [
            str(installed / "python"),
            "-c",
            "from fastapi.testclient import TestClient\n"
            "from airflow.api_fastapi.app import create_app\n"
            "client = TestClient(create_app(), follow_redirects=False)\n"
            "api = client.get('/mirrorflow/api/health').status_code\n"
            "html = client.get('/mirrorflow/', headers={'accept': 'text/html'}).status_code\n"
            "print('answers', api, html)\n",
        ],
        cwd=tmp_path,
        env=env,
    ).stdout  # Airflow's access log goes there too
    answers = [line.split() for line in page.splitlines() if line.startswith("answers ")]
    assert answers == [["answers", "401", "303"]], page  # mounted, behind Airflow's login
