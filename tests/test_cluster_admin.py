"""A cluster's admin requests that librdkafka can crash on (ACLs, listing consumer groups) run in
a helper process: they answer as confluent-kafka's ``AdminClient`` does, and a helper that dies,
freezes or idles away costs the caller one failed request with one line, never the process.

The first test runs against a real sandbox cluster; the others need no broker: the helper is
killed, frozen or left idle while it waits on a loopback port that accepts connections and never
answers (as a broker stuck mid-restart). ``test_admin_crash.py`` shows librdkafka's own crash.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from mirrorflow.replication import admin_helper
from mirrorflow.replication.acl_sync import EVERY_ACL
from mirrorflow.replication.topics import ClusterAdmin
from tests.conftest import create_topics


def _topic_filter(topic: str, operation: AclOperation = AclOperation.ANY) -> AclBindingFilter:
    return AclBindingFilter(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        None,
        None,
        operation,
        AclPermissionType.ANY,
    )


def _helper_pid(admin: ClusterAdmin) -> int:
    running = admin._helper._helper
    assert running is not None and running.alive()
    return running.proc.pid


@pytest.mark.kafka
def test_acl_requests_and_consumer_groups_answer_as_admin_client_does(sandbox, topic_name):
    cluster = sandbox["primary"]
    admin = ClusterAdmin("primary", cluster.client_config())
    direct = AdminClient(cluster.client_config())
    topic, group = topic_name("acl"), topic_name("group")
    create_topics(cluster, topic)
    wanted = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            "User:alice",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in (AclOperation.READ, AclOperation.DESCRIBE)
    ]

    created = admin.create_acls(wanted, request_timeout=30)
    assert list(created) == wanted  # keyed by the bindings given, as AdminClient's are
    assert [f.result() for f in created.values()] == [None, None]
    helper = _helper_pid(admin)
    found = admin.describe_acls(_topic_filter(topic), request_timeout=30).result()
    assert sorted(found) == sorted(wanted)  # AclBindings compare by their seven fields
    assert sorted(found) == sorted(direct.describe_acls(_topic_filter(topic)).result(timeout=30))
    # bob has no ALTER on the cluster: his refusal is the broker's, on that binding's future
    bob = ClusterAdmin("primary", cluster.client_config("bob"))
    refused = bob.create_acls(wanted[:1], request_timeout=30)[wanted[0]]
    with pytest.raises(KafkaException) as caught:
        refused.result()
    assert caught.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED

    consumer = Consumer({**cluster.client_config(), "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    consumer.close()
    listed = admin.list_consumer_groups(request_timeout=30).result()
    assert group in {g.group_id for g in listed.valid}
    assert listed.errors == []
    mine = next(g for g in listed.valid if g.group_id == group)
    theirs = next(
        g for g in direct.list_consumer_groups().result(timeout=30).valid if g.group_id == group
    )
    assert (mine.is_simple_consumer_group, mine.state, mine.type) == (
        theirs.is_simple_consumer_group,
        theirs.state,
        theirs.type,
    )
    assert _helper_pid(admin) == helper  # one helper served them all

    os.kill(helper, signal.SIGKILL)  # between two requests: the next starts a new helper
    time.sleep(0.2)
    deleted = admin.delete_acls([_topic_filter(topic, AclOperation.READ)], request_timeout=30)
    assert [f.result() for f in deleted.values()] == [[wanted[0]]]
    assert _helper_pid(admin) != helper
    left = direct.describe_acls(_topic_filter(topic)).result(timeout=30)
    assert left == [wanted[1]]
    admin.delete_acls([_topic_filter(topic)], request_timeout=30)


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """A loopback port that takes connections and never answers one."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    taken: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                taken.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in taken:
        conn.close()
    server.close()


def _in_background(call) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = call().result()
        except KafkaException as exc:
            outcome["error"] = exc.args[0]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for_helper(admin: ClusterAdmin) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        running = admin._helper._helper
        if running is not None and running.alive():
            return running.proc.pid
        time.sleep(0.05)
    raise AssertionError("no helper process started")


def test_a_helper_killed_mid_request_fails_that_request_in_one_line_and_the_next_starts_anew(
    silent_broker,
):
    admin = ClusterAdmin("stuck", {"bootstrap.servers": silent_broker})
    thread, outcome = _in_background(lambda: admin.describe_acls(EVERY_ACL, request_timeout=60))
    pid = _wait_for_helper(admin)
    time.sleep(1.0)  # inside the request: librdkafka waits for the broker's answer
    started = time.monotonic()
    os.kill(pid, signal.SIGABRT)  # as librdkafka's failed assertion does
    thread.join(15)
    assert not thread.is_alive() and time.monotonic() - started < 10
    error = outcome["error"]
    assert error.code() == KafkaError._TRANSPORT
    text = error.str()
    assert "admin helper process ended (killed by SIGABRT)" in text
    assert "Fatal Python error: Aborted" in text  # what it said last, on stderr
    assert "\n" not in text

    thread, outcome = _in_background(lambda: admin.list_consumer_groups(request_timeout=1))
    thread.join(30)
    assert not thread.is_alive()
    assert _helper_pid(admin) != pid  # a new helper took the request (and timed out there)
    assert [e.code() for e in outcome["result"].errors] == [KafkaError._TIMED_OUT]


def test_a_frozen_helper_is_stopped_after_the_request_timeout_and_its_slack(
    silent_broker, monkeypatch
):
    monkeypatch.setattr(admin_helper, "_SLACK_S", 1.0)  # 10 s in a job
    admin = ClusterAdmin("frozen", {"bootstrap.servers": silent_broker})
    thread, outcome = _in_background(
        lambda: admin.create_acls(
            [
                AclBinding(
                    ResourceType.TOPIC,
                    "t",
                    ResourcePatternType.LITERAL,
                    "User:alice",
                    "*",
                    AclOperation.READ,
                    AclPermissionType.ALLOW,
                )
            ],
            request_timeout=1,
        ).popitem()[1]
    )
    pid = _wait_for_helper(admin)
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    thread.join(20)
    assert not thread.is_alive()
    assert time.monotonic() - started < 1 + 1 + 5  # the request's timeout, the slack, a kill
    assert outcome["error"].code() == KafkaError._TIMED_OUT
    assert "did not answer create_acls" in outcome["error"].str()
    with pytest.raises(ProcessLookupError):  # killed, and reaped
        os.kill(pid, 0)


def test_an_idle_helper_ends_by_itself_and_the_next_request_starts_another(
    silent_broker, monkeypatch
):
    monkeypatch.setattr(admin_helper, "IDLE_S", 1.0)
    admin = ClusterAdmin("idle", {"bootstrap.servers": silent_broker})
    admin.list_consumer_groups(request_timeout=0.5).result()
    first = admin._helper._helper
    assert first is not None
    # Said goodbye, ended, and reaped at once: no <defunct> process under the job until its
    # next request (a job of six flows kept 12 of them between its syncs).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(first.proc.pid, 0)  # a zombie still takes signal 0
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the idle helper {first.proc.pid} was not reaped")
    assert first.proc.returncode == 0
    listed = admin.list_consumer_groups(request_timeout=0.5).result()
    assert [e.code() for e in listed.errors] == [KafkaError._TIMED_OUT]  # the broker's silence
    assert admin._helper._helper is not first
