"""A broker answer librdkafka cannot parse fails the admin request, never the mirror job.

librdkafka 2.16 (confluent-kafka 2.16.1) kills the whole process on some answers it cannot
parse: an ACL answer cut short fails its assertion ``rko_result`` (SIGABRT), a ``ListGroups``
answer cut short makes it write through an uninitialised list (SIGSEGV). A job whose source
broker sent such an answer while it restarted died with every flow of its site. The first two
tests show the hazard with a plain ``AdminClient`` in a child process: once librdkafka is fixed
they fail, and the helper process of :mod:`mirrorflow.replication.admin_helper` may go.

What a user relies on is the rest: through :class:`~mirrorflow.replication.topics.ClusterAdmin`
the same answer fails that one request with a ``KafkaException`` saying how mirrorflow's admin
helper process ended (and what it said last), the job's process lives on and keeps talking to
the cluster, and the next request starts a new helper.

No Kafka cluster: a fake broker (:mod:`tests.malformed_broker`) sends the answers.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest
from confluent_kafka import KafkaError, KafkaException

from mirrorflow.replication.acl_sync import EVERY_ACL
from mirrorflow.replication.topics import ClusterAdmin
from tests.malformed_broker import DESCRIBE_ACLS, LIST_GROUPS, MalformedBroker

# The ListGroups crash comes from an uninitialised list on librdkafka's stack: SIGSEGV (realloc
# of a garbage pointer, in its rdk:main thread) every time here, but other garbage could abort.
LIST_GROUPS_CRASHES = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT)

_PLAIN = """\
import sys
from confluent_kafka.admin import (
    AclBindingFilter, AclOperation, AclPermissionType, AdminClient, ResourcePatternType,
    ResourceType,
)
client = AdminClient({"bootstrap.servers": sys.argv[1]})  # kept: a dropped client ends requests
"""

_DESCRIBE_ACLS = """\
client.describe_acls(
    AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY,
    ),
    request_timeout=10,
).result()
"""

_LIST_GROUPS = "client.list_consumer_groups(request_timeout=10).result()\n"


def _plain_admin_client(broker: MalformedBroker, call: str) -> subprocess.CompletedProcess:
    """Run ``call`` with confluent-kafka's own ``AdminClient`` of ``broker`` in a child."""
    return subprocess.run(
        [sys.executable, "-c", _PLAIN + call, broker.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _signal(returncode: int) -> str:
    return signal.Signals(-returncode).name if returncode < 0 else f"exit code {returncode}"


def test_librdkafka_aborts_on_an_acl_answer_it_cannot_parse() -> None:
    with MalformedBroker(DESCRIBE_ACLS) as broker:
        child = _plain_admin_client(broker, _DESCRIBE_ACLS)
    assert broker.malformed_sent.is_set(), broker.requests
    assert child.returncode == -signal.SIGABRT, (
        f"{_signal(child.returncode)} (librdkafka fixed? then the admin helper may go): "
        f"{child.stderr}"
    )
    assert "Assertion" in child.stderr
    assert "rko_result" in child.stderr


def test_librdkafka_crashes_on_a_list_groups_answer_it_cannot_parse() -> None:
    with MalformedBroker(LIST_GROUPS) as broker:
        child = _plain_admin_client(broker, _LIST_GROUPS)
    assert broker.malformed_sent.is_set(), broker.requests
    assert child.returncode < 0, (
        f"{_signal(child.returncode)}, not killed by a signal (librdkafka fixed? then the admin "
        f"helper may go): {child.stdout}{child.stderr}"
    )
    assert signal.Signals(-child.returncode) in LIST_GROUPS_CRASHES, child.stderr


def _helper_ended(excinfo: pytest.ExceptionInfo[KafkaException]) -> str:
    error = excinfo.value.args[0]
    assert isinstance(error, KafkaError)
    assert error.code() == KafkaError._TRANSPORT, error
    return error.str()


def test_an_acl_answer_librdkafka_cannot_parse_fails_the_request_alone() -> None:
    with MalformedBroker(DESCRIBE_ACLS) as broker:
        admin = ClusterAdmin("fake", {"bootstrap.servers": broker.bootstrap})
        with pytest.raises(KafkaException) as excinfo:
            admin.describe_acls(EVERY_ACL, request_timeout=10).result()
        text = _helper_ended(excinfo)
        assert "admin helper process ended (killed by SIGABRT)" in text
        assert "rko_result" in text  # what the helper said last: librdkafka's assertion
        assert "the next request starts a new one" in text
        assert broker.malformed_sent.is_set()

        # This process lives on, its own client of the cluster too; the next request gets a
        # new helper (which the same answer ends the same way).
        assert broker.port in [b.port for b in admin.metadata().brokers.values()]
        broker.malformed_sent.clear()
        with pytest.raises(KafkaException) as again:
            admin.describe_acls(EVERY_ACL, request_timeout=10).result()
        assert "admin helper process ended (killed by SIGABRT)" in _helper_ended(again)
        assert broker.malformed_sent.is_set()


def test_a_list_groups_answer_librdkafka_cannot_parse_fails_the_request_alone() -> None:
    with MalformedBroker(LIST_GROUPS) as broker:
        admin = ClusterAdmin("fake", {"bootstrap.servers": broker.bootstrap})
        with pytest.raises(KafkaException) as excinfo:
            admin.list_consumer_groups(request_timeout=10).result()
        text = _helper_ended(excinfo)
        ended = re.search(r"admin helper process ended \(killed by (SIG[A-Z]+)\)", text)
        assert ended, text
        assert signal.Signals[ended.group(1)] in LIST_GROUPS_CRASHES, text
        assert "Protocol read buffer underflow for ListGroups" in text  # librdkafka's last line
        assert broker.malformed_sent.is_set()

        assert broker.port in [b.port for b in admin.metadata().brokers.values()]
        broker.malformed_sent.clear()
        with pytest.raises(KafkaException) as again:
            admin.list_consumer_groups(request_timeout=10).result()
        assert f"admin helper process ended (killed by {ended.group(1)})" in _helper_ended(again)
        assert broker.malformed_sent.is_set()
