"""Every confluent-kafka client mirrorflow makes (admin clients, consumers, producers), made here
for one named cluster, so that a cluster that does not answer makes one line, not hundreds.

Left to itself, librdkafka writes a line to stderr for each failed connection attempt of each
client, from its own threads: an emergency failover with the source broker killed printed 454
``Connect to ipv4#… failed: Connection refused`` lines (issue 24). A client made here hands its
log lines (confluent-kafka's ``logger`` setting) and its error events (``error_cb``) to the
:class:`ClusterLog` of its cluster, one per cluster alias and process, which logs to the
``mirrorflow.kafka`` logger:

* the first sign that the cluster does not answer (a refused or failed connection, all brokers
  down, an address that does not resolve, a request that timed out) as one WARNING naming the
  cluster, where it was looked for and what to check; the repeats at DEBUG, until
  :func:`answered` says the cluster answered again (one INFO line), after which a new outage is
  said again;
* an authentication or TLS refusal once per principal and distinct error, at WARNING (never
  hidden: these do not mend by retrying);
* librdkafka's other warnings and errors once per distinct text (timings and thread names left
  out), at WARNING; its informational lines, closed connections and what it retries by
  itself at DEBUG.

A caller that says in its own line why a cluster failed it (``mirrorflow plan``) makes its
clients ``quiet``: what librdkafka says about them goes to DEBUG only.

librdkafka delivers both only while the client is polled (``poll``, ``consume``, ``flush``), on
the polling thread; a client that is never polled keeps them queued and says nothing. A failed
call still raises its error, which the caller turns into its own one-line error
(:func:`mirrorflow.replication.topics.cluster_error`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

log = logging.getLogger("mirrorflow.kafka")

ErrorCallback = Callable[[KafkaError], None]

_UNREACHABLE_CODES = (
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError._TIMED_OUT,
)
_REFUSED_CODES = (
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._SSL,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)
# What librdkafka says when it cannot reach a broker, and why (first match wins).
_UNREACHABLE = (
    ("failed to resolve", "its broker addresses do not resolve"),
    ("connection refused", "its brokers refuse connections"),
    ("connect to ", "no connection to its brokers"),
    ("timed out", "its brokers do not answer in time"),
)
_REFUSED = ("sasl authentication", "authentication failed", "ssl handshake", "certificate")
# Lines with no news for an operator: a connection closed (librdkafka reconnects by itself),
# a request it retries by itself (e.g. while a coordinator loads), all brokers down (each
# broker's own failure says why: refused, not resolved, a TLS handshake, credentials).
_QUIET = (
    "disconnected",
    "connection reset",
    "receive failed",
    "send failed",
    "retrying",
    "brokers are down",
)
# librdkafka's thread and broker names (``sasl_ssl://host:9093/bootstrap: ``; the cluster is
# named instead, so one refusal is said once, not once per bootstrap server) and timings.
_NOISE = re.compile(
    r"^\[thrd:[^\]]*\]:\s*|^\w+://[^/\s]+/[\w-]+:\s*"
    r"|\s*\((?:after \d+ms[^)]*|\d+ identical[^)]*)\)|\d+ms"
)
_SAID_AT_MOST = 200  # distinct texts said per cluster; past that, DEBUG (a runaway source)
# librdkafka hands events over when a client is polled, so a client polled just after the
# cluster answered again may still hand over its failed attempts from during the outage: for
# this long after an answer, those do not make a new outage (one that lasts is said after it,
# librdkafka retrying a broker at least every reconnect.backoff.max.ms, 10 s by default).
STALE_AFTER_ANSWER_S = 15.0


class ClusterLog:
    """What librdkafka says about one cluster, said once (see the module's documentation)."""

    def __init__(self, cluster: str, bootstrap: str) -> None:
        self.cluster, self.bootstrap = cluster, bootstrap
        self.down = False  # said that it does not answer, and it has not answered since
        self.answered_at = float("-inf")  # when it last answered after an outage (monotonic)
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def _first(self, key: str) -> bool:
        with self._lock:
            if key in self._said or len(self._said) >= _SAID_AT_MOST:
                return False
            self._said.add(key)
            return True

    def unreachable(self, why: str, detail: str) -> None:
        with self._lock:
            stale = time.monotonic() - self.answered_at < STALE_AFTER_ANSWER_S
            first = not self.down and not stale
            self.down = self.down or not stale
        if first:
            log.warning(
                "cluster %s does not answer at %s (%s): check %s.bootstrap.servers and that "
                "the cluster is up",
                self.cluster,
                self.bootstrap,
                why,
                self.cluster,
            )
        else:
            log.debug("cluster %s: %s", self.cluster, detail)

    def refused(self, principal: str, detail: str) -> None:
        if self._first(f"refused {principal} {_plain(detail)}"):
            log.warning(
                "cluster %s refused principal %s: %s: check the credentials, TLS settings and "
                "ACLs of %s for %s",
                self.cluster,
                principal,
                _plain(detail),
                principal,
                self.cluster,
            )
        else:
            log.debug("cluster %s: %s", self.cluster, detail)

    def other(self, level: int, detail: str) -> None:
        text = _plain(detail)
        if level >= logging.WARNING and self._first(text):
            log.log(level, "cluster %s: %s", self.cluster, text)
        else:
            log.debug("cluster %s: %s", self.cluster, detail)

    def answered(self) -> None:
        with self._lock:
            was, self.down = self.down, False
            if was:
                self.answered_at = time.monotonic()
        if was:
            log.info("cluster %s answers again", self.cluster)

    def event(self, principal: str, level: int, detail: str, code: int | None = None) -> None:
        """One librdkafka log line or error event (``code``) of a client of ``principal``."""
        lowered = detail.lower()
        if code in _REFUSED_CODES or any(s in lowered for s in _REFUSED):
            self.refused(principal, detail)
        elif any(s in lowered for s in _QUIET) and "connection refused" not in lowered:
            log.debug("cluster %s: %s", self.cluster, detail)
        elif code in _UNREACHABLE_CODES or code is None:
            why = next((w for s, w in _UNREACHABLE if s in lowered), None)
            if why is not None:
                self.unreachable(why, detail)
            elif code is None:
                self.other(level, detail)
            else:  # e.g. a transport error with no words above: a transient one
                log.debug("cluster %s: %s", self.cluster, detail)
        else:
            self.other(logging.WARNING, detail)


def _plain(detail: str) -> str:
    """librdkafka's text without its thread and broker names and timings, so that repeats
    compare equal."""
    return _NOISE.sub("", _NOISE.sub("", detail, count=1)).strip()


_LOGS: dict[str, ClusterLog] = {}
_LOGS_LOCK = threading.Lock()


def cluster_log(cluster: str, bootstrap: str = "?") -> ClusterLog:
    """The process's :class:`ClusterLog` of ``cluster`` (made at its first client)."""
    with _LOGS_LOCK:
        found = _LOGS.get(cluster)
        if found is None:
            found = _LOGS[cluster] = ClusterLog(cluster, bootstrap)
        return found


def answered(cluster: str) -> None:
    """``cluster`` answered a request: if it had been said not to, say that it answers again."""
    found = _LOGS.get(cluster)
    if found is not None and found.down:
        found.answered()


class _ClientLogger(logging.Logger):
    """One client's ``logger`` and ``error_cb``: librdkafka calls ``log(level, "%s [%s] %s",
    facility, client name, text)`` for each log line, :meth:`on_error` gets each error event."""

    def __init__(
        self, target: ClusterLog, principal: str, also: ErrorCallback | None, quiet: bool
    ) -> None:
        super().__init__(f"mirrorflow.kafka.{target.cluster}")
        self.target, self.principal, self.also, self.quiet = target, principal, also, quiet

    def log(self, level: int, msg: object, *args: object, **_kwargs: Any) -> None:
        text = str(args[2]) if len(args) == 3 else (str(msg) % args if args else str(msg))
        self._event(level, text, None)

    def on_error(self, err: KafkaError) -> None:
        self._event(logging.ERROR, err.str(), err.code())
        if self.also is not None:
            self.also(err)

    def _event(self, level: int, text: str, code: int | None) -> None:
        if self.quiet:
            log.debug("cluster %s: %s", self.target.cluster, text)
        else:
            self.target.event(self.principal, level, text, code)


def _config(
    cluster: str, config: Mapping[str, Any], on_error: ErrorCallback | None, quiet: bool
) -> dict:
    settings = dict(config)
    chained = settings.pop("error_cb", None)
    also = on_error
    if chained is not None:
        also = chained if on_error is None else _both(on_error, chained)
    principal = str(settings.get("sasl.username") or settings.get("sasl.kerberos.principal") or "")
    target = cluster_log(cluster or "(unnamed)", str(settings.get("bootstrap.servers", "?")))
    hook = _ClientLogger(target, principal or "(no SASL user)", also, quiet)
    settings["logger"] = hook
    settings["error_cb"] = hook.on_error
    return settings


def _both(first: ErrorCallback, second: ErrorCallback) -> ErrorCallback:
    def call(err: KafkaError) -> None:
        first(err)
        second(err)

    return call


def admin(
    cluster: str,
    config: Mapping[str, Any],
    on_error: ErrorCallback | None = None,
    quiet: bool = False,
    to_stderr: bool = False,
) -> AdminClient:
    """An admin client of ``cluster`` (its alias) with ``config`` (librdkafka settings);
    ``on_error`` is told each error event too (as is an ``error_cb`` in ``config``). ``quiet``:
    the caller says in its own line why the cluster failed it (``mirrorflow plan``), so what
    librdkafka says goes to DEBUG only. ``to_stderr``: librdkafka writes its log lines to stderr
    itself, as it says them (the admin helper process, whose parent keeps them: a line queued
    for a ``poll`` would die with a crash it explains)."""
    settings = _config(cluster, config, on_error, quiet)
    if to_stderr:
        del settings["logger"]
    return AdminClient(settings)


def consumer(
    cluster: str,
    config: Mapping[str, Any],
    on_error: ErrorCallback | None = None,
    quiet: bool = False,
) -> Consumer:
    """A consumer of ``cluster``; see :func:`admin`."""
    return Consumer(_config(cluster, config, on_error, quiet))


def assigned_consumer(
    cluster: str, config: Mapping[str, Any], group: str, settings: Mapping[str, Any]
) -> Consumer:
    """A consumer of ``cluster`` that reads the partitions it is assigned and never joins nor
    commits its group: ``config`` (a flow's consumer settings, their ``group.id`` and
    ``auto.offset.reset`` left out), ``group`` (confluent-kafka needs one all the same) and
    ``settings`` over them (its ``auto.offset.reset`` among them)."""
    kept = {k: v for k, v in config.items() if k not in ("group.id", "auto.offset.reset")}
    return consumer(
        cluster,
        {
            **kept,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            **settings,
        },
    )


class ProducersOnDemand:
    """A producer per cluster (its alias), each started at its first use: a flow that streams
    never writes to its source from the driver (its copier writes the offset syncs), and an
    idle client still wakes its threads every second."""

    def __init__(self, configs: Mapping[str, Mapping[str, Any]]) -> None:
        self._configs = dict(configs)
        self._started: dict[str, Producer] = {}
        self._lock = threading.Lock()  # the flow's loop and its tasks' threads

    def __getitem__(self, cluster: str) -> Producer:
        return self.start(cluster)

    def start(self, cluster: str) -> Producer:
        """``cluster``'s producer, started now unless it was."""
        with self._lock:
            started = self._started.get(cluster)
            if started is None:
                started = self._started[cluster] = producer(cluster, self._configs[cluster])
            return started

    def started(self) -> dict[str, Producer]:
        """The producers started so far, by cluster."""
        with self._lock:
            return dict(self._started)


def producer(
    cluster: str,
    config: Mapping[str, Any],
    on_error: ErrorCallback | None = None,
    quiet: bool = False,
) -> Producer:
    """A producer to ``cluster``; see :func:`admin`."""
    return Producer(_config(cluster, config, on_error, quiet))


def connect(client: Producer | AdminClient, topic: str, timeout_s: float) -> None:
    """Return once a new ``client`` has a connection up to a broker it learned from the cluster.

    A new client's first request goes through its bootstrap connection, which librdkafka gives
    up as soon as it knows the brokers; a request that finds no connection up then waits for a
    timer, not for the connection: 0.5 s for a transactional producer's coordinator, 1 s for an
    admin client's partition leaders (a third of an exactly-once task's producers waited so, and
    its offsets look-ups under load). Two metadata requests of ``topic``: the first goes through
    the bootstrap connection, the second through a learned broker's. ``topic`` must exist (a
    metadata request for a missing one may create it where the broker creates topics on demand).
    Raises :class:`KafkaException` if the cluster does not answer within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for _ in range(2):
        client.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))


def init_transactions(producer: Producer, topic: str, timeout_s: float) -> None:
    """``producer.init_transactions`` of a new producer, without librdkafka's 0.5-s wait for a
    connection (:func:`connect`; ``topic`` exists on its cluster). Raises
    :class:`KafkaException` as ``init_transactions`` does."""
    deadline = time.monotonic() + timeout_s
    connect(producer, topic, timeout_s)
    producer.init_transactions(max(0.1, deadline - time.monotonic()))


# What a partition's offsets answer says while its leader moves (a topic just created, a broker
# restarting): the leader is not known yet, or the client asked with a leader epoch from before
# the move. "No leaders found" (_NOENT) is librdkafka's own answer from its metadata cache.
LEADER_MOVING_CODES = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError._NOENT,
)


class OffsetsError(KafkaException):
    """:func:`list_offsets` failed for ``partition`` (``args[0]``: its :class:`KafkaError`)."""

    def __init__(self, error: KafkaError, partition: TopicPartition) -> None:
        super().__init__(error)
        self.partition = partition


def list_offsets(
    client: AdminClient,
    specs: Mapping[TopicPartition, Any],
    isolation_level: Any,
    request_timeout: float,
    settle_s: float = 10.0,
    retriable: bool = False,
) -> dict[TopicPartition, int]:
    """The offsets ``specs`` ask for (``OffsetSpec`` per partition), as ``AdminClient.
    list_offsets`` answers them, asked again for up to ``settle_s`` while a leader moves.

    Before asking again, the metadata of the topic whose leader moved is refreshed (a moving
    leader may also be a topic just deleted: that error comes after ``settle_s``, not at
    once). librdkafka's admin client looks
    leaders up in its metadata cache and sends their leader epochs, and a client that only
    lists offsets never refreshes that cache by itself, so after a single broker restarted
    (its partitions' leader epochs bumped) it would be answered FENCED_LEADER_EPOCH for ever.
    ``retriable``: errors librdkafka flags retriable (a timeout) are asked again too. Any other
    error, or one still there after ``settle_s``, raises :class:`OffsetsError` naming the
    partition."""
    import tenacity

    def ask() -> dict[TopicPartition, int]:
        futures = client.list_offsets(
            dict(specs), isolation_level=isolation_level, request_timeout=request_timeout
        )
        answers: dict[TopicPartition, int] = {}
        for tp, future in futures.items():
            try:
                answers[tp] = future.result().offset
            except KafkaException as exc:
                raise OffsetsError(exc.args[0], tp) from None
        return answers

    def refresh(state: tenacity.RetryCallState) -> None:
        """The metadata of the topic whose partition's leader moved (one request)."""
        failed = state.outcome.exception() if state.outcome is not None else None
        if isinstance(failed, OffsetsError):
            with contextlib.suppress(KafkaException):
                client.list_topics(failed.partition.topic, timeout=min(request_timeout, 5.0))

    def moving(exc: BaseException) -> bool:
        if not isinstance(exc, OffsetsError):
            return False
        error = exc.args[0]  # a partition's answer carries the code, not always the flag
        return error.code() in LEADER_MOVING_CODES or (retriable and error.retriable())

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(moving),
        stop=tenacity.stop_after_delay(settle_s),
        wait=tenacity.wait_fixed(0.2),
        before_sleep=refresh,
        reraise=True,
    )(ask)
