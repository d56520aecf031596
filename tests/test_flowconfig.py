"""The flow model reads MM2 configuration as MirrorMaker 2 does: layering, flows, clients."""

from __future__ import annotations

import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from mirrorflow.config import flowfiles
from mirrorflow.config.topology import MM2_DEFAULT, TOP_LEVEL, load_topology
from mirrorflow.errors import MirrorflowError

SEEDS = Path(__file__).parent / "data" / "seeds"
EXAMPLES = Path(__file__).parent.parent / "examples"


def _load(tmp_path: Path, text: str, name: str = "mm2.properties", clusters=None):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return load_topology([path], clusters)


BASE = """\
    clusters = A, B, C
    A.bootstrap.servers = a:9092
    B.bootstrap.servers = b:9092
    C.bootstrap.servers = c:9092
"""


# Flows each seed example describes: those MirrorMaker 2 itself would replicate.
SEED_FLOWS = {
    "000-first-example": ["primary->secondary"],
    "000-file-syntax": [],  # the trailing comment in `clusters` spoils both aliases
    "000-flow-settings": [],  # no `clusters`: MM2 does not start
    "000-client-settings": ["us-west->us-east"],
    "000-racy-process1": ["A->B"],
    "000-racy-process2": [],
    "000-active-passive": [],  # no `clusters`
    "000-active-active": ["us-west->us-east", "us-east->us-west"],
    "000-multi-cluster": [
        "west-1->west-2", "west-1->east-1", "west-1->north-1", "west-2->west-1",
        "east-1->west-1", "east-1->east-2", "east-1->north-1", "east-2->east-1",
        "north-1->west-1", "north-1->east-1", "north-1->north-2", "north-2->north-1",
    ],
    "001-flows": [],  # no `clusters`
    "001-getting-started": [],  # "true # disabled by default" is not true
    "001-backup": [],  # no `clusters`
    "001-read-committed": ["A->B"],
    "002-dc1-dc2": ["dc1->dc2"],
    "002-active-active": ["dc1->dc2", "dc2->dc1"],
    "003-active-passive": ["us-east->us-west"],
    "003-active-active": ["us-east->us-west", "us-west->us-east"],
}  # fmt: skip


def test_every_seed_example_is_copied_and_listed():
    assert sorted(SEED_FLOWS) == sorted(p.stem for p in SEEDS.glob("*.properties"))


@pytest.mark.parametrize("seed", sorted(SEED_FLOWS))
def test_each_seed_example_parses_into_the_flows_it_describes(seed):
    topology = load_topology([SEEDS / f"{seed}.properties"])
    assert [f.name for f in topology.flows] == SEED_FLOWS[seed]


def test_seed_flow_settings_reach_the_flow():
    topology = load_topology([SEEDS / "000-first-example.properties"])
    flow = topology.flow("primary->secondary")
    assert flow.setting("topics") == ["foobar-topic", "quux-.*"]
    assert flow.should_replicate_topic("quux-1") and not flow.should_replicate_topic("foobar")
    assert flow.remote_topic("quux-1") == "primary.quux-1"


def test_multi_cluster_seed_with_clusters_option_keeps_flows_into_the_listed_targets():
    topology = load_topology([SEEDS / "000-multi-cluster.properties"], ["west-1", "west-2"])
    assert [f.name for f in topology.flows] == [
        "west-1->west-2", "west-2->west-1", "east-1->west-1", "north-1->west-1",
    ]  # fmt: skip


def test_unknown_clusters_option_is_refused_with_the_closest_alias(tmp_path):
    with pytest.raises(MirrorflowError, match="'a,B', which is not in `clusters`") as caught:
        _load(tmp_path, BASE, clusters=["a,B"])
    assert "separate aliases with spaces" in caught.value.hint
    with pytest.raises(MirrorflowError) as caught:
        _load(tmp_path, BASE, clusters=["c"])
    assert caught.value.hint == "did you mean 'C'?"


def test_cluster_client_keys_take_precedence_over_cluster_then_top_level_keys(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        security.protocol = SSL
        sasl.mechanism = PLAIN
        A.sasl.mechanism = SCRAM-SHA-512
        A.consumer.sasl.mechanism = SCRAM-SHA-256
        A->B.enabled = true
        """,
    )
    flow = topology.flow("A->B")
    consumer = flow.client_settings("source.consumer")
    assert consumer["sasl.mechanism"].value == "SCRAM-SHA-256"
    assert consumer["security.protocol"].layer == TOP_LEVEL
    assert flow.client_settings("source.admin")["sasl.mechanism"].value == "SCRAM-SHA-512"
    assert flow.client_settings("target.producer")["sasl.mechanism"].value == "PLAIN"
    assert topology.cluster("A").client_config("admin")["sasl.mechanism"] == "SCRAM-SHA-512"


def test_top_level_client_settings_are_dropped_and_cluster_mm2_settings_have_no_effect(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        consumer.max.poll.records = 7
        A.topics = nothing
        topics = orders
        A->B.enabled = true
        """,
    )
    flow = topology.flow("A->B")
    assert "max.poll.records" not in flow.client_config("source.consumer")
    assert flow.setting("topics") == ["orders"]
    assert flow.config["source.cluster.topics"].value == "nothing"


def test_flow_settings_override_top_level_ones_and_defaults_fill_the_rest(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        topics = .*
        A->B.enabled = true
        A->B.topics = foo.*
        A->B.consumer.isolation.level = read_committed
        """,
    )
    flow = topology.flow("A->B")
    assert flow.config["topics"].value == "foo.*"
    assert flow.config["topics"].layer == "flow A->B"
    assert str(flow.config["topics"].location).endswith("mm2.properties:7")
    assert topology.flow("A->C").config["topics"].layer == TOP_LEVEL
    assert flow.config["replication.factor"].layer == MM2_DEFAULT
    assert flow.setting("replication.factor") == 2
    assert flow.client_config("source.consumer")["isolation.level"] == "read_committed"


def test_new_topics_are_looked_for_every_30_s_unless_refresh_topics_interval_is_set(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        A->B.enabled = true
        A->C.enabled = true
        A->C.refresh.topics.interval.seconds = 600
        """,
    )
    default, explicit = topology.flow("A->B"), topology.flow("A->C")
    assert default.setting("refresh.topics.interval.seconds") == 30
    setting = default.config["refresh.topics.interval.seconds"]
    assert setting.layer == "mirrorflow default (MM2: 600)"
    assert explicit.setting("refresh.topics.interval.seconds") == 600
    assert explicit.config["refresh.topics.interval.seconds"].layer == "flow A->C"


def test_the_source_is_read_committed_unless_mirrormaker_2s_read_uncommitted_is_asked(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        A->B.enabled = true
        A->C.enabled = true
        C.consumer.isolation.level = read_uncommitted
        """,
    )
    committed, uncommitted = topology.flow("A->B"), topology.flow("A->C")
    assert committed.client_config("source.consumer")["isolation.level"] == "read_committed"
    assert committed.client_settings("source.consumer")["isolation.level"].layer.startswith(
        "mirrorflow default"
    )
    assert not committed.copies_aborted_transactions
    # Only the source consumer: C's setting is for consumers of C, A->C's target.
    assert uncommitted.client_config("source.consumer")["isolation.level"] == "read_committed"
    assert uncommitted.client_config("target.consumer")["isolation.level"] == "read_uncommitted"
    topology = _load(
        tmp_path,
        BASE
        + """\
        A->B.enabled = true
        A.consumer.isolation.level = read_uncommitted
        """,
    )
    flow = topology.flow("A->B")
    assert flow.client_config("source.consumer")["isolation.level"] == "read_uncommitted"
    assert flow.copies_aborted_transactions


def test_flows_are_disabled_unless_enabled_and_run_only_with_a_herder(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        emit.heartbeats.enabled = false
        A->B.enabled = true
        B->C.emit.heartbeats.enabled = true
        """,
    )
    assert topology.herder_pairs == ["A->B", "B->C"]
    assert [f.name for f in topology.flows] == ["A->B"]
    assert not topology.flow("B->A").enabled


def test_top_level_enabled_turns_on_every_pair_with_a_heartbeats_herder(tmp_path):
    topology = _load(tmp_path, BASE + "enabled = true\n")
    assert len(topology.flows) == 6


def test_legacy_blacklist_applies_only_when_the_new_key_is_absent(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        topics.blacklist = old-.*
        A->B.enabled = true
        A->C.enabled = true
        A->C.topics.exclude = new-.*
        """,
    )
    a_b, a_c = topology.flow("A->B"), topology.flow("A->C")
    assert not a_b.should_replicate_topic("old-1")
    assert a_b.config["topics.exclude"].layer == "top-level (3.x alias)"
    assert a_c.should_replicate_topic("old-1") and not a_c.should_replicate_topic("new-1")


def test_replication_decisions_cover_filters_heartbeats_internal_topics_and_cycles(tmp_path):
    topology = _load(tmp_path, BASE + "A->B.enabled = true\nA->B.topics = .*orders\n")
    flow = topology.flow("A->B")
    assert flow.remote_topic("orders") == "A.orders"
    assert flow.why_not_replicated("orders") is None
    assert flow.why_not_replicated("users") == "not included by topics = .*orders"
    assert flow.why_not_replicated("C.heartbeats") is None  # heartbeats pass the filter
    assert flow.remote_topic("C.heartbeats") == "A.C.heartbeats"
    assert flow.why_not_replicated("B.orders") == "cycle: it already came from B"
    assert flow.why_not_replicated("C.B.orders") == "cycle: it already came from B"
    assert flow.why_not_replicated("C.orders") is None  # forwarded as A.C.orders
    assert flow.why_not_replicated("mm2-offset-syncs.B.internal").startswith("internal")


def test_identity_policy_sees_no_cycles(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy
        A->B.enabled = true
        """,
    )
    flow = topology.flow("A->B")
    assert flow.remote_topic("orders") == "orders"
    assert flow.should_replicate_topic("B.orders")
    assert not flow.should_replicate_topic("B.heartbeats")


def test_typed_settings_and_intervals(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        A->B.enabled = true
        A->B.emit.checkpoints.interval.seconds = 15
        A->B.sync.group.offsets.enabled = TRUE
        A->B.refresh.topics.enabled = false
        A->B.tasks.max = many
        """,
    )
    flow = topology.flow("A->B")
    assert flow.interval("emit.checkpoints") == timedelta(seconds=15)
    assert flow.interval("sync.group.offsets") == timedelta(seconds=60)
    assert flow.interval("refresh.topics") is None
    assert flow.setting("groups.exclude") == ["console-consumer-.*", "connect-.*", "__.*"]
    with pytest.raises(MirrorflowError, match=r"tasks.max = many is invalid .*mm2.properties:9"):
        flow.setting("tasks.max")
    with pytest.raises(MirrorflowError, match=r"did you mean 'emit\.heartbeats\.enabled'"):
        flow.setting("emit.heartbeats")


def test_flow_clients_follow_mm2s_connector_layering(tmp_path):
    topology = _load(
        tmp_path,
        BASE
        + """\
        A.client.id = from-cluster
        A.consumer.client.id = app
        A.consumer.auto.offset.reset = latest
        A.consumer.enable.auto.commit = true
        B.producer.compression.type = zstd
        A->B.enabled = true
        """,
    )
    flow = topology.flow("A->B")
    consumer = flow.client_config("source.consumer", label="mirror")
    assert consumer == {
        "bootstrap.servers": "a:9092",
        "client.id": "app|A->B|mirror",
        "auto.offset.reset": "latest",
        "enable.auto.commit": "false",
        "isolation.level": "read_committed",  # mirrorflow's default (MM2's: read_uncommitted)
    }
    assert flow.client_config("target.producer") == {
        "bootstrap.servers": "b:9092",
        "compression.type": "zstd",
    }


def _ca_pem(path: Path) -> Path:
    """A self-signed CA certificate in PEM (a truststore librdkafka reads as it is)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "test CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


def test_client_configs_translate_to_librdkafka(tmp_path):
    ca = _ca_pem(tmp_path / "ca.pem")
    topology = _load(
        tmp_path,
        BASE
        + f"""\
        A.security.protocol = SASL_SSL
        A.sasl.mechanism = SCRAM-SHA-512
        A.sasl.jaas.config = org.apache.kafka.common.security.scram.ScramLoginModule required \\
            username="mm2" password="p\\\\"w";
        A.ssl.truststore.type = PEM
        A.ssl.truststore.location = {ca}
        A.ssl.protocol = TLSv1.3
        A.consumer.fetch.max.wait.ms = 100
        A.consumer.key.deserializer = org.apache.kafka.common.serialization.ByteArrayDeserializer
        A->B.enabled = true
        """,
    )
    consumer = topology.flow("A->B").client_config("source.consumer", librdkafka=True)
    assert consumer == {
        "bootstrap.servers": "a:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "mm2",
        "sasl.password": 'p"w',
        "ssl.ca.location": str(ca),
        "fetch.wait.max.ms": "100",
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",  # librdkafka's default too; MM2's is uncommitted
    }


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "A.ssl.truststore.type = BCFKS\nA.ssl.truststore.location = /etc/truststore.bcfks",
            "ssl.truststore.type = BCFKS is not a store type mirrorflow reads",
        ),
        (
            "A.ssl.truststore.location = /nonexistent/truststore.jks",
            "ssl.truststore.location = /nonexistent/truststore.jks is not a readable file",
        ),
        ("A.sasl.jaas.config = org.example.Custom required;", "org.example.Custom"),
        ("A.ssl.enabled.protocols = TLSv1.3", "ssl.enabled.protocols = TLSv1.3 has no librdkafka"),
    ],
)
def test_what_librdkafka_cannot_express_is_refused_naming_cluster_and_setting(
    tmp_path, setting, message
):
    topology = _load(tmp_path, BASE + setting + "\n")
    with pytest.raises(MirrorflowError, match=message) as caught:
        topology.cluster("A").client_config("admin", librdkafka=True)
    assert caught.value.message.startswith("cluster A, admin client: ")


def test_config_provider_references_resolve_only_when_a_client_is_built(tmp_path, monkeypatch):
    secrets = tmp_path / "secrets.properties"
    secrets.write_text("a.jaas = org.apache.kafka.common.security.plain.PlainLoginModule "
                       'required username="u" password="from-file";\n')  # fmt: skip
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "bootstrap").write_text("a:9093")
    monkeypatch.setenv("MECHANISM", "PLAIN")
    topology = _load(
        tmp_path,
        BASE
        + f"""\
        config.providers = file, env, directory
        config.providers.file.class = org.apache.kafka.common.config.provider.FileConfigProvider
        config.providers.env.class = org.apache.kafka.common.config.provider.EnvVarConfigProvider
        config.providers.directory.class = \\
            org.apache.kafka.common.config.provider.DirectoryConfigProvider
        A.sasl.jaas.config = ${{file:{secrets}:a.jaas}}
        A.sasl.mechanism = ${{env:MECHANISM}}
        A.admin.bootstrap.servers = ${{directory:{tmp_path / "dir"}:bootstrap}}
        A.ssl.key.password = ${{vault:secret/a:key}}
        """,
    )
    admin = topology.cluster("A")
    assert admin.client_settings("admin")["sasl.jaas.config"].value.startswith("${file:")
    resolved = admin.client_config("admin")
    assert resolved["sasl.jaas.config"].endswith('password="from-file";')
    assert resolved["sasl.mechanism"] == "PLAIN"
    assert resolved["bootstrap.servers"] == "a:9093"
    assert resolved["ssl.key.password"] == "${vault:secret/a:key}"  # not configured: kept


def test_file_provider_respects_allowed_paths(tmp_path):
    secret = tmp_path / "elsewhere.properties"
    secret.write_text("x = y\n")
    topology = _load(
        tmp_path,
        BASE
        + f"""\
        config.providers = file
        config.providers.file.class = org.apache.kafka.common.config.provider.FileConfigProvider
        config.providers.file.param.allowed.paths = {tmp_path / "allowed"}
        A.sasl.mechanism = ${{file:{secret}:x}}
        """,
    )
    with pytest.raises(MirrorflowError, match=r"sasl\.mechanism: config provider 'file' may not"):
        topology.cluster("A").client_config("admin")


def test_relative_references_and_stores_resolve_under_the_base_dir_the_cwd_left_alone(
    tmp_path, monkeypatch
):
    """An Airflow task reads relative paths from the project root (``base_dir``), as its mirror
    job does, wherever the task's process runs and without changing its working directory."""
    root = tmp_path / "project"
    (root / "secrets" / "dir").mkdir(parents=True)
    (root / "secrets" / "a.properties").write_text("mechanism = PLAIN\n")
    (root / "secrets" / "dir" / "bootstrap").write_text("a:9093")
    flows = root / "flows"  # the flow file's own directory is not where they are read from
    flows.mkdir()
    flow_file = flows / "mm2.properties"
    flow_file.write_text(
        textwrap.dedent(BASE) + "config.providers = file, directory\n"
        "config.providers.file.class = org.apache.kafka.common.config.provider.FileConfigProvider\n"
        "config.providers.file.param.allowed.paths = secrets\n"
        "config.providers.directory.class = "
        "org.apache.kafka.common.config.provider.DirectoryConfigProvider\n"
        "A.sasl.mechanism = ${file:secrets/a.properties:mechanism}\n"
        "A.admin.bootstrap.servers = ${directory:secrets/dir:bootstrap}\n"
        "A.ssl.truststore.location = stores/truststore.jks\n"
        "A.ssl.keystore.location = /etc/kafka/keystore.jks\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    admin = load_topology([flow_file], base_dir=root).cluster("A").client_config("admin")
    assert Path.cwd() == elsewhere
    assert admin["sasl.mechanism"] == "PLAIN"
    assert admin["bootstrap.servers"] == "a:9093"
    assert admin["ssl.truststore.location"] == str(root / "stores" / "truststore.jks")
    assert admin["ssl.keystore.location"] == "/etc/kafka/keystore.jks"
    # Without a base dir, from the working directory, as MirrorMaker 2 reads them.
    with pytest.raises(MirrorflowError, match=r"cannot read secrets/a\.properties"):
        load_topology([flow_file]).cluster("A").client_config("admin")
    monkeypatch.chdir(root)
    admin = load_topology([flow_file]).cluster("A").client_config("admin")
    assert admin["sasl.mechanism"] == "PLAIN"
    assert admin["ssl.truststore.location"] == "stores/truststore.jks"
    # allowed.paths is read from the base dir too: a relative one there does not allow this.
    monkeypatch.chdir(elsewhere)
    (elsewhere / "secrets").mkdir()
    (elsewhere / "secrets" / "a.properties").write_text("mechanism = SCRAM-SHA-512\n")
    flow_file.write_text(flow_file.read_text().replace(
        "${file:secrets/a.properties:", f"${{file:{elsewhere}/secrets/a.properties:"
    ))  # fmt: skip
    with pytest.raises(MirrorflowError, match="may not read"):
        load_topology([flow_file], base_dir=root).cluster("A").client_config("admin")


def test_yaml_and_properties_forms_give_the_same_topology():
    from_properties = load_topology([EXAMPLES / "active-passive.properties"])
    from_yaml = load_topology([EXAMPLES / "active-passive.yaml"])
    flow_p, flow_y = (
        from_properties.flow("primary->secondary"),
        from_yaml.flow("primary->secondary"),
    )
    assert {k: s.value for k, s in flow_p.config.items()} == {
        k: s.value for k, s in flow_y.config.items()
    }
    assert [f.name for f in from_properties.flows] == [f.name for f in from_yaml.flows]


def test_yaml_definitions_keep_their_lines_and_accept_lists_and_booleans(tmp_path):
    path = tmp_path / "flows.yaml"
    path.write_text(
        "clusters:\n"
        "  A:\n"
        "    bootstrap.servers: a:9092\n"
        "  B: {bootstrap.servers: 'b:9092'}\n"
        "flows:\n"
        "  A->B:\n"
        "    enabled: yes\n"
        "    topics: [orders, payments-.*]\n"
        "    consumer:\n"
        "      isolation.level: read_committed\n"
    )
    topology = load_topology([path])
    flow = topology.flow("A->B")
    assert flow.enabled
    assert flow.config["topics"].value == "orders, payments-.*"
    assert str(flow.config["topics"].location) == f"{path}:8"
    assert flow.client_config("source.consumer")["isolation.level"] == "read_committed"


def test_yaml_with_an_unknown_section_is_refused_with_its_line(tmp_path):
    path = tmp_path / "flows.yaml"
    path.write_text("clusters: {A: {}}\nflow:\n  A->B: {enabled: true}\n")
    with pytest.raises(MirrorflowError, match=r"flows.yaml:2: unknown section 'flow'"):
        load_topology([path])


@pytest.mark.parametrize("seed", sorted(SEED_FLOWS))
def test_converting_to_yaml_and_back_keeps_every_setting(tmp_path, seed):
    original = load_topology([SEEDS / f"{seed}.properties"])
    yaml_path = tmp_path / "flows.yaml"
    yaml_path.write_text(flowfiles.to_yaml(original.definitions, original.aliases))
    via_yaml = load_topology([yaml_path])
    props_path = tmp_path / "back.properties"
    props_path.write_text(flowfiles.to_properties(via_yaml.definitions, via_yaml.aliases))
    back = load_topology([props_path])
    expected = {k: p.value for k, p in original.props.items()}
    assert {k: p.value for k, p in via_yaml.props.items()} == expected
    assert {k: p.value for k, p in back.props.items()} == expected
