"""Clients of a cluster that does not answer say so in one line naming the cluster, not in
librdkafka's line per connection attempt (issue 24); refusals are said, once each.

The first test runs real librdkafka clients against a loopback port nothing listens on (a
connection refused at once, as by a stopped broker); the others feed :class:`ClusterLog` the
lines and error events librdkafka gives, as recorded from it."""

from __future__ import annotations

import contextlib
import logging
import socket
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from mirrorflow.replication import clients

THREAD = "[thrd:sasl_plaintext://127.0.0.1:9/bootstrap]: sasl_plaintext://127.0.0.1:9/bootstrap: "
REFUSED = (
    THREAD + "Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)"
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def said(caplog, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_clients_of_a_stopped_cluster_say_so_once_and_print_nothing_of_librdkafka(caplog, capfd):
    caplog.set_level(logging.DEBUG, "mirrorflow.kafka")
    alias = f"stopped-{closed_port()}"
    config = {"bootstrap.servers": f"127.0.0.1:{closed_port()}"}
    admin = clients.admin(alias, config)
    consumer = clients.consumer(alias, {**config, "group.id": "g"})
    producer = clients.producer(alias, {**config, "message.timeout.ms": 2000})
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=0.5)
        except KafkaException:
            admin.poll(0.1)
        consumer.poll(0.1)
    producer.produce("t", b"x")
    producer.flush(3)
    with contextlib.suppress(KafkaException):
        consumer.committed([TopicPartition("t", 0)], timeout=1)
    consumer.close()

    out, err = capfd.readouterr()
    assert "Connect to" not in out + err and "Connection refused" not in out + err
    warnings = said(caplog, logging.WARNING)
    assert warnings == [
        f"cluster {alias} does not answer at {config['bootstrap.servers']} (its brokers refuse "
        f"connections): check {alias}.bootstrap.servers and that the cluster is up"
    ]
    repeats = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(repeats) > 10  # librdkafka's own lines, kept at DEBUG

    clients.answered(alias)
    clients.answered(alias)
    assert said(caplog)[1:] == [f"cluster {alias} answers again"]


def test_an_outage_after_an_answer_is_said_again_but_not_attempts_handed_over_late(
    caplog, monkeypatch
):
    caplog.set_level(logging.INFO, "mirrorflow.kafka")
    log = clients.ClusterLog("c1", "h:1")
    log.event("alice", logging.ERROR, REFUSED)
    assert log.down
    log.answered()
    # A client polled just after the answer hands over its attempts from the outage.
    log.event("alice", logging.ERROR, REFUSED)
    assert not log.down
    monkeypatch.setattr(clients, "STALE_AFTER_ANSWER_S", 0.0)
    log.event("alice", logging.ERROR, "1/1 brokers are down", KafkaError._ALL_BROKERS_DOWN)
    assert not log.down  # the brokers' own failures say why they are down
    log.event("alice", logging.ERROR, REFUSED, KafkaError._TRANSPORT)
    assert log.down
    assert [m.split(" (")[0] for m in said(caplog)] == [
        "cluster c1 does not answer at h:1",
        "cluster c1 answers again",
        "cluster c1 does not answer at h:1",
    ]


def test_refusals_are_said_once_each_and_closed_connections_not_at_all(caplog):
    caplog.set_level(logging.DEBUG, "mirrorflow.kafka")
    log = clients.ClusterLog("c2", "h:1")
    sasl = (
        THREAD + "SASL authentication error: Authentication failed during authentication due to "
        "invalid credentials with SASL mechanism SCRAM-SHA-512 (after 12ms in state AUTH_REQ)"
    )
    for _ in range(3):
        log.event("mallory", logging.ERROR, sasl)  # the log line
        log.event("mallory", logging.ERROR, sasl, KafkaError._AUTHENTICATION)  # the error event
    log.event("bob", logging.ERROR, sasl, KafkaError._AUTHENTICATION)
    idle = THREAD + "Disconnected: connection closed by peer (after 56631ms in state UP)"
    log.event("bob", logging.INFO, idle)
    log.event("bob", logging.ERROR, idle, KafkaError._TRANSPORT)
    tls = THREAD + "SSL handshake failed: certificate verify failed (after 3ms in state SSL)"
    log.event("bob", logging.ERROR, tls, KafkaError._SSL)
    log.event("bob", logging.ERROR, "1/1 brokers are down", KafkaError._ALL_BROKERS_DOWN)
    fenced = "Fatal error: Broker: Producer attempted an operation with an old epoch"
    log.event("bob", logging.ERROR, fenced, KafkaError._FATAL)
    log.event("bob", logging.ERROR, fenced, KafkaError._FATAL)
    warnings = said(caplog, logging.WARNING)
    plain = sasl[len(THREAD) :].replace(" (after 12ms in state AUTH_REQ)", "")
    assert warnings == [
        f"cluster c2 refused principal mallory: {plain}: check the credentials, TLS "
        "settings and ACLs of mallory for c2",
        f"cluster c2 refused principal bob: {plain}: check the credentials, TLS settings and "
        "ACLs of bob for c2",
        "cluster c2 refused principal bob: SSL handshake failed: certificate verify failed: "
        "check the credentials, TLS settings and ACLs of bob for c2",
        f"cluster c2: {fenced}",
    ]
    assert not log.down


def test_a_client_made_here_still_tells_its_own_error_callback():
    told: list[int] = []
    config = {"bootstrap.servers": f"127.0.0.1:{closed_port()}", "error_cb": told.append}
    admin = clients.admin("c3", config, on_error=lambda err: told.append(err.code()))
    try:
        admin.list_topics(timeout=1)
    except KafkaException:
        admin.poll(0.5)
    assert KafkaError._TRANSPORT in told and any(isinstance(e, KafkaError) for e in told)


def test_a_quiet_client_leaves_saying_it_to_its_caller(caplog):
    caplog.set_level(logging.DEBUG, "mirrorflow.kafka")
    told: list[KafkaError] = []
    config = {"bootstrap.servers": f"127.0.0.1:{closed_port()}"}
    admin = clients.admin("c4", config, on_error=told.append, quiet=True)
    with contextlib.suppress(KafkaException):
        admin.list_topics(timeout=1)
    admin.poll(0.5)
    assert told and said(caplog) == []


class _Answer:
    offset = 42


class _Future:
    def __init__(self, error: int | None) -> None:
        self.error = error

    def result(self):
        if self.error is not None:
            raise KafkaException(KafkaError(self.error))
        return _Answer()


class _Admin:
    """list_offsets answering ``errors`` in turn, then the offset; counts metadata refreshes."""

    def __init__(self, *errors: int) -> None:
        self.errors, self.calls, self.refreshes = list(errors), 0, 0

    def list_offsets(self, partitions, **_options):
        self.calls += 1
        error = self.errors.pop(0) if self.errors else None
        return {tp: _Future(error) for tp in partitions}

    def list_topics(self, topic=None, timeout=-1):
        self.refreshes += 1


def test_a_topic_is_read_to_its_end_while_its_leader_moves():
    """A leader moving (a topic just created, a broker restarting) is retried, not reported
    as an unreachable cluster (`mirrorflow translate` failed so once on a fresh offsets topic);
    a refusal is not retried."""
    from mirrorflow.replication.positions import SourceOffsetReader

    reader = object.__new__(SourceOffsetReader)  # no clients: only the admin's answers
    reader._partitions = [TopicPartition("mm2-offsets.primary.internal", 0)]
    moving = KafkaError.NOT_LEADER_FOR_PARTITION
    admin = _Admin(moving, moving)
    assert reader._stable_ends(admin, 5.0) == {0: 42}
    assert admin.calls == 3
    # Asked with a leader epoch from before a restart: asked again after fresh metadata.
    stale, unknown = KafkaError.FENCED_LEADER_EPOCH, KafkaError._NOENT  # "No leaders found"
    admin = _Admin(unknown, stale)
    assert reader._stable_ends(admin, 5.0) == {0: 42}
    assert (admin.calls, admin.refreshes) == (3, 2)
    refusing = _Admin(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with contextlib.suppress(KafkaException):
        reader._stable_ends(refusing, 5.0)
    assert refusing.calls == 1


@pytest.mark.kafka
def test_a_reader_of_an_internal_topic_reads_on_after_its_only_broker_restarted(
    sandbox, topic_name
):
    """A reader keeps its clients between two reads (until it is released). Its only broker
    restarting bumps the topics' leader epochs; the reader must not keep asking with the old
    ones (FENCED_LEADER_EPOCH for ever, the flow stuck in retries: a CI run's
    broker-restart test timed out so), but read on once the broker is back."""
    from confluent_kafka import Producer

    from mirrorflow.devtools import sandbox as sandbox_mod
    from mirrorflow.mm2.formats import SourceOffset
    from mirrorflow.replication.positions import SourceOffsetReader
    from tests.conftest import create_topics

    tertiary = sandbox["tertiary"]
    topic = topic_name("reader-restart")
    create_topics(tertiary, topic, partitions=2)
    config = tertiary.client_config()

    def write(partition: int, offset: int) -> None:
        position = SourceOffset("primary", "orders", partition, offset)
        producer = Producer(config)
        producer.produce(topic, position.value(), position.key(), partition=partition)
        assert producer.flush(30) == 0

    write(0, 41)
    reader = SourceOffsetReader(config, config, topic, "primary", cluster="tertiary")
    try:
        assert reader.read_to_end(30) == {("orders", 0): 41}
        sandbox_mod.down(sandbox.directory, ["tertiary"])
        sandbox_mod.up(["tertiary"], sandbox.directory)
        write(1, 7)
        started = time.monotonic()
        assert reader.read_to_end(30) == {("orders", 0): 41, ("orders", 1): 7}
        assert time.monotonic() - started < 15, "the reader took the restart for an outage"
    finally:
        reader.close()


@pytest.mark.kafka
def test_an_idle_reader_of_an_internal_topic_sends_its_broker_no_fetch(sandbox, topic_name):
    """A reader keeps its clients between two reads (a flow's failback reads its reverse
    offset map so, at every checkpoint). Between two reads it must not long-poll its broker
    (twice a second, per reader: in a mesh of 6, the broker threads of a job's Kafka clients used
    more of its idle CPU than its Python). It still reads what is added after the pause. One
    read only at a flow's start (its positions, its offset map) is released after it: its
    clients end, and its next read starts others and reads on from where it stopped."""
    import json

    from confluent_kafka import Producer

    from mirrorflow.mm2.formats import SourceOffset
    from mirrorflow.replication.positions import SourceOffsetReader
    from tests.conftest import create_topics

    tertiary = sandbox["tertiary"]
    topic = topic_name("reader-idle")
    create_topics(tertiary, topic, partitions=2)
    config = tertiary.client_config()
    producer = Producer(config)

    def write(partition: int, offset: int) -> None:
        position = SourceOffset("primary", "orders", partition, offset)
        producer.produce(topic, position.value(), position.key(), partition=partition)
        assert producer.flush(30) == 0

    stats: list[dict] = []

    def fetches() -> int:
        """Fetch requests the reader's consumer sent so far (librdkafka's statistics)."""
        assert reader._clients is not None
        reader._clients.consumer.poll(0)  # serves the statistics callbacks
        return sum(b["req"].get("Fetch", 0) for b in stats[-1]["brokers"].values())

    write(0, 41)
    reader = SourceOffsetReader(
        {
            **config,
            "statistics.interval.ms": 250,
            "stats_cb": lambda s: stats.append(json.loads(s)),
        },
        config,
        topic,
        "primary",
        cluster="tertiary",
    )
    try:
        assert reader.read_to_end(30) == {("orders", 0): 41}
        time.sleep(0.5)
        before = fetches()
        time.sleep(4)
        assert fetches() - before == 0, "the idle reader kept fetching"
        write(1, 7)
        write(0, 42)
        assert reader.read_to_end(30) == {("orders", 0): 42, ("orders", 1): 7}
        assert reader.read_to_end(30) == {("orders", 0): 42, ("orders", 1): 7}
        reader.release()
        assert reader._clients is None
        write(1, 8)
        assert reader.read_to_end(30) == {("orders", 0): 42, ("orders", 1): 8}
        assert reader._next == {0: 2, 1: 2}  # each partition read on to its end, no further
    finally:
        reader.close()
