"""How a failed mirror batch becomes one line for the user, and which failures are retried."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.runtime.batch_errors import ProducerFenced, batch_error
from mirrorflow.runtime.eos_writer import ERROR_PREFIX

SPEC = SimpleNamespace(flow="dc1->dc2", source="dc1", target="dc2")


def wrapped(reason: str) -> str:
    """A batch failure as Spark reports it: the cause buried in a stack of wrappers."""
    return (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due to "
        "stage failure: Task 1 in stage 3.0 failed 1 times, most recent failure:\n"
        f"org.apache.spark.SparkException: {reason}\n\tat org.apache.spark.Foo.bar(Foo.scala:1)\n"
    )


@pytest.mark.parametrize(
    "reason",
    [
        "org.apache.kafka.common.errors.TimeoutException: Topic dc1.t not present in metadata "
        "after 60000 ms.",
        "Traceback ...\nmirrorflow.errors.ClusterUnreachable: reading positions from "
        "mm2-offsets.dc1.internal did not reach its end within 60s",
        f"{ERROR_PREFIX}committing the copies of t-0 to dc1.t on dc2 failed: Local: Timed out",
    ],
)
def test_a_cluster_that_does_not_answer_is_reported_as_retriable(reason):
    error = batch_error(SPEC, wrapped(reason))
    assert isinstance(error, ClusterUnreachable)
    assert error.message.startswith("flow dc1->dc2")


@pytest.mark.parametrize(
    "reason, expected",
    [
        (
            f"{ERROR_PREFIX}record t-0@3 (5000 bytes) is larger than max.message.bytes=2000",
            "record t-0@3 (5000 bytes)",
        ),
        (
            "org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed: "
            "Invalid username or password (after a TimeoutException)",
            "SaslAuthenticationException",
        ),
        (
            "Traceback ...\nmirrorflow.errors.MirrorflowError: cluster dc2 refused principal bob",
            "cluster dc2 refused principal bob",
        ),
    ],
)
def test_other_failures_stop_the_flow_with_their_cause_in_one_line(reason, expected):
    error = batch_error(SPEC, wrapped(reason))
    assert type(error) is MirrorflowError
    assert expected in error.message and "\n" not in error.message


@pytest.mark.parametrize(
    "reason",
    [
        f"{ERROR_PREFIX}committing the copies of t-0 to dc1.t on dc2 failed: Local: This "
        "instance has been fenced by a newer instance (nothing of it was committed)",
        'cimpl.KafkaException: KafkaError{code=_FENCED,val=-144,str="Local: This instance '
        'has been fenced by a newer instance"}',
        "org.apache.kafka.common.errors.ProducerFencedException: There is a newer producer "
        "with the same transactionalId which fences the current one.",
    ],
)
def test_a_batch_whose_producer_another_fenced_is_copied_again_not_a_stop(reason):
    """Exactly once, another producer of the flow's transactional ids (an earlier holder's
    retried task) fenced the batch's: nothing was committed, and the job that holds the lease
    copies it again (:class:`ProducerFenced`, which the flow's loop retries)."""
    error = batch_error(SPEC, wrapped(reason))
    assert isinstance(error, ProducerFenced), error
    assert error.message.startswith("flow dc1->dc2: its batch's transactional producer was fenced")
    assert "\n" not in error.message and "fence" in error.message.split(": ", 2)[2].lower()


def test_a_kafka_error_behind_a_callbacks_system_error_is_the_one_named():
    """A delivery report librdkafka calls while a produce() fails (the producer fenced) makes
    Python raise ``SystemError: <function _Acks.__call__ ...> returned a result with an
    exception set``; the line names the client's error, its cause, not that."""
    from confluent_kafka import KafkaError, KafkaException

    cause = KafkaException(
        KafkaError(KafkaError._FENCED, "Local: This instance has been fenced by a newer instance")
    )
    try:
        try:
            raise cause
        except KafkaException as pending:
            raise SystemError(
                "<function _Acks.__call__ at 0x7f0> returned a result with an exception set"
            ) from pending
    except SystemError as exc:
        error = batch_error(SPEC, exc)
    assert isinstance(error, ProducerFenced), error
    assert "fenced by a newer instance" in error.message and "_Acks" not in error.message


@pytest.mark.parametrize(
    "reason",
    [
        "org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized to access "
        "topics: [dc1.t] (after a TimeoutException)",
        f"{ERROR_PREFIX}committing the copies of t-0 to dc1.t on dc2 failed: Broker: Topic "
        "authorization failed (Local: Timed out)",
        "org.apache.kafka.common.errors.SslAuthenticationException: SSL handshake failed "
        "(NetworkException)",
        "org.apache.kafka.common.config.ConfigException: Invalid value x for configuration "
        "request.timeout.ms (TimeoutException)",
    ],
)
def test_a_refusal_or_a_bad_setting_is_never_retried_even_beside_a_timeout(reason):
    error = batch_error(SPEC, wrapped(reason))
    assert type(error) is MirrorflowError, error
    assert "\n" not in error.message


@pytest.mark.parametrize(
    "code", ["_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL", "TOPIC_AUTHORIZATION_FAILED"]
)
def test_an_admin_call_refused_or_failing_its_tls_handshake_is_not_retried(code):
    from confluent_kafka import KafkaError, KafkaException

    from mirrorflow.replication.topics import cluster_error

    admin = SimpleNamespace(alias="dc2", principal="bob")
    exc = KafkaException(KafkaError(getattr(KafkaError, code), "refused"))
    error = cluster_error(admin, "listing topics", exc)
    assert type(error) is MirrorflowError and "dc2" in error.message, error
    unreachable = cluster_error(admin, "listing topics", KafkaException(KafkaError(-195, "down")))
    assert isinstance(unreachable, ClusterUnreachable)  # _TRANSPORT: worth trying again


class _Answer:
    """A listed offset as librdkafka hands it back: a future whose result has an offset."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def result(self):
        return self


def _offsets_with_answers(answers: dict[tuple[str, int], int]):
    """A flow's :class:`SourceOffsets` whose source admin client's ``list_offsets`` answers as
    librdkafka does after a request that timed out."""
    from mirrorflow.replication.source_offsets import SourceOffsets

    def list_offsets(requests, **_options):
        return {tp: _Answer(answers[(tp.topic, tp.partition)]) for tp in requests}

    client = SimpleNamespace(list_offsets=list_offsets)
    spec = SimpleNamespace(flow="dc1->dc2", source="dc1", target="dc2", source_consumer={})
    return SourceOffsets(spec, SimpleNamespace(client=client))


def test_an_unknown_end_offset_is_retried_never_read_as_a_truncated_partition():
    """With its link cut, librdkafka answers a listing of end offsets with -1001 and no error
    after its timeout; taken as an end, every partition looked truncated and was copied again
    from its start (1,000,000 records twice in an exactly-once soak)."""
    from confluent_kafka.admin import OffsetSpec

    offsets = _offsets_with_answers({("t", 0): 250_000, ("t", 1): -1001})
    with pytest.raises(ClusterUnreachable, match=r"gave no offset for t-1 \(answer -1001"):
        offsets.ends([("t", 0), ("t", 1)])
    fine = _offsets_with_answers({("t", 0): 250_000, ("t", 1): 0})
    assert fine.ends([("t", 0), ("t", 1)]) == {("t", 0): 250_000, ("t", 1): 0}
    # By time, -1 means that no record is that late: an answer, kept for the caller.
    late = _offsets_with_answers({("t", 0): -1})
    at = late.offsets([("t", 0)], lambda t, p: OffsetSpec.for_timestamp(1), True)
    assert at == {("t", 0): -1}


def test_a_group_offset_fetch_that_times_out_is_reported_as_unreachable(monkeypatch):
    """Over a slow, lossy link (50 ms RTT, 1% loss) an offset fetch of the checkpoint task can
    time out: it is waited for, then reported as an unreachable cluster (it raised
    UnboundLocalError, ``cannot access local variable 'exc'``, and the task failed with that)."""
    import socket

    from mirrorflow.replication import group_offsets_client

    with socket.socket() as closed:  # a port nothing listens on: every request times out
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(group_offsets_client, "COORDINATOR_WAIT_S", 1.0)
    monkeypatch.setattr(group_offsets_client, "COMMITTED_WAIT_S", 0.5)
    admin = SimpleNamespace(alias="dc1", principal="alice")
    client = group_offsets_client.GroupOffsetsClient(
        admin, {"bootstrap.servers": f"127.0.0.1:{port}", "log_level": "0"}
    )
    with pytest.raises(ClusterUnreachable, match="cluster dc1 did not answer while reading"):
        client.committed("billing", [("orders", 0)])


class _Unknown:
    """A topic's described configs as librdkafka answers while the broker does not know it."""

    def result(self):
        from confluent_kafka import KafkaError, KafkaException

        raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "Unknown topic"))


def test_a_remote_topic_created_but_unknown_to_its_overloaded_broker_is_retried(monkeypatch):
    """In a mesh of 6 on 2 cores a broker took longer than the wait to learn the heartbeat
    topics its controller had just created: the flow failed for good ("describing [...]
    failed: Broker: Unknown topic or partition"). It is the target not answering: retried."""
    from confluent_kafka.admin import ConfigEntry

    from mirrorflow.replication import topics

    monkeypatch.setattr(topics, "ADMIN_TIMEOUT_S", 0.3)
    target = SimpleNamespace(
        alias="dc2",
        principal="bob",
        client=SimpleNamespace(describe_configs=lambda rs: {r: _Unknown() for r in rs}),
    )
    remote = topics.RemoteTopics(
        None, target, lambda t: True, lambda t: f"dc1.{t}", 1, lambda c: True, "dc1->dc2"
    )
    with pytest.raises(ClusterUnreachable) as raised:
        remote._max_message_bytes(["dc1.heartbeats"])
    assert raised.value.message == (
        "cluster dc2 did not answer while describing dc1.heartbeats: created, but still unknown "
        "to it after 0s"
    )

    class Known:
        def result(self):
            return {"max.message.bytes": ConfigEntry("max.message.bytes", "1048588")}

    target.client = SimpleNamespace(describe_configs=lambda rs: {r: Known() for r in rs})
    assert remote._max_message_bytes(["dc1.heartbeats"]) == {"dc1.heartbeats": 1048588}
