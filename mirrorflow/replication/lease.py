"""A flow's lease on its target cluster: at most one job copies a flow, wherever it is started.

The file lease (:func:`mirrorflow.runtime.jobs.hold_leases`) fences jobs that share a state
directory on one machine; two Airflow workers, or two state directories, do not. This lease
lives where every job of the flow must write anyway, the target cluster, and uses Kafka's own
fencing, as MirrorMaker 2's exactly-once workers fence zombie tasks:

* the flow's record in the compacted topic ``mirrorflow-leases.internal`` (one partition, the
  broker's ``LogAppendTime``) says who holds it: host, pid, state directory, since when;
* it is written only in transactions of the producer whose ``transactional.id`` is
  ``mirrorflow-lease.<S>-><T>``. Taking the lease starts that producer, and Kafka then fences
  every earlier producer of the id (its epoch is bumped: its open transaction is aborted and it
  can commit none). So a holder that froze and woke up after another job took over cannot
  renew, nor commit anything it writes through the lease's producer (the flow's positions);
* the holder renews the record every :data:`RENEW_S` seconds. A start finds the lease **free**
  when the flow has no record, its holder released it (a clean stop), its holder is a process of
  this host that is gone, or it was last renewed more than :data:`EXPIRY_S` seconds ago (by the
  broker's clock, read with this host's: hosts' clocks must agree within a few seconds, as NTP
  keeps them). Otherwise the flow is **busy**: the start waits up to its ``wait_s``, then fails
  in one line naming the holder.

The bound: a holder that stops renewing (frozen, partitioned from the target, killed on another
host) loses the lease :data:`EXPIRY_S` seconds after its last renewal, when another start takes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from confluent_kafka import KafkaError, KafkaException, Producer

from mirrorflow.errors import MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.topic_reader import TopicReader
from mirrorflow.replication.topics import (
    client_principal,
    did_not_answer,
    ensure_internal_topic,
    refusal,
    unauthorized,
)

log = logging.getLogger("mirrorflow.mirror")

LEASES_TOPIC = "mirrorflow-leases.internal"
RENEW_S = 2.0
# A renewal is due this much before RENEW_S has passed, so that the renewal task, on its RENEW_S
# beat, and a stream's commits, on theirs, do not both find it not quite due.
RENEW_EARLY_S = 0.5
EXPIRY_S = 10.0
TIMEOUT_S = 30.0  # taking the lease (fencing earlier holders), reading the leases topic
# A transaction (a renewal, positions) gives up after this long: by then the lease is as good
# as lost anyway (EXPIRY_S), and the flow retries.
COMMIT_TIMEOUT_S = EXPIRY_S
RELEASE_TIMEOUT_S = 3.0  # a stop waits at most this long (twice) to give the lease up


class FlowBusy(MirrorflowError):
    """Another job holds the flow's lease."""


class LeaseLost(MirrorflowError):
    """Another job took the flow's lease: this one must stop writing at once."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease."""

    host: str
    pid: int
    started: float  # the process's start time: with the pid, its identity
    state_dir: str
    since: str

    @classmethod
    def this_process(cls, state_dir: str) -> Holder:
        import psutil

        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            started=psutil.Process().create_time(),
            state_dir=state_dir,
            since=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, since {self.since}, state {self.state_dir}"

    def gone(self) -> bool:
        """Whether this holder is a process of this host that no longer runs."""
        if self.host != socket.gethostname():
            return False
        import psutil

        try:
            process = psutil.Process(self.pid)
            return (
                abs(process.create_time() - self.started) > 0.01
                or process.status() == psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return True


@dataclass(frozen=True)
class Record:
    """The flow's last lease record: its holder (None: released) and when the broker wrote it."""

    holder: Holder | None
    written_ms: int


def _encode(holder: Holder | None) -> bytes:
    return json.dumps({"released": True} if holder is None else asdict(holder)).encode()


def _decode(value: bytes | None, written_ms: int) -> Record:
    data = json.loads(value or b'{"released": true}')
    holder = None if data.get("released") else Holder(**data)
    return Record(holder, written_ms)


class _LeaseReader(TopicReader):
    """The leases topic read to its end, keeping the flow's last record."""

    def __init__(self, lease: FlowLease) -> None:
        super().__init__(
            lease._consumer_config,
            lease._admin_config,
            LEASES_TOPIC,
            f"mirrorflow-lease-reader.{lease.flow}",  # never joins nor commits
            missing_ok=True,
            cluster=lease.target,
        )
        self.key = lease.flow.encode()
        self.found: Record | None = None

    def apply_message(self, msg) -> None:
        if msg.key() == self.key:
            self.found = _decode(msg.value(), msg.timestamp()[1])


class FlowLease:
    """The lease of ``flow`` on its target cluster ``target``, for this process."""

    def __init__(
        self,
        flow: str,
        target: str,
        producer_config: dict[str, str],
        consumer_config: dict[str, str],
        admin_config: dict[str, str],
        holder: Holder,
    ) -> None:
        """The ``*_config``: librdkafka settings of the flow's target clients."""
        self.flow, self.target, self.holder = flow, target, holder
        self.transactional_id = f"mirrorflow-lease.{flow}"
        self._producer_config, self._consumer_config = producer_config, consumer_config
        self._admin_config = admin_config
        self.principal = client_principal(producer_config)
        self._producer: Producer | None = None
        self._lock = threading.Lock()  # one transaction at a time: renewals and positions
        self._commit_pending = False  # a commit timed out: finished before the next transaction
        self._abort_pending = False  # an abort timed out: finished before the next transaction
        # Its producer failed for good, though not fenced by another holder: the next
        # transaction takes the lease again (a new producer) if no other job holds it.
        self._broken: str | None = None
        self.renewed = 0.0  # monotonic time of the last renewal that committed

    @property
    def held(self) -> bool:
        """Whether this process holds the lease (as far as it knows: see :meth:`fresh`)."""
        return self._producer is not None

    def fresh(self) -> bool:
        """Whether the last renewal is recent enough that no other job can have taken the lease
        since (a process that was frozen finds it is not, and renews before it writes more)."""
        return self.held and time.monotonic() - self.renewed < EXPIRY_S - 2 * RENEW_S

    def renewal_due(self) -> bool:
        """Whether the lease should be renewed now: its last renewal, a renewal or a commit of
        positions (which renews it), is about :data:`RENEW_S` old. A flow writing its positions
        on that beat renews its lease with them, in one transaction."""
        return time.monotonic() - self.renewed >= RENEW_S - RENEW_EARLY_S

    def fresh_until(self) -> float:
        """Until when (Unix time) :meth:`fresh` holds without another renewal: what this job
        may still write or copy before it must renew (a continuous copy is allowed that long)."""
        return time.time() + EXPIRY_S - 2 * RENEW_S - (time.monotonic() - self.renewed)

    @staticmethod
    def ensure_topic(admin, replication_factor: int) -> None:
        """Create the leases topic on the target (a :class:`ClusterAdmin` of it) if missing."""
        ensure_internal_topic(
            admin,
            LEASES_TOPIC,
            replication_factor,
            "offset.storage.replication.factor",
            # The broker's clock dates renewals; small segments keep the compacted topic short.
            config={
                "message.timestamp.type": "LogAppendTime",
                "segment.ms": "600000",
                "min.cleanable.dirty.ratio": "0.1",
            },
        )

    # -- reading ---------------------------------------------------------------------------
    def current(self) -> Record | None:
        """The flow's last record (read_committed: a fenced holder's writes never count)."""
        reader = _LeaseReader(self)
        try:
            reader.read_to_end(TIMEOUT_S)
        finally:
            reader.close()
        return reader.found

    def free(self, record: Record | None) -> bool:
        """Whether a start may take the lease whose last record is ``record``."""
        if record is None or record.holder is None or record.holder == self.holder:
            return True
        if record.holder.gone():
            return True
        return time.time() * 1000 - record.written_ms > EXPIRY_S * 1000

    # -- holding ---------------------------------------------------------------------------
    def take(self, wait_s: float = 0.0) -> None:
        """Take the lease, fencing every earlier holder; :class:`FlowBusy` if another job holds
        it still after ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        while True:
            record = self.current()
            if self.free(record):
                break
            if time.monotonic() >= deadline:
                assert record is not None and record.holder is not None
                age = max(0.0, time.time() - record.written_ms / 1000)
                raise FlowBusy(
                    f"flow {self.flow} is already running in another mirror job "
                    f"({record.holder.describe()}; its lease on {self.target} was renewed "
                    f"{age:.0f}s ago)",
                    f"stop that job (`kill {record.holder.pid}` on {record.holder.host} stops "
                    f"it after its batch), or wait: a job that stops renewing loses the lease "
                    f"{EXPIRY_S:.0f}s after its last renewal",
                )
            time.sleep(RENEW_S)
        self._start_producer()
        self.renew()

    def _start_producer(self) -> None:
        """A new transactional producer of the lease, initialised: it fences every earlier
        producer of the flow's transactional id (an earlier holder's, or this job's own)."""
        self._commit_pending = self._abort_pending = False
        self._producer = clients.producer(
            self.target,
            {
                **self._producer_config,
                "transactional.id": self.transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",  # positions, partitioned as Connect does
            },
        )
        try:
            # fences every earlier holder
            clients.init_transactions(self._producer, LEASES_TOPIC, TIMEOUT_S)
        except KafkaException as exc:
            self._producer = None
            raise self._failure(exc.args[0], "taking") from None
        self._broken = None

    def renew(self) -> None:
        """Write the holder's record again, in a transaction; :class:`LeaseLost` if another
        job has taken the lease since (this producer is fenced)."""
        self.commit([])

    def commit(self, records: list[tuple[str, bytes, bytes]]) -> None:
        """Write ``records`` (topic, value, key) on the target, with the holder's record, in one
        transaction: they land only while this job holds the lease (the flow's positions are
        written so). :class:`LeaseLost` if another job has taken it."""
        self._transaction(self.holder, records)
        self.renewed = time.monotonic()

    def release(self) -> None:
        """Give the lease up at a stop: the next start takes it at once. Bounded (the target
        away, or a renewal waiting for it): the lease then expires, or is free at once to a
        start on this host once this process is gone."""
        if self._producer is None:
            return
        with contextlib.suppress(MirrorflowError):  # taken, or the target is away: it expires
            self._transaction(None, [], RELEASE_TIMEOUT_S)
        self._producer = None

    def _transaction(
        self,
        holder: Holder | None,
        records: list[tuple[str, bytes, bytes]],
        timeout_s: float | None = None,
    ) -> None:
        timeout = COMMIT_TIMEOUT_S if timeout_s is None else timeout_s
        if not self._lock.acquire(timeout=timeout):
            raise did_not_answer(
                self.target,
                f"writing the lease of flow {self.flow}",
                f"its previous transaction still waits for the target after {timeout:.0f}s",
            )
        try:
            if self._producer is None and self._broken is not None:
                self._take_again()
            self._locked_transaction(holder, records, timeout)
        finally:
            self._lock.release()

    def _take_again(self) -> None:
        """After its producer failed for good (:attr:`_broken`), take the lease again with a new
        one, unless another job holds it now (:class:`LeaseLost`); a target that does not
        answer leaves it to the next transaction."""
        record = self.current()
        if not self.free(record):
            assert record is not None and record.holder is not None
            broken, self._broken = self._broken, None
            raise LeaseLost(
                f"flow {self.flow} lost its lease on {self.target} to another job "
                f"({record.holder.describe()}) while this one's producer failed ({broken})",
                "nothing more of this job lands; the other job copies the flow",
            )
        log.info(
            "flow %s: taking its lease again (its producer failed: %s)", self.flow, self._broken
        )
        self._start_producer()

    def _locked_transaction(
        self, holder: Holder | None, records: list[tuple[str, bytes, bytes]], timeout: float
    ) -> None:
        producer = self._producer
        if producer is None:
            raise LeaseLost(
                f"flow {self.flow} does not hold its lease on {self.target}",
                "start the flow again: it takes the lease if no other job holds it",
            )
        try:
            if self._abort_pending:  # an earlier abort timed out: librdkafka takes no other
                producer.abort_transaction(timeout)  # call until it is finished
                self._abort_pending = False
            if self._commit_pending:  # an earlier commit timed out: likewise
                self._commit(producer, timeout)
            producer.begin_transaction()
            for topic, value, key in records:
                producer.produce(topic, value, key)
            producer.produce(LEASES_TOPIC, _encode(holder), self.flow.encode(), partition=0)
            self._commit(producer, timeout)
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort() or _fenced(error):
                self._commit_pending = False
            if error.fatal() and not _fenced(error) and not unauthorized(error):
                # broken, not taken by another job: taken again at the next transaction
                self._producer, self._broken = None, error.str()
                raise self._failure(error, "renewing") from None
            if _fenced(error):
                self._producer = None
                raise LeaseLost(
                    f"flow {self.flow} lost its lease on {self.target} to another job (this "
                    f"one had not renewed it for over {EXPIRY_S:.0f}s: frozen, or cut off "
                    "from the target)",
                    "nothing more of this job lands; the other job copies the flow",
                ) from None
            if error.txn_requires_abort():
                self._abort_pending = True  # until an abort has finished (this one, or later)
                with contextlib.suppress(KafkaException):
                    producer.abort_transaction(timeout)
                    self._abort_pending = False
            raise self._failure(error, "renewing") from None

    def _commit(self, producer: Producer, timeout: float) -> None:
        """Commit the open transaction. One that times out (the target away) stays pending,
        and the next transaction finishes it first: what it holds was written in order (a
        renewal, positions of copies already acknowledged), so it may land late."""
        self._commit_pending = True
        producer.commit_transaction(timeout)
        self._commit_pending = False

    def _failure(self, error: KafkaError, doing: str) -> MirrorflowError:
        if unauthorized(error):
            return refusal(
                self.target,
                self.principal,
                f"{doing} the lease of flow {self.flow}",
                error.str(),
                f"WRITE on TransactionalId {self.transactional_id} and on topic {LEASES_TOPIC}",
            )
        return did_not_answer(self.target, f"{doing} the lease of flow {self.flow}", error.str())


def _fenced(error: KafkaError) -> bool:
    """Whether another producer of the flow's transactional id (another job's) fenced this one."""
    return error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )


def confirm(
    flow: str,
    target: str,
    consumer_config: dict[str, str],
    admin_config: dict[str, str],
    holder: Holder,
) -> None:
    """Check that ``holder`` still holds ``flow``'s lease (:class:`LeaseLost` if not). An
    exactly-once copy task calls it after initialising its transactional producers, before
    it commits: a task of a job that lost the lease while frozen, started after it woke, would
    otherwise fence the new holder's producers of its partitions and commit a batch the new
    holder copies too."""
    lease = FlowLease(flow, target, {}, consumer_config, admin_config, holder)
    record = lease.current()
    if record is None or record.holder != holder:
        taker = record.holder.describe() if record and record.holder else "nobody"
        raise LeaseLost(
            f"flow {flow} lost its lease on {target} to another job ({taker})",
            "nothing more of this job lands; the other job copies the flow",
        )
