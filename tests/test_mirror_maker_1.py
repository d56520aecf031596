"""MirrorMaker 1's command (seed 004: ``kafka-mirror-maker.sh --consumer.config
consumer.properties --producer.config producer.properties --whitelist 'A|B'``) converted into a
flow file by ``mirrorflow convert``: the conversion rules offline, then a converted flow that
mirrors on the sandbox from where MirrorMaker 1's group stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from mirrorflow.cli import main
from mirrorflow.config import mm1, validation
from mirrorflow.config.topology import load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import write_private

SECRET = "mm1-s3cret-password"
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    f'username="mm1" password="{SECRET}";'
)


def mm1_files(directory: Path, consumer: dict[str, str], producer: dict[str, str]) -> list[str]:
    """MirrorMaker 1's two properties files (0600: they hold passwords) and the options
    naming them."""
    paths = []
    for name, settings in (("consumer", consumer), ("producer", producer)):
        text = "".join(f"{k}={v}\n" for k, v in settings.items())
        paths += [f"--{name}.config", str(write_private(directory / f"{name}.properties", text))]
    return paths


@pytest.mark.parametrize(
    ("raw", "regex"),
    [
        ("A|B", "A|B"),  # seed 004's
        ("A,B", "A|B"),  # "for convenience we allow the use of ',' instead of '|'"
        ("'orders, payments-.*'", "orders|payments-.*"),  # quoted and spaced, as shells leave it
        ('"x.*"', "x.*"),
        (" * ", ".*"),  # the old docs' "every topic", which Java's Pattern refuses
    ],
)
def test_the_topic_regex_is_read_as_kafkas_topic_filter_reads_it(raw, regex):
    assert mm1.include_regex(raw) == regex


def test_mirror_maker_1s_options_become_one_flow_that_validates_with_no_secret_in_it(
    tmp_path, capsys
):
    options = mm1_files(
        tmp_path,
        {
            "bootstrap.servers": "dc1:9092",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": JAAS,
            "group.id": "mm1-mirror",
            "client.id": "mirror",
            "max.poll.records": "1000",
        },
        {"bootstrap.servers": "dc2:9092", "linger.ms": "10", "producer.type": "sync"},
    )
    code = main(["convert", *options, "--whitelist", "A,B", "--num.streams", "4"])
    assert code == 0
    out, err = capsys.readouterr()
    flow_file = tmp_path / "flow.properties"
    flow_file.write_text(out)
    assert SECRET not in out + err
    lines = set(out.splitlines())
    consumer = (tmp_path / "consumer.properties").resolve()
    assert {
        "clusters = source, target",
        "source->target.enabled = true",
        "source->target.topics = A|B",
        "source->target.starting.offsets.group = mm1-mirror",
        "source.bootstrap.servers = dc1:9092",
        "source.security.protocol = SASL_PLAINTEXT",
        f"source.sasl.jaas.config = ${{file:{consumer}:sasl.jaas.config}}",
        "source.consumer.max.poll.records = 1000",
        "source.consumer.auto.offset.reset = latest",  # the Java consumer's default
        "target.bootstrap.servers = dc2:9092",
        "target.producer.linger.ms = 10",
        f"replication.policy.class = {mm1.IDENTITY_POLICY}",
        "config.providers = file",
        f"config.providers.file.class = {mm1.FILE_PROVIDER}",
    } <= lines, out
    assert not [line for line in lines if "client.id" in line or "producer.type" in line]
    notes = [line for line in err.splitlines() if line.startswith("mirrorflow: note: ")]
    assert any("client.id dropped" in n for n in notes), err
    assert any("producer.type dropped" in n for n in notes), err
    assert any("--num.streams dropped" in n for n in notes), err
    # What it wrote validates, and the secret is read from MirrorMaker 1's file.
    topology = load_topology([flow_file])
    assert not [f for f in validation.validate(topology) if f.severity == "error"]
    flow = topology.flow("source->target")
    assert flow.client_config("source.consumer")["sasl.jaas.config"] == JAAS
    assert flow.remote_topic("A") == "A"


def test_include_wins_over_whitelist_and_yaml_is_written_on_request(tmp_path, capsys):
    options = mm1_files(tmp_path, {"bootstrap.servers": "a:1"}, {"bootstrap.servers": "b:1"})
    args = ["--include", "x", "--whitelist", "y", "--source", "dc1", "--target", "dc2"]
    assert main(["convert", *options, *args, "--to", "yaml"]) == 0
    out, err = capsys.readouterr()
    assert "dc1->dc2:" in out and "topics: x" in out, out
    assert "has no group.id" in err  # where it starts is said, not guessed


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"consumer": {}}, "consumer.properties has no bootstrap.servers"),
        ({"include": ""}, "--include (or --whitelist) is required"),
        ({"abort": "false"}, "--abort.on.send.failure false is not supported"),
        ({"source": "dc", "target": "dc"}, "the source and target cluster names are both 'dc'"),
    ],
)
def test_what_mirror_maker_1_cannot_become_is_refused_in_one_line(tmp_path, change, message):
    consumer = change.get("consumer", {"bootstrap.servers": "a:1"})
    mm1_files(tmp_path, consumer, {"bootstrap.servers": "b:1"})
    command = mm1.Mm1Command(
        tmp_path / "consumer.properties",
        tmp_path / "producer.properties",
        include=change.get("include", "A"),
        abort_on_send_failure=change.get("abort"),
    )
    with pytest.raises(MirrorflowError) as refused:
        mm1.convert(command, change.get("source", "source"), change.get("target", "target"))
    assert message in refused.value.message, refused.value.message
    assert "\n" not in refused.value.message


def test_convert_without_a_file_or_mirror_maker_1s_options_says_so(capsys):
    assert main(["convert"]) == 2
    assert "convert needs a flow file, or MirrorMaker 1's" in capsys.readouterr().err


@pytest.mark.kafka
@pytest.mark.spark
def test_a_converted_mirror_maker_1_command_mirrors_from_where_its_group_stopped(
    sandbox, topic_name, tmp_path, capsys
):
    """Seed 004's command, with the ',' shorthand: the topics keep their names, each
    partition starts where MirrorMaker 1's group committed (a partition it never committed
    starts at the end, MirrorMaker 1's ``latest``), a topic the regex leaves out stays, and the
    records that arrive later follow."""
    from mirrorflow.devtools import sandbox as sandbox_mod
    from tests.conftest import create_topics
    from tests.mirror_harness import produce, read_topic, run_mirror_once, topic_names

    primary, secondary = sandbox["primary"], sandbox["secondary"]
    a, b, other = topic_name("mm1-a"), topic_name("mm1-b"), topic_name("mm1-other")
    for topic in (a, b, other):
        create_topics(primary, topic, partitions=2)
        produce(primary, topic, 2, 200)  # offsets 0-99 in each partition
    group = topic_name("mm1-group")
    committed = {(a, 0): 30, (a, 1): 40, (b, 0): 50}  # b-1: never committed
    consumer = Consumer({**primary.client_config(), "group.id": group})
    consumer.commit(
        offsets=[TopicPartition(t, p, o) for (t, p), o in committed.items()], asynchronous=False
    )
    consumer.close()
    options = mm1_files(
        tmp_path,
        {**primary.java_client_config(), "group.id": group},
        secondary.java_client_config(),
    )
    whitelist = f"'{a}, {b}'"
    assert main(["convert", *options, "--whitelist", whitelist, "--source", "primary",
                 "--target", "secondary"]) == 0  # fmt: skip
    out, _err = capsys.readouterr()
    config = tmp_path / "mirror.properties"
    single_broker = "".join(f"{name} = 1\n" for name in sandbox_mod.SINGLE_BROKER_FACTORS)
    write_private(config, out + single_broker + "emit.heartbeats.interval.seconds = 1\n")
    assert primary.passwords["admin"] not in out

    state = tmp_path / "state"
    run_mirror_once(config, "primary->secondary", state)
    source = {t: read_topic(primary, t) for t in (a, b)}
    for topic in (a, b):
        copies = read_topic(secondary, topic)  # the same name: no "primary." prefix
        for partition in (0, 1):
            start = committed.get((topic, partition), 100)  # latest: nothing of the 100
            expected = [r[1:] for r in source[topic][partition][start:]]
            assert [r[1:] for r in copies[partition]] == expected, (topic, partition)
    assert other not in topic_names(secondary)

    produce(primary, a, 2, 20, start=200)
    produce(primary, b, 2, 20, start=200)
    run_mirror_once(config, "primary->secondary", state)
    for topic in (a, b):
        copies = read_topic(secondary, topic)
        source = read_topic(primary, topic)
        for partition in (0, 1):
            start = committed.get((topic, partition), 100)
            assert [r[1:] for r in copies[partition]] == [
                r[1:] for r in source[partition][start:]
            ], (topic, partition)
