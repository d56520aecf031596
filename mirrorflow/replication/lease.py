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
import os
import socket
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from mirrorflow.errors import MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.topics import ensure_internal_topic

LEASES_TOPIC = "mirrorflow-leases.internal"
RENEW_S = 2.0
EXPIRY_S = 10.0
TIMEOUT_S = 30.0


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


class FlowLease:
    """The lease of ``flow`` on its target cluster ``target``, for this process."""

    def __init__(
        self,
        flow: str,
        target: str,
        producer_config: dict[str, str],
        consumer_config: dict[str, str],
        holder: Holder,
    ) -> None:
        self.flow, self.target, self.holder = flow, target, holder
        self.transactional_id = f"mirrorflow-lease.{flow}"
        self._producer_config, self._consumer_config = producer_config, consumer_config
        self._producer = None
        self.renewed = 0.0

    @staticmethod
    def ensure_topic(admin, replication_factor: int) -> None:
        """Create the leases topic on the target (a :class:`ClusterAdmin` of it) if missing."""
        ensure_internal_topic(
            admin,
            LEASES_TOPIC,
            replication_factor,
            "offset.storage.replication.factor",
            config={"message.timestamp.type": "LogAppendTime"},
        )

    # -- reading ---------------------------------------------------------------------------
    def current(self) -> Record | None:
        """The flow's last record (read_committed: a fenced holder's writes never count)."""
        consumer = clients.consumer(
            self.target,
            {
                **self._consumer_config,
                "group.id": f"mirrorflow-lease-reader.{self.flow}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            },
        )
        try:
            tp = TopicPartition(LEASES_TOPIC, 0, 0)
            consumer.assign([tp])
            found: Record | None = None
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return found
                    if msg.error().code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        return None
                    raise MirrorflowError(f"reading {LEASES_TOPIC}: {msg.error().str()}")
                if msg.key() == self.flow.encode():
                    found = _decode(msg.value(), msg.timestamp()[1])
            raise MirrorflowError(
                f"reading {LEASES_TOPIC} on {self.target} did not end within {TIMEOUT_S:.0f}s"
            )
        finally:
            consumer.close()

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
        self._producer = clients.producer(
            self.target,
            {
                **self._producer_config,
                "transactional.id": self.transactional_id,
                "enable.idempotence": True,
                "acks": "all",
            },
        )
        self._producer.init_transactions(TIMEOUT_S)  # fences every earlier holder
        self.renew()

    def renew(self) -> None:
        """Write the holder's record again, in a transaction; :class:`LeaseLost` if another
        job has taken the lease since (this producer is fenced)."""
        self._write(self.holder)
        self.renewed = time.monotonic()

    def release(self) -> None:
        """Give the lease up at a clean stop: the next start takes it at once."""
        if self._producer is None:
            return
        with contextlib.suppress(MirrorflowError):  # taken, or the target is away: it expires
            self._write(None)
        self._producer = None

    def _write(self, holder: Holder | None) -> None:
        producer = self._producer
        if producer is None:
            raise LeaseLost(f"flow {self.flow} does not hold its lease")
        try:
            producer.begin_transaction()
            producer.produce(LEASES_TOPIC, _encode(holder), self.flow.encode(), partition=0)
            producer.commit_transaction(TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal() or error.code() in (
                KafkaError._FENCED,
                KafkaError.PRODUCER_FENCED,
                KafkaError.INVALID_PRODUCER_EPOCH,
            ):
                self._producer = None
                raise LeaseLost(
                    f"flow {self.flow} lost its lease on {self.target}: another job took it "
                    "over (this one stopped renewing it for longer than "
                    f"{EXPIRY_S:.0f}s)",
                    "nothing more of this job lands; the other job copies the flow",
                ) from None
            if error.txn_requires_abort():
                producer.abort_transaction(TIMEOUT_S)
            raise MirrorflowError(
                f"renewing the lease of flow {self.flow} on {self.target}: {error.str()}"
            ) from None
