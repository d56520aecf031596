"""docker-compose.yaml, read by ``docker compose config`` (no Docker engine runs here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mirrorflow import paths
from mirrorflow.airflow import rendering
from mirrorflow.config.topology import load_topology

ROOT = Path(__file__).resolve().parent.parent
SECRETS = {
    "POSTGRES_PASSWORD": "test-postgres-password",
    "AIRFLOW_JWT_SECRET": "test-jwt-secret",
    "AIRFLOW_SECRET_KEY": "test-secret-key",
    "SPARK_AUTH_SECRET": "test-spark-secret",
    "METRICS_TOKEN": "test-metrics-token",
}
AIRFLOW_SERVICES = {
    "airflow-init": None,
    "airflow-api-server": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}


def _compose() -> tuple[list[str], dict[str, str]]:
    """``docker compose`` as installed, else the plugin scripts/bootstrap.sh builds."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on this machine")
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    if subprocess.run([docker, "compose", "version"], capture_output=True, env=env).returncode:
        built = sorted(paths.cache_dir().glob("docker-compose-v*/cli-plugins/docker-compose"))
        if not built:
            pytest.skip(
                "docker compose is not installed and scripts/bootstrap.sh could not build it "
                "(it needs Go); see its output"
            )
        env["DOCKER_CONFIG"] = str(built[-1].parent.parent)
    # --env-file: a developer's .env must not change what the tests see.
    command = [docker, "compose", "--project-directory", str(ROOT), "-f", "docker-compose.yaml"]
    return [*command, "--env-file", os.devnull], env


@pytest.fixture(scope="module")
def compose() -> tuple[list[str], dict[str, str]]:
    return _compose()


def config(compose, **env: str) -> subprocess.CompletedProcess:
    command, base = compose
    return subprocess.run(
        [*command, "config", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**base, **env},
        timeout=60,
    )


def test_compose_lays_out_kafka_airflow_postgres_and_spark_with_the_project_mounted(compose):
    result = config(compose, **SECRETS)
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)
    services = spec["services"]
    assert set(services) == {
        "kafka-primary",
        "kafka-secondary",
        "postgres",
        *AIRFLOW_SERVICES,
        "spark-master",
        "spark-worker",
        "metrics",
    }
    for name in ("kafka-primary", "kafka-secondary"):
        kafka = services[name]
        assert kafka["image"].startswith("apache/kafka:")
        assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft
        assert kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
    clusters = {
        services[n]["environment"]["CLUSTER_ID"] for n in ("kafka-primary", "kafka-secondary")
    }
    assert len(clusters) == 2, "the two Kafka clusters must be independent"

    for name, command in AIRFLOW_SERVICES.items():
        airflow = services[name]
        env = airflow["environment"]
        if command:
            assert airflow["command"][:2] == ["airflow", command]
            assert airflow["depends_on"]["airflow-init"]["condition"] == (
                "service_completed_successfully"
            )
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith(
            "postgresql+psycopg2://airflow:test-postgres-password@postgres:5432/"
        )
        assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == {
            "conn_type": "spark",
            "host": "spark://spark-master",
            "port": 7077,
        }
        mounts = {m["target"]: m for m in airflow["volumes"]}
        project = mounts["/opt/mirrorflow"]
        assert (project["type"], Path(project["source"])) == ("bind", ROOT)
        assert mounts[env["AIRFLOW__CORE__DAGS_FOLDER"]]["type"] == "volume"
        assert mounts[env["MIRRORFLOW_STATE"]]["source"] == "mirrorflow-state"  # checkpoints
        assert {"source": "flows", "target": "/etc/mirrorflow/flows.properties"} in airflow[
            "configs"
        ]
        spark_file = env["MIRRORFLOW_SPARK_PROPERTIES"]  # the drivers' secret
        assert _mounted(airflow, "spark-properties") == (spark_file, "0400")
    assert (
        "mirrorflow render /etc/mirrorflow/flows.properties --out /opt/airflow/dags"
        in (services["airflow-init"]["command"][-1])
    )
    assert services["airflow-scheduler"]["hostname"] == "airflow-scheduler"  # drivers run here
    assert "org.apache.spark.deploy.master.Master" in services["spark-master"]["command"]
    worker = services["spark-worker"]["command"]
    assert (
        "org.apache.spark.deploy.worker.Worker" in worker and "spark://spark-master:7077" in worker
    )
    secured = spec["configs"]["spark-properties"]["content"]
    assert "spark.authenticate.secret = test-spark-secret" in secured
    assert "spark.network.crypto.enabled = true" in secured
    assert services["spark-master"]["ports"][0]["host_ip"] == "127.0.0.1"
    for name in ("spark-master", "spark-worker"):
        target, _mode = _mounted(services[name], "spark-properties")
        command = services[name]["command"]
        assert command[command.index("--properties-file") + 1] == target
        assert services[name]["image"] == services["airflow-scheduler"]["image"]
        mounts = {m["target"]: m for m in services[name]["volumes"]}
        assert Path(mounts["/opt/mirrorflow"]["source"]) == ROOT


def test_metrics_of_airflow_and_the_mirror_job_reach_one_collector_and_stay_private(compose):
    """Airflow's components send their metrics (OpenTelemetry) with a bearer token to a collector
    in the scheduler's network namespace, which also scrapes the mirror job's loopback endpoint
    (the port the DAGs are rendered with) and serves both for Prometheus on loopback only."""
    result = config(compose, **SECRETS)
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)
    services = spec["services"]
    collector = services["metrics"]
    assert collector["network_mode"] == "service:airflow-scheduler"
    assert "ports" not in collector
    # `docker compose config` keeps "$$" escaped; the file the collector reads has "$".
    content = spec["configs"]["otel-collector"]["content"].replace("$$", "$")
    assert "test-metrics-token" not in content  # the token stays in the collector's environment
    settings = yaml.safe_load(content)
    assert settings["extensions"]["bearertokenauth"]["token"] == "${env:METRICS_TOKEN}"
    otlp = settings["receivers"]["otlp"]["protocols"]["http"]
    assert otlp["auth"] == {"authenticator": "bearertokenauth"}
    (scrape,) = settings["receivers"]["prometheus"]["config"]["scrape_configs"]
    (target,) = scrape["static_configs"][0]["targets"]
    assert target.startswith("127.0.0.1:")
    assert settings["exporters"]["prometheus"]["endpoint"].startswith("127.0.0.1:")
    pipeline = settings["service"]["pipelines"]["metrics"]
    assert set(pipeline["receivers"]) == {"otlp", "prometheus"}
    render = services["airflow-init"]["command"][-1]
    assert f"--metrics-port {target.split(':')[1]}" in render
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env["AIRFLOW__METRICS__OTEL_ON"] == "true"
        assert env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"].startswith("http://airflow-scheduler:")
        assert env["OTEL_EXPORTER_OTLP_METRICS_HEADERS"] == (
            "Authorization=Bearer test-metrics-token"
        )
    assert collector["environment"]["METRICS_TOKEN"] == "test-metrics-token"


def test_the_deployments_flow_file_validates_renders_and_names_its_clusters(compose, tmp_path):
    result = config(compose, **SECRETS)
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)
    flow_file = tmp_path / "flows.properties"
    flow_file.write_text(spec["configs"]["flows"]["content"])
    result = rendering.render([flow_file])
    ids = [
        "drill__primary__secondary",
        "failback__primary__secondary",
        "failover__primary__secondary",
        "flow__primary__secondary",
        "mirror__secondary",
        "sync__secondary",
    ]
    assert [d.dag_id for d in result.dags] == ids
    assert result.warnings == []
    topology = load_topology([flow_file])
    for alias, service in (("primary", "kafka-primary"), ("secondary", "kafka-secondary")):
        servers = topology.cluster(alias).client_settings("admin")["bootstrap.servers"].value
        assert servers == f"{service}:9092" and service in spec["services"]


def test_compose_refuses_to_start_without_the_deployments_secrets(compose):
    result = config(compose)  # no POSTGRES_PASSWORD, AIRFLOW_JWT_SECRET, AIRFLOW_SECRET_KEY
    assert result.returncode != 0
    for name in SECRETS:
        assert f"required variable {name} is missing a value: set {name}" in result.stderr


def _mounted(service: dict, config: str) -> tuple[str, str | None]:
    """Where a service gets a config, and with which mode."""
    (mount,) = [c for c in service.get("configs", []) if c["source"] == config]
    return mount["target"], mount.get("mode")
