"""TLS and SASL as MirrorMaker 2 users have them: the sandbox clusters' SASL_SSL (SCRAM-SHA-512)
and SSL (mutual TLS) listeners, with trust- and keystores in JKS, PKCS#12 and PEM written with
the Java client's settings, seed 003's SSL block among them. ``plan`` (Python clients) connects
with every combination; the mirror job copies over TLS in both delivery modes (its Java copier
and Spark's Kafka source read the stores as they are, its Python clients through
:mod:`mirrorflow.config.keystores`); a wrong truststore, password or client certificate fails in
one line naming the cluster and the setting to check."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mirrorflow.devtools import certificates
from mirrorflow.runtime import launch
from tests.conftest import create_topics
from tests.mirror_harness import (
    ROOT,
    produce,
    read_topic,
    run_cli,
    run_mirror_once,
    write_flow_file,
)

pytestmark = pytest.mark.kafka
SEEDS = ROOT / "tests" / "data" / "seeds"


def tls_flow_file(
    directory: Path, box, source: tuple[str, str], target: tuple[str, str], *lines: str, **override
) -> Path:
    """A flow primary->secondary whose clusters are reached over (listener, store type)
    ``source`` and ``target``; ``override`` replaces primary's settings (dots as ``__``)."""
    clients = {
        alias: box[alias].java_client_config("admin", listener, store_type)
        for alias, (listener, store_type) in (("primary", source), ("secondary", target))
    }
    clients["primary"].update({k.replace("__", "."): v for k, v in override.items()})
    return write_flow_file(
        directory / "mm2.properties",
        box,
        ["primary", "secondary"],
        ["primary->secondary.enabled = true", *lines],
        clients,
    )


def mirrorflow(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_cli(*args, env=launch.job_environment(), timeout=timeout)


@pytest.mark.parametrize("store_type", certificates.STORE_TYPES)
@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
def test_plan_connects_over_tls_with_every_store_type(
    listener, store_type, sandbox, topic_name, tmp_path
):
    topic = topic_name("tls")
    create_topics(sandbox["primary"], topic)
    config = tls_flow_file(
        tmp_path,
        sandbox,
        (listener, store_type),
        (listener, store_type),
        f"primary->secondary.topics = {topic}",
    )
    result = mirrorflow("plan", str(config))
    assert result.returncode == 0, result.stderr
    assert f"primary.{topic}" in result.stdout


def test_seed_003s_ssl_block_works_unchanged(sandbox, tmp_path):
    """Seed 003's commented SSL block, uncommented, with its paths and passwords replaced."""
    seed = (SEEDS / "003-active-passive.properties").read_text()
    block = [ln.removeprefix("# ") for ln in seed.splitlines() if ln.startswith("# us-east.s")]
    assert [ln.split(" = ")[0] for ln in block] == [
        "us-east.security.protocol",
        "us-east.ssl.truststore.location",
        "us-east.ssl.truststore.password",
        "us-east.ssl.keystore.location",
        "us-east.ssl.keystore.password",
    ]
    ours = sandbox["primary"].java_client_config("admin", "SSL", "JKS")
    assert sorted(ours) == sorted(["bootstrap.servers", *(ln.split(" = ")[0][8:] for ln in block)])
    result = mirrorflow(
        "plan", str(tls_flow_file(tmp_path, sandbox, ("SSL", "JKS"), ("SSL", "JKS")))
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.spark
@pytest.mark.parametrize(
    "mode, source, target",
    [
        ("at-least-once", ("SSL", "JKS"), ("SASL_SSL", "PKCS12")),
        ("exactly-once", ("SASL_SSL", "PEM"), ("SSL", "PKCS12")),
    ],
)
def test_the_mirror_job_copies_over_tls(mode, source, target, sandbox, topic_name, tmp_path):
    topic = topic_name("tls-copy")
    create_topics(sandbox["primary"], topic, partitions=2)
    produce(sandbox["primary"], topic, 2, 200)
    exactly_once = [
        "secondary.exactly.once.source.support = enabled",
        "primary.consumer.isolation.level = read_committed",
    ]
    config = tls_flow_file(
        tmp_path,
        sandbox,
        source,
        target,
        f"primary->secondary.topics = {topic}",
        *(exactly_once if mode == "exactly-once" else []),
    )
    output = run_mirror_once(config, "primary->secondary", tmp_path / "state", timeout=300)
    copies = read_topic(sandbox["secondary"], f"primary.{topic}")
    assert sum(len(records) for records in copies.values()) == 200
    assert not any(w in output for w in ("Traceback", "Exception in"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    """Stores of a certificate authority the sandbox's brokers do not know."""
    directory = tmp_path_factory.mktemp("other-ca") / "tls"
    keytool = str(Path(os.environ.get("JAVA_HOME", "/usr")) / "bin" / "keytool")
    return certificates.ensure(directory, ["admin"], "another-password", keytool)


@pytest.mark.parametrize(
    "case, listener, store_type, override, expected",
    [
        (
            "a truststore of another CA",
            "SASL_SSL",
            "JKS",
            {
                "ssl__truststore__location": "{other}/truststore.jks",
                "ssl__truststore__password": "another-password",
            },
            "check primary's ssl.truststore.*",
        ),
        (
            "a wrong truststore password",
            "SASL_SSL",
            "JKS",
            {"ssl__truststore__password": "not-the-password"},
            "check ssl.truststore.password",
        ),
        (
            "a wrong keystore password",
            "SSL",
            "PKCS12",
            {"ssl__keystore__password": "not-the-password"},
            "check ssl.keystore.password",
        ),
        (
            "a client certificate of another CA",
            "SSL",
            "PEM",
            {
                "ssl__keystore__location": "{other}/admin.pem",
                "ssl__key__password": "another-password",
            },
            "check primary's ssl.keystore.*",
        ),
    ],
)
def test_a_tls_mistake_fails_plan_in_one_line_naming_cluster_and_setting(
    case, listener, store_type, override, expected, sandbox, other_ca, tmp_path
):
    override = {k: v.replace("{other}", str(other_ca)) for k, v in override.items()}
    config = tls_flow_file(
        tmp_path, sandbox, (listener, store_type), ("SASL_PLAINTEXT", "JKS"), **override
    )
    result = mirrorflow("plan", str(config), "--timeout", "5")
    assert result.returncode == 2, result.stdout + result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("mirrorflow: error: ") and "primary" in first, result.stderr
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    password = sandbox["primary"].tls_password
    assert password not in result.stdout + result.stderr


@pytest.mark.spark
def test_a_wrong_truststore_password_stops_the_mirror_job_before_it_copies(
    sandbox, topic_name, tmp_path
):
    config = tls_flow_file(
        tmp_path,
        sandbox,
        ("SASL_SSL", "JKS"),
        ("SASL_SSL", "JKS"),
        "primary->secondary.topics = nothing-here",
        ssl__truststore__password="not-the-password",
    )
    result = mirrorflow(
        "mirror", str(config), "--flow", "primary->secondary", "--once", "--state-dir",
        str(tmp_path / "state"), timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "cannot open" in output and "check ssl.truststore.password" in output, output[-3000:]
    assert "Traceback" not in output
