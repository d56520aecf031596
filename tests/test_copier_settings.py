"""The JVM copier's settings for a flow (pure logic, no services): a batch's producer fills large
requests for throughput; a stream's producer, which writes to every partition of its flow
(hundreds in a mesh, every cluster's heartbeat chains) and keeps a buffer of ``batch.size`` per
partition in its pool, uses Kafka's default size and a short linger; settings the flow gives its
target producer hold for both."""

from __future__ import annotations

from mirrorflow.paths import write_private
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime.copier import copier_settings

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
