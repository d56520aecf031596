"""Admin requests whose answers librdkafka can crash on, run in a helper process of their own.

librdkafka 2.16 (confluent-kafka 2.16.1, the newest release) kills the whole process on some
answers it cannot parse: its ``DescribeAcls``, ``CreateAcls`` and ``DeleteAcls`` parsers return
no error and no result for an answer cut short, and ``rd_kafka_admin_response_parse`` then fails
its assertion ``rko_result`` (SIGABRT); a ``ListGroups`` answer cut short makes its parser add
the error to a list it has not initialised yet (SIGSEGV, in librdkafka's own thread). A mirror
job died that way while its source broker restarted, taking every flow of its site with it.
These four requests therefore run in a child process (``python -m
mirrorflow.replication.admin_helper``), one per cluster and client config in a process, started
at the first such request and ended after :data:`IDLE_S` without one. When it dies the request
fails with one line (a ``_TRANSPORT`` error saying how the helper ended and what it or
librdkafka said last), which the caller handles like any failed request, and the next request
starts a new helper. ``tests/test_admin_crash.py`` shows both crashes with a plain client.

The parent sends the client config and then one JSON request a line on the child's stdin (never
on its command line: the config can hold secrets); the child answers a JSON line each on stdout.
The child ends when its stdin closes (its parent is gone) or after :data:`IDLE_S` without a
request, saying ``{"bye": true}`` first so that a request sent meanwhile is sent again to a new
helper, never lost or run twice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ConsumerGroupListing,
    ListConsumerGroupsResult,
    ResourcePatternType,
    ResourceType,
)

log = logging.getLogger("mirrorflow.kafka")

IDLE_S = 20.0
"""A helper with no request for this long ends (the next request starts another)."""

_SLACK_S = 10.0  # beyond a request's own timeout before the helper counts as frozen


# -- the wire: ACL bindings, group listings and errors as JSON ---------------------------------
def _acl(binding: AclBinding) -> list:
    return [
        _name(binding.restype),
        binding.name,
        _name(binding.resource_pattern_type),
        binding.principal,
        binding.host,
        _name(binding.operation),
        _name(binding.permission_type),
    ]


def _binding(fields: list, kind: type[AclBinding] = AclBinding) -> AclBinding:
    restype, name, pattern, principal, host, operation, permission = fields
    return kind(
        ResourceType[restype],
        name,
        ResourcePatternType[pattern],
        principal,
        host,
        AclOperation[operation],
        AclPermissionType[permission],
    )


def _error(exc: BaseException | KafkaError) -> dict:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if isinstance(err, KafkaError):
        return {"code": err.code(), "text": err.str()}
    return {"code": KafkaError._FAIL, "text": f"{type(exc).__name__}: {exc}"}


def _name(value: Any) -> str | None:
    return None if value is None else value.name


def _exception(error: dict) -> KafkaException:
    return KafkaException(KafkaError(error["code"], error["text"]))


# -- the child ----------------------------------------------------------------------------------
def _serve(request: dict, client: Any) -> Any:
    op, timeout = request["op"], request["timeout"]
    if op == "describe_acls":
        acl_filter = _binding(request["filter"], AclBindingFilter)
        found = client.describe_acls(acl_filter, request_timeout=timeout).result()
        return [_acl(b) for b in found]
    if op in ("create_acls", "delete_acls"):
        kind = AclBinding if op == "create_acls" else AclBindingFilter
        given = [_binding(b, kind) for b in request["acls"]]
        call = client.create_acls if op == "create_acls" else client.delete_acls
        futures = call(given, request_timeout=timeout)
        answers: list = []
        for acl in given:
            try:
                deleted = futures[acl].result()
                answers.append({"ok": [_acl(b) for b in deleted or []]})
            except KafkaException as exc:
                answers.append({"error": _error(exc)})
        return answers
    if op == "list_consumer_groups":
        listed = client.list_consumer_groups(request_timeout=timeout).result()
        return {
            "valid": [
                [g.group_id, g.is_simple_consumer_group, _name(g.state), _name(g.type)]
                for g in listed.valid
            ],
            "errors": [_error(e) for e in listed.errors],
        }
    raise ValueError(f"unknown admin request {op!r}")


def main() -> int:
    """Serve the requests on stdin until it closes or none comes for :data:`IDLE_S`."""
    import faulthandler

    from mirrorflow.replication import clients

    faulthandler.enable()  # a crash says where, on stderr, which the parent keeps
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    stdin = open(0, "rb", buffering=0, closefd=False)  # noqa: SIM115 (unbuffered: select sees every line)
    alias, config, idle_s = json.loads(stdin.readline())
    client = clients.admin(alias, config, to_stderr=True)
    while True:
        ready, _, _ = select.select([stdin], [], [], idle_s)
        if not ready:
            print(json.dumps({"bye": True}), flush=True)
            return 0
        line = stdin.readline()
        if not line:
            return 0
        request = json.loads(line)
        try:
            answer = {"id": request["id"], "ok": _serve(request, client)}
        except Exception as exc:  # KafkaException, or a binding confluent-kafka refused
            answer = {"id": request["id"], "error": _error(exc)}
        print(json.dumps(answer), flush=True)


# -- the parent ---------------------------------------------------------------------------------
def _package_path() -> str:
    """PYTHONPATH for the helper: where this mirrorflow was imported from, then the parent's."""
    import mirrorflow

    root = os.path.dirname(os.path.dirname(os.path.abspath(mirrorflow.__file__)))
    inherited = os.environ.get("PYTHONPATH")
    return root if not inherited else f"{root}{os.pathsep}{inherited}"


class _Gone(Exception):
    """The helper said goodbye before reading the request: send it to a new one."""


class _Helper:
    """One helper process and the threads that read its answers and what it says on stderr."""

    def __init__(self, alias: str, config: Mapping[str, Any]) -> None:
        self.alias = alias
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mirrorflow.replication.admin_helper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": _package_path()},
        )
        self.answers: queue.Queue[dict | None] = queue.Queue()
        self.said: deque[str] = deque(maxlen=40)
        threading.Thread(target=self._read_answers, daemon=True).start()
        self._stderr = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr.start()
        self._send([alias, dict(config), IDLE_S])

    def _send(self, message: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def _read_answers(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.answers.put(json.loads(line))
        # The helper ended (idle, or dead): reaped now, not at the next request, which may be a
        # sync interval away (its exit status stays on ``proc`` for :meth:`_ended`).
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=_SLACK_S)
        self.answers.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.said.append(line)
                log.debug("cluster %s: admin helper: %s", self.alias, line)

    def call(self, request: dict, timeout_s: float) -> Any:
        with contextlib.suppress(OSError):  # it ended: what it said comes below
            self._send(request)
        try:
            answer = self.answers.get(timeout=timeout_s + _SLACK_S)
        except queue.Empty:
            self.stop()
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"mirrorflow's admin helper process did not answer {request['op']} within "
                    f"{timeout_s + _SLACK_S:g}s and was stopped",
                )
            ) from None
        if answer is None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, self._ended(request["op"])))
        if answer.get("bye"):
            raise _Gone()
        if "error" in answer:
            raise _exception(answer["error"])
        return answer["ok"]

    def _ended(self, op: str) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.stop()
            code = self.proc.returncode
        self._stderr.join(2)  # its last words
        how = f"exit code {code}"
        if code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        said = _last_words(list(self.said))
        said = f"; it said last: {said}" if said else ""
        return (
            f"mirrorflow's admin helper process ended ({how}) during {op}{said}; "
            "the next request starts a new one"
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _last_words(lines: list[str]) -> str:
    """What a helper said before it died: Python's fatal-error line (a signal) and the line
    before it (librdkafka's failed assertion), or else its last line; not the stack trace."""
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python")), None)
    if fatal is None:
        return lines[-1] if lines else ""
    return " / ".join(lines[max(0, fatal - 1) : fatal + 1])


class AdminHelper:
    """The requests of one cluster and client config, run in a helper process (see the module).

    Its methods take and return what confluent-kafka's ``AdminClient`` does, the futures already
    done: a request that failed, or whose helper died, raises ``KafkaException`` from
    ``result()``. One request runs at a time; callers on other threads wait their turn."""

    def __init__(self, alias: str, config: Mapping[str, Any]) -> None:
        self.alias = alias
        self.config = {k: v for k, v in config.items() if not callable(v)}
        self._helper: _Helper | None = None
        self._lock = threading.Lock()
        self._ids = 0

    def _call(self, op: str, timeout_s: float, **fields: Any) -> Any:
        with self._lock:
            self._ids += 1
            request = {"id": self._ids, "op": op, "timeout": timeout_s, **fields}
            while True:
                if self._helper is None or not self._helper.alive():
                    self._helper = _Helper(self.alias, self.config)
                try:
                    return self._helper.call(request, timeout_s)
                except _Gone:
                    self._helper.stop()
                    self._helper = None
                except KafkaException:
                    if not self._helper.alive():
                        self._helper = None
                    raise

    def describe_acls(self, acl_filter: AclBindingFilter, request_timeout: float) -> Future:
        """The ACL bindings ``acl_filter`` matches."""
        return _done(
            lambda: [
                _binding(b)
                for b in self._call("describe_acls", request_timeout, filter=_acl(acl_filter))
            ]
        )

    def create_acls(self, bindings: list[AclBinding], request_timeout: float) -> dict:
        """Create ``bindings``: each binding -> a future of ``None`` or its refusal."""
        return self._each("create_acls", bindings, request_timeout, lambda _: None)

    def delete_acls(self, filters: list[AclBindingFilter], request_timeout: float) -> dict:
        """Delete what ``filters`` match: each filter -> a future of the bindings deleted."""
        return self._each("delete_acls", filters, request_timeout, lambda ok: ok)

    def _each(self, op: str, acls: list, timeout_s: float, value: Any) -> dict:
        try:
            answers = self._call(op, timeout_s, acls=[_acl(a) for a in acls])
        except KafkaException as exc:
            return {acl: _done(lambda exc=exc: _raise(exc)) for acl in acls}
        futures = {}
        for acl, answer in zip(acls, answers, strict=True):
            if "error" in answer:
                futures[acl] = _done(lambda e=answer["error"]: _raise(_exception(e)))
            else:
                futures[acl] = _done(lambda ok=answer["ok"]: value([_binding(b) for b in ok]))
        return futures

    def list_consumer_groups(self, request_timeout: float) -> Future:
        """The cluster's consumer groups, as a ``ListConsumerGroupsResult``."""

        def listed() -> ListConsumerGroupsResult:
            answer = self._call("list_consumer_groups", request_timeout)
            errors: list[Any] = [KafkaError(e["code"], e["text"]) for e in answer["errors"]]
            return ListConsumerGroupsResult(
                valid=[
                    ConsumerGroupListing(group, simple, state, kind)
                    for group, simple, state, kind in answer["valid"]
                ],
                errors=errors,  # KafkaErrors, as AdminClient's (typed as Exceptions)
            )

        return _done(listed)


_HELPERS: dict[tuple, AdminHelper] = {}
_HELPERS_LOCK = threading.Lock()


def helper(alias: str, config: Mapping[str, Any]) -> AdminHelper:
    """The process's :class:`AdminHelper` of ``alias`` with ``config``: one per cluster and
    client config, shared by every flow of a job."""
    key = (alias, tuple(sorted((k, str(v)) for k, v in config.items() if not callable(v))))
    with _HELPERS_LOCK:
        if key not in _HELPERS:
            _HELPERS[key] = AdminHelper(alias, config)
        return _HELPERS[key]


def _raise(exc: BaseException) -> Any:
    raise exc


def _done(compute: Any) -> Future:
    future: Future = Future()
    try:
        future.set_result(compute())
    except KafkaException as exc:
        future.set_exception(exc)
    return future


if __name__ == "__main__":
    sys.exit(main())
