"""The JVM copier's settings for a flow (pure logic, no services): a batch's producer fills large
requests for throughput; a stream's producer, which writes to every partition of its flow
(hundreds in a mesh, every cluster's heartbeat chains) and keeps a buffer of ``batch.size`` per
partition in its pool, uses Kafka's default size and a short linger; settings the flow gives its
target producer hold for both. And the copier's results as the driver decodes them."""

from __future__ import annotations

import struct

from mirrorflow.paths import write_private
from mirrorflow.replication.offset_map import Run
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime.copier import CopierResult, copier_settings
from mirrorflow.runtime.metrics import Copied, Stats

FLOW = "a->b"
MAPPING = {"orders": "a.orders", "heartbeats": "a.heartbeats"}
LIMITS = {"a.orders": 1_048_588, "a.heartbeats": 1_048_588}


def settings_of(tmp_path, *lines: str, limits: dict[str, int] = LIMITS) -> dict[str, str]:
    config = write_private(
        tmp_path / "mm2.properties",
        "\n".join(
            [
                "clusters = a, b",
                "a.bootstrap.servers = localhost:1",
                "b.bootstrap.servers = localhost:2",
                f"{FLOW}.enabled = true",
                *lines,
            ]
        )
        + "\n",
    )
    return copier_settings(spec_for_flow([config], FLOW), MAPPING, limits)


def test_a_stream_writes_small_batches_where_a_batch_fills_large_ones(tmp_path):
    settings = settings_of(tmp_path)
    assert settings["producer.batch.size"] == str(512 << 10)
    assert settings["producer.linger.ms"] == "20"
    assert settings["stream.producer.batch.size"] == "16384"  # Kafka's default
    assert settings["stream.producer.linger.ms"] == "5"
    assert settings["topic.orders"] == "a.orders"
    assert settings["limit.a.heartbeats"] == "1048588"


def test_the_batch_size_and_linger_a_flow_sets_hold_for_its_stream_too(tmp_path):
    settings = settings_of(tmp_path, "b.producer.batch.size = 65536", "b.producer.linger.ms = 50")
    assert (settings["producer.batch.size"], settings["producer.linger.ms"]) == ("65536", "50")
    assert not [key for key in settings if key.startswith("stream.producer.")], settings


def test_no_batch_is_larger_than_the_smallest_limit_of_the_remote_topics(tmp_path):
    """Kafka's producer splits a batch the broker refuses into batches of its ``batch.size``:
    above a topic's ``max.message.bytes`` it would split forever (KAFKA-8350)."""
    small = {"a.orders": 4_000, "a.heartbeats": 1_048_588}
    settings = settings_of(tmp_path, limits=small)
    assert settings["producer.batch.size"] == "4000"
    assert settings["stream.producer.batch.size"] == "4000"
    assert settings["producer.max.request.size"] == str(1_048_588 + (64 << 10))
    flow_set = settings_of(tmp_path, "b.producer.batch.size = 65536", limits=small)
    assert flow_set["producer.batch.size"] == "4000"
    assert (
        settings_of(tmp_path, "b.producer.batch.size = 2048", limits=small)["producer.batch.size"]
        == "2048"
    )


def test_a_stream_reads_heartbeat_topics_once_a_beat_and_data_topics_as_records_arrive(tmp_path):
    """Every heartbeat topic the flow copies, its source's own and those copied along chains
    of flows, is marked paced (read once a beat); a data topic is not, even one whose name
    ends like one."""
    mapping = {
        "heartbeats": "a.heartbeats",
        "c.heartbeats": "a.c.heartbeats",
        "d.c.heartbeats": "a.d.c.heartbeats",
        "orders": "a.orders",
        "orders-heartbeats": "a.orders-heartbeats",
    }
    limits = dict.fromkeys(mapping.values(), 1_048_588)
    config = write_private(
        tmp_path / "mm2.properties",
        f"clusters = a, b\na.bootstrap.servers = localhost:1\nb.bootstrap.servers = localhost:2\n"
        f"{FLOW}.enabled = true\n",
    )
    settings = copier_settings(spec_for_flow([config], FLOW), mapping, limits)
    paced = sorted(key.removeprefix("paced.") for key in settings if key.startswith("paced."))
    assert paced == ["c.heartbeats", "d.c.heartbeats", "heartbeats"]


def test_the_copiers_results_decode_per_partition_with_their_runs_and_stalls():
    """``MirrorCopier.Copied.encode``'s block as the driver reads it: a partition given in two
    ranges is one partition's figures, its runs count its records, and a range the source left
    unfinished is named with the offset it reached."""
    no_value = (1 << 63) - 1  # the JVM's min of no values
    ranges = [
        # bytes, age min/max/sum/count, latency min/max/sum/count, reached, stalled,
        # caught up at, end seen
        (300, 5, 9, 14, 2, 20, 30, 50, 2, 12, 0, 1_000, 12),
        (100, no_value, 0, 0, 0, no_value, 0, 0, 0, 40, 1, -1, -1),
        (200, 1, 1, 1, 1, 8, 8, 8, 1, 13, 0, 2_000, 15),
    ]
    runs = [(0, 10, 100, 2), (2, 12, 102, 1), (1, 30, 7, 3)]
    block = (
        struct.pack(">qqqq", 6, 600, len(ranges), 4)
        + b"".join(struct.pack(">13q", *r) for r in ranges)
        + b"".join(struct.pack(">qqqq", *r) for r in runs)
    )
    partitions = [("t", 0), ("t", 1), ("t", 0)]
    result = CopierResult.decode(block, partitions)
    assert (result.records, result.bytes, result.batches_split) == (6, 600, 4)
    assert result.copied[("t", 0)] == Copied(3, 500, Stats(1, 9, 15, 3), Stats(8, 30, 58, 3))
    assert result.copied[("t", 1)] == Copied(3, 100, Stats(), Stats())
    assert result.runs == {("t", 0): [Run(10, 100, 2), Run(12, 102, 1)], ("t", 1): [Run(30, 7, 3)]}
    assert result.reached == [12, 40, 13]
    assert result.stalled == [(("t", 1), 40)]
    assert (result.caught_up_ms, result.ends_seen) == ([1_000, -1, 2_000], [12, -1, 15])
    # A stream that was gone when it was ended answers with no ranges.
    empty = CopierResult.decode(struct.pack(">qqqq", 0, 0, 0, 0), partitions)
    assert (empty.copied, empty.reached, empty.runs) == ({}, [], {})
