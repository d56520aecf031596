"""Record transforms in flight (issue 26): MirrorMaker 2's Connect ``transforms`` and mirrorflow's
``record.filter`` drop and reshape records exactly as MirrorMaker 2 does, and a failed-over
group still reads exactly the records it had not consumed among those that passed.

The chain's meaning is checked offline against Connect's rules (``TransformationStage``: a
stage applies when ``negate XOR predicate``); the scenarios run MirrorMaker 2 beside mirrorflow
on the sandbox clusters.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from mirrorflow.config import validation
from mirrorflow.config.topology import load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.policy import DefaultReplicationPolicy, IdentityReplicationPolicy
from mirrorflow.mm2.transforms import TransformError, compile_transforms, heartbeats_predicate
from mirrorflow.paths import write_private
from mirrorflow.replication.positions import SourceOffsetReader, offsets_topic
from mirrorflow.replication.spec import spec_for_flow
from tests.conftest import create_topics
from tests.mirror_harness import flow_file, read_topic, start_mirror, stop_job
from tests.test_checkpoints import checkpoint_lines, consume_and_commit, read_as_group, synced
from tests.test_mirror_job import EXACTLY_ONCE
from tests.test_mm2_interop import MM2_WORKER, run_mm2_until

CONNECT = "org.apache.kafka.connect.transforms."


def chain(flow: str, *, tombstones: str, sql: str = "value IS NOT NULL") -> list[str]:
    """Drop test traffic (a ``test`` header) and the ``trace`` headers; tombstones go by
    ``tombstones``: "connect" (a Filter with RecordIsTombstone) or "sql" (record.filter
    ``sql``)."""
    names = "dropTest, dropTrace" + (", dropTombstones" if tombstones == "connect" else "")
    lines = [
        f"{flow}.transforms = {names}",
        f"{flow}.transforms.dropTest.type = {CONNECT}Filter",
        f"{flow}.transforms.dropTest.predicate = isTest",
        f"{flow}.transforms.dropTrace.type = {CONNECT}DropHeaders",
        f"{flow}.transforms.dropTrace.headers = trace",
        f"{flow}.predicates = isTest" + (", isTombstone" if tombstones == "connect" else ""),
        f"{flow}.predicates.isTest.type = {CONNECT}predicates.HasHeaderKey",
        f"{flow}.predicates.isTest.name = test",
    ]
    if tombstones == "connect":
        lines += [
            f"{flow}.transforms.dropTombstones.type = {CONNECT}Filter",
            f"{flow}.transforms.dropTombstones.predicate = isTombstone",
            f"{flow}.predicates.isTombstone.type = {CONNECT}predicates.RecordIsTombstone",
        ]
    else:
        lines.append(f"{flow}.record.filter = {sql}")
    return lines


def produce_mixed(cluster, topic: str, count: int) -> set[bytes]:
    """``count`` records over 2 partitions: every 4th is test traffic (a ``test`` header), every
    7th a tombstone, all with a ``trace`` header, some with others; returns the keys of the
    records that pass :func:`chain`."""
    producer = Producer({**cluster.client_config(), "enable.idempotence": True})
    passing = set()
    for i in range(count):
        headers = [("trace", b"t%d" % i)]
        if i % 4 == 0:
            headers.append(("test", b""))
        if i % 3 == 0:
            headers.append(("region", b"eu"))
        value = None if i % 7 == 0 else b"value-%d" % i
        producer.produce(topic, value, b"k%d" % i, partition=i % 2, headers=headers)
        if i % 4 and i % 7:
            passing.add(b"k%d" % i)
    assert producer.flush(30) == 0
    return passing


def as_copied(records: dict[int, list]) -> dict[int, list]:
    """Each partition's records as a copy must show them: key, value, headers, timestamp."""
    return {
        p: [(key, value, headers, ts) for _offset, key, value, headers, ts in msgs]
        for p, msgs in records.items()
    }


def test_the_chain_means_what_connect_makes_of_it():
    # Connect applies a stage when negate XOR predicate; Filter then drops the record.
    negated = compile_transforms(
        {
            "transforms": "keepOrders",
            "transforms.keepOrders.type": "Filter",
            "transforms.keepOrders.predicate": "isOrders",
            "transforms.keepOrders.negate": "true",
            "predicates": "isOrders",
            "predicates.isOrders.type": f"{CONNECT}predicates.TopicNameMatches",
            "predicates.isOrders.pattern": r"primary\.orders.*",
        }
    )
    assert negated is not None
    assert negated.keep == "(NOT (NOT (remote_topic RLIKE '\\\\A(?:primary\\\\.orders.*)\\\\z')))"
    assert not negated.changes_headers
    # A header dropped by an earlier stage is not seen by a later stage's predicate.
    ordered = compile_transforms(
        {
            "transforms": "strip, dropMarked",
            "transforms.strip.type": f"{CONNECT}DropHeaders",
            "transforms.strip.headers": "marked",
            "transforms.dropMarked.type": f"{CONNECT}Filter",
            "transforms.dropMarked.predicate": "marked",
            "predicates": "marked",
            "predicates.marked.type": "HasHeaderKey",
            "predicates.marked.name": "marked",
        }
    )
    assert ordered is not None and "filter(coalesce(headers" in ordered.keep
    assert compile_transforms({"transforms": ""}) is None
    assert compile_transforms({}, "  ") is None


def test_a_record_filter_never_drops_the_heartbeats_topics_of_the_flows_policy():
    default = heartbeats_predicate(DefaultReplicationPolicy())
    assert default == "((topic = 'heartbeats') OR endswith(topic, '.heartbeats'))"
    assert heartbeats_predicate(IdentityReplicationPolicy()) == default  # as MM2 names them
    chain = compile_transforms({}, "value IS NOT NULL", heartbeats=default)
    assert chain is not None
    assert chain.keep == f"(coalesce((value IS NOT NULL), false) OR {default})"


@pytest.mark.parametrize(
    ("config", "culprit"),
    [
        ({"transforms": "a"}, "transforms.a.type: missing"),
        ({"transforms": "a, a", "transforms.a.type": "Filter"}, "duplicate alias 'a'"),
        (
            {"transforms": "a", "transforms.a.type": f"{CONNECT}HeaderFrom$Value"},
            "cannot work on MirrorMaker 2's raw bytes",
        ),
        (
            {"transforms": "a", "transforms.a.type": "Filter", "transforms.a.predicate": "p"},
            "predicate 'p' is used but not listed",
        ),
        (
            {
                "transforms": "a",
                "transforms.a.type": "Filter",
                "transforms.a.predicate": "p",
                "predicates": "p",
                "predicates.p.type": "TopicNameMatches",
                "predicates.p.pattern": "(unclosed",
            },
            "predicates.p.pattern: not a Java regex",
        ),
        ({"transforms": "a", "transforms.a.type": "DropHeaders"}, "transforms.a.headers: missing"),
        (
            {"transforms": "a", "transforms.a.type": "Filter", "transforms.a.negate": "true"},
            "negate without a predicate",
        ),
    ],
)
def test_what_cannot_be_honoured_is_named_in_one_line(config, culprit):
    with pytest.raises(TransformError, match=culprit.replace("$", r"\$").replace("(", r"\(")):
        compile_transforms(config)


def test_validate_names_each_transform_it_cannot_honour_and_where_mirrormaker_2_differs(tmp_path):
    flow = "a->b"
    lines = [
        "clusters = a, b",
        "a.bootstrap.servers = localhost:1",
        "b.bootstrap.servers = localhost:2",
        f"{flow}.enabled = true",
        *chain(flow, tombstones="connect"),
        f"{flow}.transforms.forgotten.type = {CONNECT}Filter",
    ]
    config = write_private(tmp_path / "mm2.properties", "\n".join(lines) + "\n")
    findings = validation.validate(load_topology([config]))
    text = [str(f) for f in findings]
    assert all(f.severity == "warning" for f in findings), text
    assert any("forgotten is not listed in transforms" in t for t in text), text
    assert any("heartbeat and checkpoint records" in t for t in text), text

    bad = write_private(
        tmp_path / "bad.properties",
        "\n".join([*lines[:4], f"{flow}.transforms = x", f"{flow}.transforms.x.type = Cast$Value"])
        + "\n",
    )
    findings = validation.validate(load_topology([bad]))
    assert [f.key for f in findings if f.severity == "error"] == [f"{flow}.transforms.x.type"]
    top = write_private(
        tmp_path / "top.properties",
        "\n".join([*lines[:4], "transforms = x", f"transforms.x.type = {CONNECT}Filter"]) + "\n",
    )
    [error] = [f for f in validation.validate(load_topology([top])) if f.severity == "error"]
    assert (error.key, error.location.line) == ("transforms.x.type", 6)
    assert "MirrorMaker 2 drops a transform's and a predicate's settings at top level" in str(error)
    with pytest.raises(
        MirrorflowError, match=r"flow a->b does not run: .* transform Cast\$Value cannot work"
    ):
        spec_for_flow([bad], flow)


@pytest.mark.kafka
@pytest.mark.spark
def test_mirrorflow_copies_what_mirrormaker_2_copies_and_a_group_fails_over_exactly(
    sandbox, topic_name, tmp_path
):
    primary, secondary, tertiary = sandbox["primary"], sandbox["secondary"], sandbox["tertiary"]
    t, group = topic_name("pii"), topic_name("analytics")
    remote = f"primary.{t}"
    create_topics(primary, t, partitions=2)
    passing = produce_mixed(primary, t, 600)
    consumed = consume_and_commit(primary, t, group, {0: 121, 1: 88})

    # MirrorMaker 2 into secondary, with Connect's transforms only.
    (tmp_path / "mm2").mkdir()
    mm2_flow = "primary->secondary"
    mm2_config = flow_file(
        tmp_path / "mm2", sandbox, t, *chain(mm2_flow, tombstones="connect"), *MM2_WORKER
    )
    reader = SourceOffsetReader(
        secondary.client_config(), secondary.client_config(), offsets_topic("primary"), "primary"
    )

    def mm2_read_everything() -> bool:
        try:  # MirrorMaker 2 commits the source offsets of the records it drops too
            found = reader.read_to_end(timeout_s=10)
        except Exception:  # the topic may not exist yet
            return False
        return all(found.get((t, p), -1) >= 299 for p in (0, 1))

    try:
        run_mm2_until(mm2_config, tmp_path / "mm2.log", mm2_read_everything, "MM2's positions")
    finally:
        reader.close()
    by_mm2 = as_copied(read_topic(secondary, remote))

    # mirrorflow into tertiary, tombstones dropped by its Spark SQL filter, its group checkpointed.
    flow = "primary->tertiary"
    config = flow_file(
        tmp_path,
        sandbox,
        t,
        *chain(flow, tombstones="sql"),
        *checkpoint_lines(group, flow),
        target="tertiary",
    )
    job = start_mirror(config, flow, tmp_path / "state", tmp_path / "job.log")
    try:
        synced(config, tertiary, group, remote, 2, flow=flow)
        by_mirrorflow = as_copied(read_topic(tertiary, remote))
        assert {m[0] for msgs in by_mirrorflow.values() for m in msgs} == passing
        assert by_mirrorflow == by_mm2
        assert all(("trace" not in dict(m[2])) for msgs in by_mirrorflow.values() for m in msgs)

        read = read_as_group(tertiary, remote, group)
        assert len(read) == len(set(read)), "a record was read twice"
        assert set(read) == passing - consumed
    finally:
        stop_job(job)


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_filtered_and_rewritten_flow_fails_over_exactly_and_its_position_passes_the_gaps(
    mode, sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t, group = topic_name(f"pii-{mode}"), topic_name(f"reports-{mode}")
    remote = f"primary.{t}"
    create_topics(primary, t, partitions=2)
    passing = produce_mixed(primary, t, 400)
    consumed = consume_and_commit(primary, t, group, {0: 60, 1: 140})
    flow = "primary->secondary"
    config = flow_file(
        tmp_path,
        sandbox,
        t,
        # the last record of each partition is dropped (k399 is a tombstone anyway)
        *chain(flow, tombstones="sql", sql="value IS NOT NULL AND key NOT IN (X'6B333938')"),
        f"{flow}.record.value = upper(CAST(value AS STRING))",  # a STRING: its UTF-8 bytes
        *checkpoint_lines(group, flow),
        *(EXACTLY_ONCE if mode == "exactly-once" else []),
    )
    passing -= {b"k398", b"k399"}
    job = start_mirror(config, flow, tmp_path / "state", tmp_path / "job.log")
    try:
        synced(config, secondary, group, remote, 2, flow=flow)
        copied = as_copied(read_topic(secondary, remote))
        assert sorted(m[0] for msgs in copied.values() for m in msgs) == sorted(passing)
        assert all(m[1] == b"VALUE-" + m[0][1:] for msgs in copied.values() for m in msgs)
        read = read_as_group(secondary, remote, group)
        assert len(read) == len(set(read)), "a record was read twice"
        assert set(read) == passing - consumed
    finally:
        stop_job(job)
    # The positions moved past the dropped records at the partitions' ends: nothing is behind.
    positions = SourceOffsetReader(
        secondary.client_config(), secondary.client_config(), offsets_topic("primary"), "primary"
    )
    try:
        found = positions.read_to_end(timeout_s=10)
    finally:
        positions.close()
    assert {p: found.get((t, p)) for p in (0, 1)} == {0: 199, 1: 199}
