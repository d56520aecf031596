"""How a failed mirror batch becomes one line for the user, and which failures are retried."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.runtime.driver import batch_error
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
