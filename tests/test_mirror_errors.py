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
