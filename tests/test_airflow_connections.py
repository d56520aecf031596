"""Credentials from Airflow connections: the ``airflow`` config provider
(``${airflow:CONN_ID:FIELD}``, :mod:`mirrorflow.airflow.connections`).

Resolution goes through Airflow's real lookup: connections are given as ``AIRFLOW_CONN_<ID>``
variables (JSON form) or imported into the session's metadata DB, never mocked. The handoff to a
mirror job (a private file the driver deletes) is checked on its own, then end to end: ``plan``
connects to a sandbox cluster's SASL_SSL (SCRAM-SHA-512) listener with a password that only an
Airflow connection holds, and ``mirrorflow mirror`` copies records with it while neither its
command lines nor its environments hold the password. Mistakes (an unknown connection, a field
it lacks) end in one line naming the connection and the fix.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mirrorflow.config import providers, validation
from mirrorflow.config.topology import load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.runtime import launch
from tests import exposure
from tests.conftest import create_topics
from tests.dag_harness import add_connection
from tests.mirror_harness import (
    ROOT,
    produce,
    read_topic,
    run_cli,
    topic_names,
    wait_for,
    write_flow_file,
)

PROVIDER = f"""\
config.providers = airflow
config.providers.airflow.class = {providers.AIRFLOW}
"""
SCRAM = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="${{airflow:{conn}:login}}" password="${{airflow:{conn}:password}}";'
)


@pytest.fixture(autouse=True)
def _no_handed_over_values():
    """What a test's "driver" received stays in that test."""
    providers._handed_over.clear()
    yield
    providers._handed_over.clear()


def connection_json(**fields) -> str:
    return json.dumps({"conn_type": "kafka", **fields})


def topology_of(tmp_path: Path, text: str, provider: str = PROVIDER):
    path = tmp_path / "mm2.properties"
    path.write_text(provider + text)
    return load_topology([path])


BASE = """\
clusters = A, B
A.bootstrap.servers = a:9092
B.bootstrap.servers = b:9092
A->B.enabled = true
"""


# -- resolution through Airflow's lookup (AIRFLOW_CONN_* variables) ---------------------------
def test_fields_and_extra_keys_resolve_when_a_client_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_A",
        connection_json(
            login="alice",
            password="pw-of-alice",
            host="broker-a",
            port=9093,
            extra={"bootstrap.servers": "a1:9093,a2:9093", "ssl_check": True, "n": 3},
        ),
    )
    topology = topology_of(
        tmp_path,
        BASE
        + "A.security.protocol = SASL_SSL\n"
        + "A.sasl.mechanism = SCRAM-SHA-512\n"
        + "A.sasl.jaas.config = "
        + SCRAM.format(conn="kafka_a")
        + "\nA.bootstrap.servers = ${airflow:kafka_a:extra.bootstrap.servers}\n"
        + "A.ssl.key.password = ${airflow:kafka_a:host}:${airflow:kafka_a:port}"
        + "-${airflow:kafka_a:extra.ssl_check}-${airflow:kafka_a:extra.n}\n",
    )
    cluster = topology.cluster("A")
    written = cluster.client_settings("admin")["sasl.jaas.config"].value
    assert "${airflow:kafka_a:password}" in written  # as written, until a client is built
    java = cluster.client_config("admin")
    assert java["sasl.jaas.config"].endswith('username="alice" password="pw-of-alice";')
    assert java["bootstrap.servers"] == "a1:9093,a2:9093"
    librdkafka = cluster.client_config("admin", librdkafka=True)
    assert (librdkafka["sasl.username"], librdkafka["sasl.password"]) == ("alice", "pw-of-alice")
    producer = topology.flow("A->B").client_config("source.producer")
    assert producer["ssl.key.password"] == "broker-a:9093-true-3"


@pytest.mark.parametrize(
    "reference, connection, message, fix",
    [
        (
            "${airflow:kafka_nowhere:password}",
            None,
            "no Airflow connection 'kafka_nowhere'",
            "AIRFLOW_CONN_KAFKA_NOWHERE",
        ),
        (
            "${airflow:kafka_a:password}",
            connection_json(login="alice"),
            "Airflow connection 'kafka_a' has no password",
            "set the connection's password",
        ),
        (
            "${airflow:kafka_a:extra.sasl.password}",
            connection_json(extra={"sasl.username": "alice"}),
            "Airflow connection 'kafka_a' has no 'sasl.password' in its extra "
            "(its keys: sasl.username)",
            "add it to the connection's extra JSON",
        ),
    ],
)
def test_a_missing_connection_or_field_fails_naming_cluster_setting_and_connection(
    reference, connection, message, fix, tmp_path, monkeypatch
):
    if connection:
        monkeypatch.setenv("AIRFLOW_CONN_KAFKA_A", connection)
    topology = topology_of(tmp_path, BASE + f"A.ssl.key.password = {reference}\n")
    with pytest.raises(MirrorflowError) as caught:
        topology.cluster("A").client_config("admin")
    assert caught.value.message.startswith(f"cluster A, admin client: ssl.key.password: {message}")
    assert fix in caught.value.hint
    assert "\n" not in str(caught.value)


def test_validate_knows_the_provider_and_rejects_what_it_cannot_resolve(tmp_path):
    good = topology_of(
        tmp_path,
        BASE + "A.sasl.jaas.config = " + SCRAM.format(conn="kafka_a") + "\n"
        "A.ssl.keystore.password = ${airflow:kafka_a:extra.ssl_keystore_password}\n",
    )
    assert validation.validate(good) == []  # no lookup either: validate is offline
    bad = topology_of(
        tmp_path,
        BASE
        + "config.providers.vault.class = com.example.VaultConfigProvider\n"
        + "A.ssl.key.password = ${airflow:password}\n"
        + "B.ssl.key.password = ${airflow:kafka_b:passwd}\n",
        provider=PROVIDER.replace("= airflow\n", "= airflow, vault\n"),
    )
    found = [(f.severity, f.key, f.problem) for f in validation.validate(bad)]
    assert ("error", "A.ssl.key.password", "${airflow:password} names no Airflow connection") in (
        found
    )
    assert any(k == "B.ssl.key.password" and "'passwd' is not a field" in p for _, k, p in found)
    assert any(
        k == "config.providers.vault.class" and "mirrorflow cannot run" in p for _, k, p in found
    )
    assert not any("not honoured" in p for _, _, p in found)


def test_airflow_logs_to_stderr_so_a_commands_output_stays_its_own(tmp_path):
    """Outside a task Airflow logs to stdout as it loads (here: its warning that connections
    are not encrypted without a Fernet key); `plan --json` must print JSON only."""
    environment = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__FERNET_KEY": "",
        "AIRFLOW_CONN_KAFKA_X": connection_json(login="alice", password="pw-of-alice"),
    }
    script = "from mirrorflow.airflow.connections import lookup; print(lookup('kafka_x').login)"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment,
        timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "alice\n"
    assert "cryptography key" in result.stderr  # Airflow did log: to stderr


# -- the handoff to a mirror job --------------------------------------------------------------
def test_a_launcher_hands_the_job_only_its_clusters_values_in_a_private_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_A", connection_json(login="alice", password="pw-a-1"))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_B", connection_json(login="bob", password="pw-b-2"))
    text = (
        "clusters = A, B, C\nA.bootstrap.servers = a:1\nB.bootstrap.servers = b:1\n"
        "C.bootstrap.servers = c:1\nA->B.enabled = true\nC->B.enabled = true\n"
        "A.sasl.jaas.config = " + SCRAM.format(conn="kafka_a") + "\n"
        "B.sasl.jaas.config = " + SCRAM.format(conn="kafka_b") + "\n"
        # C's connection does not exist here: a job of A->B needs none of C's settings
        "C.sasl.jaas.config = " + SCRAM.format(conn="kafka_c") + "\n"
    )
    config = tmp_path / "mm2.properties"
    config.write_text(PROVIDER + text)
    with pytest.raises(MirrorflowError, match="kafka_c"):
        launch.handed_over([config], ["C->B"])
    handoff = launch.handed_over([config], ["A->B"])
    path = Path(handoff[providers.HANDOFF_ENV])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert "pw-a-1" in path.read_text() and "pw-b-2" in path.read_text()

    # The job's driver: no AIRFLOW_CONN_* variable (job_environment drops them), the handoff.
    environment = {**launch.job_environment(), **handoff}
    assert not any(k.startswith("AIRFLOW_CONN_") for k in environment)
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_A")
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_B")
    assert providers.receive_handoff(environment) == 4
    assert not path.exists() and not path.parent.exists()  # read once, then deleted
    assert providers.HANDOFF_ENV not in environment
    job_view = load_topology([config])
    sasl = job_view.cluster("B").client_config("admin", librdkafka=True)
    assert (sasl["sasl.username"], sasl["sasl.password"]) == ("bob", "pw-b-2")
    launch.discard(handoff)  # the launcher's cleanup finds nothing left: no error


def test_a_flow_file_without_airflow_references_hands_nothing_over(tmp_path):
    config = tmp_path / "mm2.properties"
    config.write_text(BASE)
    assert launch.handed_over([config], ["A->B"]) == {}


# -- against a sandbox cluster: SCRAM over SASL_SSL with the password of a connection --------
SECRET_FLOW = "primary->secondary"


def scram_flow_file(directory: Path, box, topic: str, *lines: str) -> Path:
    """primary over SASL_SSL (SCRAM-SHA-512) with login and password from Airflow connection
    ``kafka_primary``, secondary with its own settings; no password of primary's in the file."""
    primary = box["primary"].java_client_config("admin", "SASL_SSL", "PKCS12")
    primary["sasl.jaas.config"] = SCRAM.format(conn="kafka_primary")
    return write_flow_file(
        directory / "mm2.properties",
        box,
        ["primary", "secondary"],
        [
            *PROVIDER.splitlines(),
            f"{SECRET_FLOW}.enabled = true",
            f"{SECRET_FLOW}.topics = {topic}",
            *lines,
        ],
        {"primary": primary},
    )


def mirrorflow(*args: str, env: dict[str, str], timeout: float = 120):
    return run_cli(*args, env={**os.environ, **env}, timeout=timeout)


@pytest.mark.kafka
def test_plan_connects_with_a_scram_password_from_an_airflow_connection_variable(
    sandbox, topic_name, tmp_path
):
    topic = topic_name("conn")
    create_topics(sandbox["primary"], topic)
    config = scram_flow_file(tmp_path, sandbox, topic)
    password = sandbox["primary"].passwords["admin"]
    assert password not in config.read_text()
    given = {
        "AIRFLOW_CONN_KAFKA_PRIMARY": connection_json(login="admin", password=password),
    }
    result = mirrorflow("plan", str(config), env=given)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"primary.{topic}" in result.stdout
    assert password not in result.stdout + result.stderr

    wrong = {"AIRFLOW_CONN_KAFKA_PRIMARY": connection_json(login="admin", password="wrong-one")}
    refused = mirrorflow("plan", str(config), "--timeout", "10", env=wrong)
    assert refused.returncode == 2 and "primary" in refused.stderr, refused.stderr[-3000:]

    missing = mirrorflow("plan", str(config), env={})
    assert missing.returncode == 2, missing.stdout + missing.stderr
    line = [ln for ln in missing.stderr.splitlines() if ln.startswith("mirrorflow: error:")]
    assert len(line) == 1, missing.stderr
    assert "primary" in line[0] and "no Airflow connection 'kafka_primary'" in line[0]
    fix = missing.stderr.split("mirrorflow: what to do: ", 1)[1]
    assert "AIRFLOW_CONN_KAFKA_PRIMARY" in fix and "Traceback" not in missing.stderr


@pytest.mark.kafka
@pytest.mark.airflow
def test_plan_reads_the_password_from_the_metadata_db(sandbox, airflow_home, topic_name, tmp_path):
    topic = topic_name("conn-db")
    create_topics(sandbox["primary"], topic)
    config = scram_flow_file(tmp_path, sandbox, topic)
    password = sandbox["primary"].passwords["admin"]
    add_connection(
        tmp_path, "kafka_primary", {"conn_type": "kafka", "login": "admin", "password": password}
    )
    result = mirrorflow("plan", str(config), env={})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"primary.{topic}" in result.stdout
    assert password not in result.stdout + result.stderr


@pytest.mark.kafka
@pytest.mark.spark
def test_the_mirror_job_copies_with_the_connection_and_never_holds_it_in_its_processes(
    sandbox, topic_name, tmp_path
):
    """`mirrorflow mirror` in the shell of a user whose AIRFLOW_CONN_KAFKA_PRIMARY holds the
    password: the job copies over SCRAM, and while it runs none of its processes (the guard,
    spark-submit's JVM, the Python driver) has the password in its command line or environment;
    the handed-over file is gone, nor is the password in the job's output or state files."""
    topic = topic_name("conn-copy")
    create_topics(sandbox["primary"], topic, partitions=2)
    produce(sandbox["primary"], topic, 2, 100)
    config = scram_flow_file(tmp_path, sandbox, topic)
    password = sandbox["primary"].passwords["admin"]
    state, log = tmp_path / "state", tmp_path / "mirror.log"
    environment = {
        **os.environ,
        "AIRFLOW_CONN_KAFKA_PRIMARY": connection_json(login="admin", password=password),
    }
    with log.open("w") as output:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "mirrorflow.cli", "mirror", str(config), "--flow",
             SECRET_FLOW, "--master", "local[2]", "--state-dir", str(state)],
            stdout=output, stderr=subprocess.STDOUT, cwd=ROOT, env=environment,
            start_new_session=True,
        )  # fmt: skip
    try:
        secondary = sandbox["secondary"]
        wait_for(
            lambda: (
                f"primary.{topic}" in topic_names(secondary)
                and sum(map(len, read_topic(secondary, f"primary.{topic}").values())) >= 100
            ),
            240,
            "the copies",
        )
        lease = state / "primary-secondary" / "lease"  # the driver's pid, while it runs
        driver = json.loads(lease.read_text())["pid"]
        members = exposure.session_members(os.getsid(driver))
        assert len(members) >= 3, members  # the guard, the JVM, the driver
        leaks = [
            f"pid {pid} ({exposure.command_line(pid)[:60]})"
            for pid in members
            if password in exposure.command_line(pid) + exposure.environment(pid)
        ]
        assert leaks == []
        handed = [
            line.split("=", 1)[1]
            for pid in members
            for line in exposure.environment(pid).splitlines()
            if line.startswith(providers.HANDOFF_ENV + "=")
        ]
        assert handed and not any(Path(p).exists() for p in handed)  # read, then deleted
        os.killpg(launcher.pid, signal.SIGTERM)  # as Ctrl-C: stop after the batch
        assert launcher.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)  # its job's guard then ends the job
    output = log.read_text()
    assert "2 config-provider value(s) handed over by the launcher" in output  # no lookup
    assert password not in output
    assert exposure.files_holding([password], [state]) == []


@pytest.mark.airflow
def test_the_mirror_task_fails_in_one_line_before_its_job_starts_without_the_connection(
    tmp_path, monkeypatch
):
    from airflow.sdk.exceptions import AirflowException

    from mirrorflow.airflow.operators import MirrorFlowOperator

    spark = connection_json(conn_type="spark", host="local[1]")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark)
    config = tmp_path / "mm2.properties"
    jaas = "B.sasl.jaas.config = " + SCRAM.format(conn="kafka_b")
    config.write_text(PROVIDER + BASE + jaas + "\n")
    operator = MirrorFlowOperator(
        task_id="mirror", flows=["A->B"], flow_files=[str(config)], state_dir=str(tmp_path / "s")
    )
    with pytest.raises(AirflowException) as failed:
        operator.execute({})
    message = str(failed.value)
    assert message.startswith("the mirror job of A->B cannot start: ")
    assert "B.sasl.jaas.config: no Airflow connection 'kafka_b'" in message and "\n" not in message
    assert operator._hook is not None and operator._hook.process is None  # nothing started
