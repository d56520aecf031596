"""A DR drill's traffic (:mod:`mirrorflow.dr.drill`): its own topic (:data:`DRILL_TOPIC`), the
records it writes there (value ``<run>:<seq>``; :class:`DrillProducer` keeps each acknowledged
offset), its own consumer group reading and committing them (:class:`GroupReader`, its offsets
committed, read and, after the drill, its deletion), waiting for the flow to copy them, and the
two traffics: canaries (non-destructive) and continuous writes until the source's broker is
killed (destructive)."""

from __future__ import annotations

import contextlib
import threading
import time

from mirrorflow.dr.drill_request import DrillRequest
from mirrorflow.dr.drill_sandbox import run_sandbox
from mirrorflow.dr.offsets import partition_key
from mirrorflow.dr.steps import Log, Partition, Run
from mirrorflow.dr.steps import iso as _iso
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin, cluster_error

DRILL_TOPIC = "mirrorflow-drill-canary"
DRILL_PARTITIONS = 2


def client_config(config: dict[str, str], **extra: object) -> dict:
    """A client's settings: the cluster's ``config`` with ``extra``."""
    return {**config, **extra}


def ensure_topic(admin: ClusterAdmin) -> bool:
    """Create the drill topic unless it exists; whether this created it."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    if DRILL_TOPIC in admin.metadata().topics:
        return False
    futures = admin.client.create_topics([NewTopic(DRILL_TOPIC, DRILL_PARTITIONS)])
    try:
        futures[DRILL_TOPIC].result(timeout=30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise cluster_error(
                admin, f"creating {DRILL_TOPIC}", exc, "CREATE on the topic"
            ) from None
        return False
    return True


class DrillProducer:
    """Writes drill records (value ``<run>:<seq>``) and keeps each acknowledged offset."""

    def __init__(self, cluster: str, config: dict[str, str], tag: str) -> None:
        self.producer = clients.producer(
            cluster,
            client_config(
                config,
                **{
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "message.timeout.ms": 5000,
                },
            ),
        )
        self.tag = tag
        self.sent = 0
        self.acked: dict[str, list[int]] = {}  # seq -> [partition, offset]
        self.failed = 0
        self.last_ack = 0.0

    def _delivered(self, err, msg) -> None:
        if err is None:
            seq = msg.value().decode().rsplit(":", 1)[1]
            self.acked[seq] = [msg.partition(), msg.offset()]
            self.last_ack = time.time()
        else:
            self.failed += 1

    def produce(self) -> None:
        seq = self.sent
        self.producer.produce(
            DRILL_TOPIC,
            key=str(seq).encode(),
            value=f"{self.tag}:{seq}".encode(),
            partition=seq % DRILL_PARTITIONS,
            on_delivery=self._delivered,
        )
        self.sent += 1
        self.producer.poll(0)

    def flush(self, timeout: float) -> None:
        self.producer.flush(timeout)

    def drop(self, timeout: float) -> None:
        """Wait ``timeout`` for the answers on their way, then drop what is left unanswered:
        its deliveries fail (counted in ``failed``), none is counted as acknowledged."""
        self.producer.flush(timeout)
        self.producer.purge()
        self.producer.flush(0)


def end_offsets(
    cluster: str, config: dict[str, str], topic: str, partitions: int
) -> dict[int, int]:
    """The end offsets of ``topic``'s partitions ``0..partitions-1``: partition -> offset."""
    from confluent_kafka import TopicPartition

    consumer = clients.consumer(
        cluster, client_config(config, **{"group.id": "mirrorflow-drill-probe"})
    )
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


class GroupReader:
    """The drill group reading on one cluster: each record read is committed (synchronously)
    before it counts as read, so what it read is what its group has committed."""

    def __init__(
        self, cluster: str, config: dict[str, str], group: str, tag: str, topic: str
    ) -> None:
        self.consumer = clients.consumer(
            cluster,
            client_config(
                config,
                **{
                    "group.id": group,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed",
                },
            ),
        )
        self.consumer.subscribe([topic])
        self.tag = tag
        self.read: list[str] = []  # seqs, in order read
        self.first_read: float | None = None

    def poll(self, timeout: float = 0.5, most: int = 500) -> int:
        from confluent_kafka import KafkaException

        messages = self.consumer.consume(most, timeout)
        got = [m for m in messages if m.error() is None]
        if not got:
            return 0
        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException:
            return 0  # not committed: not counted as read (it will be read again)
        if self.first_read is None:
            self.first_read = time.time()
        for m in got:
            tag, _, seq = (m.value() or b"").decode().rpartition(":")
            if tag == self.tag:
                self.read.append(seq)
        return len(got)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()


def commit_group(cluster: str, config: dict[str, str], group: str, offsets: dict[int, int]) -> None:
    """Commit ``group``'s offsets on the drill topic: partition -> offset."""
    from confluent_kafka import TopicPartition

    settings = client_config(config, **{"group.id": group, "enable.auto.commit": False})
    consumer = clients.consumer(cluster, settings)
    try:
        consumer.commit(
            offsets=[TopicPartition(DRILL_TOPIC, p, o) for p, o in offsets.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()


def committed_offsets(cluster: str, config: dict[str, str], group: str) -> dict[Partition, int]:
    """``group``'s committed offsets on the drill topic, of the partitions it has one on."""
    from confluent_kafka import TopicPartition

    settings = client_config(config, **{"group.id": group, "enable.auto.commit": False})
    consumer = clients.consumer(cluster, settings)
    try:
        found = consumer.committed(
            [TopicPartition(DRILL_TOPIC, p) for p in range(DRILL_PARTITIONS)], timeout=30
        )
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


def wait_positions(spec: MirrorSpec, wanted: dict[Partition, int], timeout: float) -> float:
    """Wait until the flow's positions reach ``wanted``; when they did (epoch seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            positions = flow_positions(spec)
        except ClusterUnreachable:  # its offsets topic just created, a leader moving
            positions = {}
        if all(positions.get(tp, 0) >= o for tp, o in wanted.items()):
            return time.time()
        if time.monotonic() > deadline:
            behind = {partition_key(tp): o - positions.get(tp, 0) for tp, o in wanted.items()}
            raise MirrorflowError(
                f"{spec.flow} did not copy the drill's records within {timeout:.0f}s "
                f"(behind: {behind})",
                "check that the mirror job runs the flow (mirror DAG, progress.json)",
            )
        time.sleep(0.5)


def wait_copied(spec: MirrorSpec, acked: dict[str, list[int]], timeout: float) -> float | None:
    """Wait until the flow copied every acknowledged record (``acked``: seq -> [partition,
    offset]); when it did (epoch seconds), None when it did not within ``timeout``."""
    wanted: dict[Partition, int] = {}
    for partition, offset in acked.values():
        tp = (DRILL_TOPIC, partition)
        wanted[tp] = max(wanted.get(tp, 0), offset + 1)
    try:
        return wait_positions(spec, wanted, timeout)
    except MirrorflowError:
        return None  # verify counts what is missing


def send_canaries(
    request: DrillRequest,
    spec: MirrorSpec,
    run: Run,
    producer: DrillProducer,
    reader: GroupReader,
    log: Log,
) -> dict:
    """Non-destructive traffic: the request's canaries, the first half of them read and
    committed by the shadow group on the source, then every canary copied by the flow (each
    wait bounded by the request's timeout); the replication latency."""
    for _ in range(request.canaries):
        producer.produce()
    producer.flush(30)
    run.event(f"{len(producer.acked)} canaries acknowledged by {spec.source}")
    half = len(producer.acked) // 2
    deadline = time.monotonic() + request.timeout_s
    while len(reader.read) < half and time.monotonic() < deadline:
        reader.poll(most=half - len(reader.read))  # the first half exactly
    run.event(f"shadow group read {len(reader.read)} canaries on {spec.source}")
    log(f"shadow group {request.group} read and committed {len(reader.read)} on {spec.source}")
    copied_at = wait_copied(spec, producer.acked, request.timeout_s)
    if copied_at is not None:
        run.event(f"the flow copied every canary to {spec.target}", copied_at)
    return {
        "replication_latency_s": None
        if copied_at is None
        else round(max(0.0, copied_at - producer.last_ack), 3)
    }


def continuous_then_kill(
    request: DrillRequest,
    spec: MirrorSpec,
    run: Run,
    producer: DrillProducer,
    reader: GroupReader,
    log: Log,
) -> dict:
    """Destructive traffic: the request's rate for its traffic seconds, the drill group
    reading on the source during the first half, its commit checkpointed once the flow copied
    it, then the source's sandbox broker killed (the cut); what was not acknowledged by then
    dropped. The cut (epoch seconds) and the producer's error, if any."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            interval = 1.0 / request.rate
            following = time.monotonic()
            while not stop.is_set():
                producer.produce()
                following += interval
                time.sleep(max(0.0, following - time.monotonic()))
        except BaseException as exc:  # BufferError once the broker is gone a while
            errors.append(exc)

    writer = threading.Thread(target=write, name="drill-producer", daemon=True)
    writer.start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < request.traffic_seconds / 2:
            reader.poll(0.2)
        reader.close()
        run.event(f"group {request.group} stopped reading on {spec.source} ({len(reader.read)})")
        # Its commit checkpointed as the job does every emit.checkpoints.interval.seconds,
        # once the flow has copied what it read (exact translation needs the copies).
        committed = committed_offsets(spec.source, spec.source_admin, request.group)
        wait_positions(spec, committed, request.timeout_s)
        from mirrorflow.replication.group_offset_sync import run_group_sync

        run_group_sync(spec, {request.group}, sync_offsets=False)
        run.event(f"group {request.group}'s commit checkpointed on {spec.target}")
        log(f"group {request.group} read {len(reader.read)} on {spec.source}; checkpointed")
        while time.monotonic() - started < request.traffic_seconds:
            time.sleep(0.1)
        sandbox = run.details("preflight")["sandbox"]
        cut = run_sandbox("kill", sandbox)
        run.event(f"{spec.source} broker killed (SIGKILL): the cut", cut)
        run.change(
            "broker-killed",
            f"killed {spec.source}'s broker (sandbox cluster {sandbox['cluster']}, SIGKILL)",
            undo={"sandbox": sandbox},
        )
        log(f"{spec.source}'s broker ({sandbox['cluster']}) killed mid-traffic at {_iso(cut)}")
    finally:
        stop.set()
        writer.join(10)
    # The failover starts now, as an emergency's does at the kill: the source acknowledged
    # what it will ever acknowledge before its SIGKILL (on loopback those answers are in at
    # once), so what is still in flight is dropped, not waited for (message.timeout.ms).
    producer.drop(0.5)
    return {"cut": cut, "producer_error": str(errors[0]) if errors else None}


def delete_group(spec: MirrorSpec, group: str) -> list[str]:
    """Delete the drill group on the source, then on the target (the clusters it was deleted
    on). The source goes first: a running mirror job's group offset sync creates a group
    absent from the target as long as the source still has its offsets."""
    deleted = []
    for alias, config in ((spec.source, spec.source_admin), (spec.target, spec.target_admin)):
        admin = ClusterAdmin(alias, config)
        try:
            admin.client.delete_consumer_groups([group], request_timeout=30)[group].result(30)
            deleted.append(alias)
        except Exception:  # no such group there: nothing to delete
            continue
    return deleted
