"""The floor every feature stands on: real Kafka clusters, Spark with its Kafka connector,
and Airflow running a DAG, all installed by the project itself."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclOperation,
    AdminClient,
    ConfigResource,
    ResourceType,
)

from mirrorflow.devtools import broker
from mirrorflow.errors import MirrorflowError
from mirrorflow.runtime import spark_session
from tests.conftest import allow, create_topics, topic_acls

VENV_BIN = Path(sys.executable).parent


def _produce(cluster, topic: str, records: list[tuple[bytes, bytes]], user: str = "admin"):
    producer = Producer({**cluster.client_config(user), "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value, headers=[("h", b"1")])
    assert producer.flush(30) == 0


def _consume(cluster, topic: str, count: int, user: str = "admin", timeout: float = 30.0):
    consumer = Consumer(
        {
            **cluster.client_config(user),
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    received = []
    deadline = time.monotonic() + timeout
    try:
        while len(received) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            received.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return received


@pytest.mark.kafka
def test_each_sandbox_cluster_is_independent_and_serves_produce_and_consume(sandbox, topic_name):
    topic = topic_name("orders")
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    create_topics(primary, topic, partitions=3)
    _produce(primary, topic, [(b"k%d" % i, b"v%d" % i) for i in range(20)])
    assert sorted(_consume(primary, topic, 20)) == sorted(
        (b"k%d" % i, b"v%d" % i) for i in range(20)
    )

    secondary_topics = AdminClient(secondary.client_config()).list_topics(timeout=10).topics
    assert topic not in secondary_topics, "a topic created on primary leaked into secondary"
    create_topics(secondary, topic)
    _produce(secondary, topic, [(b"only", b"secondary")])
    assert _consume(secondary, topic, 1) == [(b"only", b"secondary")]


@pytest.mark.kafka
def test_sandbox_brokers_run_with_the_jvm_options_of_kafka_jvm_performance_opts(sandbox):
    """As ``kafka-server-start.sh``: the brokers' collector and compiler come from
    ``$KAFKA_JVM_PERFORMANCE_OPTS`` (the suite's own, set in conftest), else Kafka's defaults."""
    expected = broker.performance_options()
    assert expected == os.environ[broker.PERFORMANCE_VARIABLE].split()
    for name in ("primary", "secondary"):
        (pid,) = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if str(sandbox[name].properties_file) in (p.info["cmdline"] or [])
        ]
        line = psutil.Process(pid).cmdline()
        assert all(option in line for option in expected), line
        assert "-XX:+UseG1GC" not in line
    assert broker.performance_options({}) == broker.DEFAULT_PERFORMANCE_OPTIONS.split()


@pytest.mark.kafka
def test_sandbox_brokers_take_the_settings_of_mirrorflow_sandbox_broker_config(sandbox):
    """The suite's brokers run with the thread pools conftest sets in
    ``$MIRRORFLOW_SANDBOX_BROKER_CONFIG`` (as the broker reports its configuration); a
    malformed item is named in one line."""
    overrides = broker.config_overrides()
    assert overrides["num.io.threads"] == "2", overrides
    admin = AdminClient(sandbox["primary"].client_config())
    (future,) = admin.describe_configs([ConfigResource(ResourceType.BROKER, "1")]).values()
    described = future.result(30)
    assert {k: described[k].value for k in overrides} == overrides
    assert broker.config_overrides({}) == {}
    with pytest.raises(MirrorflowError, match=r"'num\.io\.threads' is not a broker setting"):
        broker.config_overrides({broker.CONFIG_VARIABLE: "num.io.threads"})


def test_storage_is_formatted_once_a_restarted_cluster_starts_no_format_tool(tmp_path):
    """``up`` formats a new cluster's storage (a JVM of Kafka's ``StorageTool``, here a stand-in
    that records its call and writes ``meta.properties`` as the tool does); a cluster whose
    storage is formatted, one ``up`` restarts, starts none."""
    calls = tmp_path / "calls"
    java = tmp_path / "java"
    java.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'config=$(echo "$@" | sed "s/.* -c \\([^ ]*\\) .*/\\1/")\n'
        'dir=$(dirname "$config")/kraft-logs\n'
        'mkdir -p "$dir" && touch "$dir/meta.properties"\n'
    )
    java.chmod(0o755)
    clusters = []
    for name in ("a", "b"):
        directory = tmp_path / name
        directory.mkdir()
        cluster = broker.Cluster(name, 1, 2, str(directory), passwords={})
        cluster.properties_file.write_text("")
        clusters.append(cluster)
    assert not any(broker.storage_formatted(c) for c in clusters)
    broker.format_storage(str(java), "kafka.jar", clusters)
    assert len(calls.read_text().splitlines()) == 2
    assert all(broker.storage_formatted(c) for c in clusters)
    broker.format_storage(str(java), "kafka.jar", clusters)  # as ``up`` restarting both
    assert len(calls.read_text().splitlines()) == 2


def test_acls_are_enforced_for_principals_that_are_not_super_users(sandbox, topic_name):
    cluster = sandbox["primary"]
    topic = topic_name("payments")
    create_topics(cluster, topic)
    _produce(cluster, topic, [(b"k", b"v")])
    allow(cluster, "alice", ResourceType.TOPIC, topic, AclOperation.READ, AclOperation.DESCRIBE)
    allow(cluster, "alice", ResourceType.GROUP, "*", AclOperation.READ)

    described = topic_acls(cluster, topic)
    assert {(b.principal, b.operation) for b in described} == {
        ("User:alice", AclOperation.READ),
        ("User:alice", AclOperation.DESCRIBE),
    }

    assert _consume(cluster, topic, 1, user="alice") == [(b"k", b"v")]
    with pytest.raises(KafkaException) as refused:
        _consume(cluster, topic, 1, user="bob", timeout=15)
    assert refused.value.args[0].code() in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    )
    with pytest.raises(KafkaException) as denied_write:
        producer = Producer({**cluster.client_config("alice"), "message.timeout.ms": 10000})
        failures = []
        producer.produce(topic, b"x", on_delivery=lambda err, _msg: failures.append(err))
        producer.flush(15)
        if failures and failures[0] is not None:
            raise KafkaException(failures[0])
    assert denied_write.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.spark
def test_spark_submit_from_the_installed_pyspark_runs_a_python_job():
    app = Path(__file__).parent / "spark_apps" / "sum_squares.py"
    result = subprocess.run(
        [str(VENV_BIN / "spark-submit"), "--master", "local[2]", str(app), "100"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SUM_OF_SQUARES=338350" in result.stdout


@pytest.mark.kafka
@pytest.mark.spark
def test_pyspark_reads_a_kafka_topic_through_sparks_kafka_connector(sandbox, topic_name):
    cluster = sandbox["primary"]
    topic = topic_name("clicks")
    create_topics(cluster, topic, partitions=2)
    records = [(b"key-%d" % i, b"value-%d" % i) for i in range(50)]
    _produce(cluster, topic, records)

    spark = spark_session.build_session("foundation-test", master="local[2]")
    try:
        frame = (
            spark.read.format("kafka")
            .options(**spark_session.kafka_options(cluster.java_client_config()))
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .load()
        )
        rows = frame.select("key", "value", "partition", "headers").collect()
    finally:
        spark.stop()
    assert sorted((bytes(r.key), bytes(r.value)) for r in rows) == sorted(records)
    assert {r.partition for r in rows} <= {0, 1}
    assert all([(h.key, bytes(h.value)) for h in r.headers] == [("h", b"1")] for r in rows)


@pytest.mark.airflow
def test_airflow_runs_a_small_dag_to_success_with_dag_test(airflow_home, tmp_path):
    marker = tmp_path / "ran"
    dag_file = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / "foundation_smoke.py"
    dag_file.write_text(f"""
import datetime, pathlib
from airflow.sdk import DAG, task

with DAG("foundation_smoke", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
    @task
    def write():
        pathlib.Path({str(marker)!r}).write_text("ok")
        return 41

    @task
    def check(value):
        assert value == 41

    check(write())

if __name__ == "__main__":
    run = dag.test()
    print("STATE=" + str(run.state))
""")
    result = subprocess.run(
        [sys.executable, str(dag_file)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert "STATE=success" in result.stdout, result.stdout[-2000:] + result.stderr[-3000:]
    assert marker.read_text() == "ok"
