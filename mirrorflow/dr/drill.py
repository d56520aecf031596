"""DR drills of one flow ``S->T``: fail a consumer group over to the DR cluster on purpose,
verify end-to-end message flow there, and measure RPO and RTO, so the runbook is known to work
before it is needed (seed 003). The drill DAG's tasks run :data:`STEPS` in order, sharing a run
record on disk, as the failover's do.

Both modes write only to the drill's own topic, :data:`DRILL_TOPIC` (``mirrorflow-drill-canary``
on the source; the flow's ``topics`` must replicate it, else the drill refuses in one line), and
use only their own consumer group (the *group prefix* and the run id, e.g.
``mirrorflow-drill-manual__2026-…``; the flow's ``groups`` must checkpoint it). No user topic is
written and no real group is moved.

``non-destructive`` (any cluster, production included)
    ``traffic``: N canary records on the source; the drill's *shadow group* reads and commits
    the first half there. The flow copies them (the drill waits, bounded). ``failover``: the
    shadow group checkpointed now (exact translation) and its offsets committed on the target,
    as a planned failover does for real groups, and nothing else. ``verify``: the shadow group
    reads on the target (the remote topic under the flow's policy) from where it was committed:
    it must read the other half, each canary once; every canary must be on the target once.
    The real groups' committed offsets on the target are compared before and after.
``destructive`` (sandbox clusters only)
    ``traffic``: a producer writes continuously (idempotent, ``acks=all``; it knows each record's
    acknowledged offset); the drill group reads and commits on the source during the first half,
    its commit is checkpointed once the flow copied it, then, mid-traffic, the source broker is
    killed (SIGKILL, ``mirrorflow sandbox kill``): the cut. ``failover``: the runbook, the
    failover workflow's own steps in emergency mode (:func:`mirrorflow.dr.failover.run_all`:
    preflight, stop-mirror (the flow held, its running job waited for), final-sync (the last
    checkpoints committed on the target), report), their timings kept for the report.
    ``verify``: the group reads on the target until it has everything the flow copied.
    ``restore``: the broker restarted (``mirrorflow sandbox up``), what that failover holds
    released from its ledger (the flow resumes; the drill waits for it to copy the rest,
    bounded), its RPO measured on the source.

    Destructive drills run only when the flow's source is a **mirrorflow sandbox cluster**: its
    bootstrap servers are a loopback port of a cluster recorded in the sandbox directory
    (``$MIRRORFLOW_SANDBOX``, else ``$MIRRORFLOW_STATE/sandbox``). There is no override: the
    sandbox is the only cluster mirrorflow knows how to crash and restart.

Measured per run (``verify``):

* **RPO**: records acknowledged by the source and not on the target at the cut (the producer's
  acknowledged offsets at or after the flow's positions then). Non-destructive, the cut is the
  shadow group's failover, after the flow copied the canaries (or timed out waiting).
* **RTO**: from the trigger (destructive: the source broker's kill; non-destructive: the start
  of the failover step) to the first record the failed-over group reads on the target.
* Per group: **lost** (records acknowledged before the cut, copied by the flow, after the
  group's committed position on the source, that the group did not read on the target) and
  **repeated** (records it read on both clusters, or twice on the target).

``report``: Markdown and HTML from ``templates/drill_report.{md,html}.j2`` and JSON in
``$MIRRORFLOW_STATE/reports/drill/<run id>/`` (mode 0600), with the timeline, the ledger and
what the drill could not rehearse (:data:`NOT_REHEARSED`). ``restore`` and
``report`` run however the steps before ended; ``restore`` also deletes the drill group on both
clusters. A dry run checks that the drill can run (``preflight``) and changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mirrorflow import paths
from mirrorflow.dr import failover, steps
from mirrorflow.dr.clusters import reachable, replicated_partitions
from mirrorflow.dr.offsets import key_partition, partition_key
from mirrorflow.dr.records import positions_at_cut
from mirrorflow.dr.steps import Log, Partition, StepRecord, StepSkipped, safe_run_id
from mirrorflow.dr.steps import iso as _iso
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication import clients
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin, cluster_error
from mirrorflow.runtime import jobs

DRILL_TOPIC = "mirrorflow-drill-canary"
DRILL_PARTITIONS = 2
MODES = ("non-destructive", "destructive")
STEPS = ("preflight", "traffic", "failover", "verify", "restore", "report")


@dataclass(frozen=True)
class DrillRequest(steps.DRRequest):
    """What a drill run was asked to do (a DAG run's Params)."""

    mode: str = "non-destructive"
    canaries: int = 100  # non-destructive: canary records
    group_prefix: str = "mirrorflow-drill-"
    dry_run: bool = False
    traffic_seconds: float = 12.0  # destructive: how long the producer writes before the cut
    rate: int = 200  # destructive: records per second
    timeout_s: float = 120.0  # each wait (the flow copying, the group reading)
    sandbox_dir: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise MirrorflowError(
                f"drill mode {self.mode!r} is not one of {', '.join(MODES)}",
                "choose non-destructive (canaries, a shadow group) or destructive (sandbox)",
            )
        if not re.fullmatch(r"[A-Za-z0-9._\-]{1,100}", self.group_prefix):
            raise MirrorflowError(
                f"drill group prefix {self.group_prefix!r} is not a group name prefix",
                "use letters, digits, '.', '_' and '-' (e.g. mirrorflow-drill-)",
            )
        for name, value, low in (
            ("canary count", self.canaries, 2),
            ("traffic seconds", self.traffic_seconds, 2),
            ("rate", self.rate, 1),
        ):
            if value < low:
                raise MirrorflowError(f"drill {name} {value} is below {low}")

    PARAMS = {
        "mode": ("mode", str, "non-destructive"),
        "canaries": ("canaries", int, 100),
        "group_prefix": ("group_prefix", str, "mirrorflow-drill-"),
        "dry_run": ("dry_run", bool, False),
        "traffic_seconds": ("traffic_seconds", float, 12),
        "rate": ("rate", int, 200),
    }

    @property
    def group(self) -> str:
        """The drill's own consumer group (its shadow group, non-destructive)."""
        return self.group_prefix + safe_run_id(self.run_id)

    def record(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "canaries": self.canaries,
            "group": self.group,
            "dry_run": self.dry_run,
            "traffic_seconds": self.traffic_seconds,
            "rate": self.rate,
        }

    def failover_request(self) -> failover.FailoverRequest:
        """The emergency failover of the drill group (destructive), recorded under
        ``reports/failover/drill__<run id>/``: the failover's own steps with its own defaults
        (its stop timeout included), as ``mirrorflow failover --mode emergency`` runs them."""
        return failover.FailoverRequest(
            flow=self.flow,
            flow_files=self.flow_files,
            run_id="drill__" + safe_run_id(self.run_id),
            mode="emergency",
            group_pattern=re.escape(self.group),
            state_dir=self.state_dir,
        )


def reports_dir() -> Path:
    """Where drill runs keep their record and report: ``$MIRRORFLOW_STATE/reports/drill``."""
    return steps.reports_dir("drill")


def sandbox_dir(request: DrillRequest) -> Path:
    """The sandbox directory a destructive drill looks its source cluster up in."""
    if request.sandbox_dir:
        return Path(request.sandbox_dir)
    if os.environ.get("MIRRORFLOW_SANDBOX"):
        return Path(os.environ["MIRRORFLOW_SANDBOX"])
    return paths.state_dir() / "sandbox"


PORTS_PER_SANDBOX_CLUSTER = 10  # as mirrorflow.devtools.sandbox lays out its listeners


def sandbox_cluster(bootstrap_servers: str, directory: Path) -> str | None:
    """The name of the sandbox cluster (recorded in ``directory/clusters.json``) that
    ``bootstrap_servers`` point at, None when they are not all loopback ports of one."""
    try:
        clusters = json.loads((directory / "clusters.json").read_text())["clusters"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    found = set()
    for server in filter(None, (s.strip() for s in bootstrap_servers.split(","))):
        address = urlsplit("//" + server.split("://")[-1])
        if address.hostname not in ("127.0.0.1", "localhost", "::1") or address.port is None:
            return None
        names = [
            name
            for name, c in clusters.items()
            if int(c["broker_port"]) <= address.port < int(c["broker_port"]) + 10
        ]
        if len(names) != 1:
            return None
        found.add(names[0])
    return found.pop() if len(found) == 1 else None


class DrillRun(steps.Run):
    """A drill run's record, ``run.json`` in its report directory (as a failover's), with the
    run's timeline (:meth:`~mirrorflow.dr.steps.Run.event`)."""

    KIND = "drill"
    request: DrillRequest  # a drill's own (Run holds any workflow's request)

    def new_record(self) -> dict:
        return {**super().new_record(), "timeline": []}

    def report_context(self) -> dict:
        return report_context(self)

    def report_lines(self, context: dict) -> list[str]:
        figures = context["figures"]
        if not figures:
            return []
        return [
            f"drill figures: RPO {figures['rpo_records']} record(s), RTO "
            f"{figures['rto_s']}s, per group "
            + ", ".join(
                f"{g}: {r['lost']} lost, {r['repeated']} repeated"
                for g, r in figures["groups"].items()
            )
        ]


WORKFLOW = steps.Workflow(DrillRun, DrillRequest, STEPS, always=("restore", "report"))


def _client(config: dict[str, str], **extra: object) -> dict:
    return {**config, **extra}


def _skip_when_dry(request: DrillRequest) -> None:
    if request.dry_run:
        raise StepSkipped("dry run: preflight checked the drill; nothing is written or moved")


# -- preflight -----------------------------------------------------------------------------


@WORKFLOW.step("preflight")
def preflight(request: DrillRequest, run: DrillRun, record: StepRecord, log: Log) -> None:
    """Both clusters answer; the flow replicates the drill topic and checkpoints the drill
    group; destructive: the source is a sandbox cluster. Creates the drill topic (not in a dry
    run) and notes where the target's copy ends and the real groups' offsets there."""
    spec = request.spec()
    for alias, config in ((spec.target, spec.target_admin), (spec.source, spec.source_admin)):
        down = reachable(alias, config, 15.0)
        if down:
            raise ClusterUnreachable(
                f"a drill needs both clusters; {alias} is unreachable: {down}",
                f"check {alias}.bootstrap.servers, or run the failover DAG if it is down",
            )
    if not spec.should_replicate(DRILL_TOPIC):
        raise MirrorflowError(
            f"flow {request.flow} does not replicate the drill topic {DRILL_TOPIC}",
            f"add {DRILL_TOPIC} to {request.flow}.topics and render again",
        )
    if not spec.should_replicate_group(request.group):
        raise MirrorflowError(
            f"flow {request.flow} does not checkpoint the drill group {request.group}",
            f"add {request.group_prefix}.* to {request.flow}.groups and render again",
        )
    if request.mode == "destructive" and spec.emit_checkpoints_enabled is False:
        raise MirrorflowError(
            f"flow {request.flow} emits no checkpoints: nothing to fail a group over with",
            f"set {request.flow}.emit.checkpoints.enabled = true",
        )
    details: dict = {
        "source": spec.source,
        "target": spec.target,
        "topic": DRILL_TOPIC,
        "remote_topic": spec.remote_topic(DRILL_TOPIC),
        "group": request.group,
        "exactly_once": spec.exactly_once,
    }
    if request.mode == "destructive":
        directory = sandbox_dir(request)
        name = sandbox_cluster(spec.source_admin.get("bootstrap.servers", ""), directory)
        if name is None:
            raise MirrorflowError(
                f"a destructive drill kills {spec.source}'s broker, and {spec.source} is not "
                f"a mirrorflow sandbox cluster (none in {directory} listens at its "
                "bootstrap servers)",
                "run the non-destructive drill on this flow, or point MIRRORFLOW_SANDBOX "
                "at the sandbox that runs it",
            )
        details["sandbox"] = {"directory": str(directory), "cluster": name}
    source = ClusterAdmin(spec.source, spec.source_admin)
    target = ClusterAdmin(spec.target, spec.target_admin)
    details["real_groups_before"] = _real_group_offsets(spec, target, spec.target_admin, request)
    details["real_source_groups_before"] = _real_group_offsets(
        spec, source, spec.source_admin, request
    )
    if not request.dry_run and _ensure_topic(source):
        run.change(
            "topic-created",
            f"created topic {DRILL_TOPIC} on {spec.source} ({DRILL_PARTITIONS} partitions)",
            undo={"cluster": spec.source, "topic": DRILL_TOPIC},
        )
    record.details = details
    record.summary = (
        f"{request.mode} drill of {request.flow}: both clusters answer; topic {DRILL_TOPIC} "
        f"(on {spec.target}: {details['remote_topic']}), group {request.group}"
        + (f", sandbox cluster {details['sandbox']['cluster']}" if "sandbox" in details else "")
        + (" (dry run: nothing will be written or moved)" if request.dry_run else "")
    )
    log(record.summary)


def _ensure_topic(admin: ClusterAdmin) -> bool:
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


def _real_group_offsets(
    spec: MirrorSpec, admin: ClusterAdmin, config: dict[str, str], request: DrillRequest
) -> dict[str, dict[str, int]]:
    """The committed offsets of the groups the flow checkpoints (not the drill's) on one of its
    clusters, on the replicated topics (the source's names, or their copies' on the target):
    group -> ``topic-partition`` -> offset. Read by consumers of the groups (the admin API's
    offset listing can crash the process: see GroupOffsetsClient)."""
    from mirrorflow.replication.group_offsets_client import GroupOffsetsClient

    source = ClusterAdmin(spec.source, spec.source_admin)
    partitions = list(replicated_partitions(spec, source))
    if admin.alias == spec.target:
        partitions = [(spec.remote_topic(t), p) for t, p in partitions]
    try:
        listed = admin.client.list_consumer_groups(request_timeout=30).result()
    except Exception as exc:
        raise cluster_error(
            admin, "listing consumer groups", exc, "DESCRIBE on the groups"
        ) from None
    client = GroupOffsetsClient(admin, config)
    offsets: dict[str, dict[str, int]] = {}
    for group in sorted(g.group_id for g in listed.valid):
        if spec.should_replicate_group(group) and not group.startswith(request.group_prefix):
            found = client.committed(group, partitions)
            offsets[group] = {partition_key(tp): o for tp, (o, _m) in sorted(found.items())}
    return offsets


# -- traffic -------------------------------------------------------------------------------


class _Producer:
    """Writes drill records (value ``<run>:<seq>``) and keeps each acknowledged offset."""

    def __init__(self, cluster: str, config: dict[str, str], tag: str) -> None:
        self.producer = clients.producer(
            cluster,
            _client(
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


def _end_offsets(
    cluster: str, config: dict[str, str], topic: str, partitions: int
) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    consumer = clients.consumer(cluster, _client(config, **{"group.id": "mirrorflow-drill-probe"}))
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


class _GroupReader:
    """The drill group reading on one cluster: each record read is committed (synchronously)
    before it counts as read, so what it read is what its group has committed."""

    def __init__(
        self, cluster: str, config: dict[str, str], group: str, tag: str, topic: str
    ) -> None:
        self.consumer = clients.consumer(
            cluster,
            _client(
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


@WORKFLOW.step("traffic", xcom_details=False)
def traffic(request: DrillRequest, run: DrillRun, record: StepRecord, log: Log) -> None:
    """Non-destructive: canaries, half of them read by the shadow group on the source.
    Destructive: continuous writes, the drill group reading the first half, then the kill."""
    _skip_when_dry(request)
    spec = request.spec()
    tag = safe_run_id(request.run_id)
    # The drill group starts at the topic's end: earlier runs' records are not its own.
    source = spec.source, spec.source_admin
    start = _end_offsets(*source, DRILL_TOPIC, DRILL_PARTITIONS)
    _commit(*source, request.group, start)
    run.change(
        "group-offsets",
        f"committed group {request.group} on {spec.source} at {DRILL_TOPIC}'s end: "
        + ", ".join(f"{DRILL_TOPIC}-{p}@{o}" for p, o in sorted(start.items())),
        undo={"cluster": spec.source, "group": request.group},
    )
    producer = _Producer(*source, tag)
    reader = _GroupReader(*source, request.group, tag, DRILL_TOPIC)
    run.event("traffic started")
    try:
        if request.mode == "non-destructive":
            details = _canaries(request, spec, run, producer, reader, log)
        else:
            details = _continuous_then_kill(request, spec, run, producer, reader, log)
    finally:
        reader.close()
        run.change(
            "records-written",
            f"wrote {producer.sent} record(s) of this run (value {tag}:<n>) to {DRILL_TOPIC} "
            f"on {spec.source}, {len(producer.acked)} acknowledged; group {request.group} read "
            f"and committed {len(reader.read)} of them there",
        )
    details["acked"] = producer.acked
    details["failed_deliveries"] = producer.failed
    details["read_on_source"] = reader.read
    details["source_start"] = {str(p): o for p, o in start.items()}
    record.details = details
    record.summary = (
        f"{producer.sent} record(s) written to {DRILL_TOPIC} on {spec.source}, "
        f"{len(producer.acked)} acknowledged; group {request.group} read "
        f"{len(reader.read)} there"
        + (f"; {spec.source} killed at {_iso(details['cut'])}" if "cut" in details else "")
    )
    log(record.summary)


def _commit(cluster: str, config: dict[str, str], group: str, offsets: dict[int, int]) -> None:
    from confluent_kafka import TopicPartition

    settings = _client(config, **{"group.id": group, "enable.auto.commit": False})
    consumer = clients.consumer(cluster, settings)
    try:
        consumer.commit(
            offsets=[TopicPartition(DRILL_TOPIC, p, o) for p, o in offsets.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()


def _canaries(
    request: DrillRequest,
    spec: MirrorSpec,
    run: DrillRun,
    producer: _Producer,
    reader: _GroupReader,
    log: Log,
) -> dict:
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
    copied_at = _wait_copied(spec, producer.acked, request.timeout_s)
    if copied_at is not None:
        run.event(f"the flow copied every canary to {spec.target}", copied_at)
    return {
        "replication_latency_s": None
        if copied_at is None
        else round(max(0.0, copied_at - producer.last_ack), 3)
    }


def _continuous_then_kill(
    request: DrillRequest,
    spec: MirrorSpec,
    run: DrillRun,
    producer: _Producer,
    reader: _GroupReader,
    log: Log,
) -> dict:
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
        committed = _committed(spec.source, spec.source_admin, request.group)
        _wait_positions(spec, committed, request.timeout_s)
        from mirrorflow.replication.group_offset_sync import run_group_sync

        run_group_sync(spec, {request.group}, sync_offsets=False)
        run.event(f"group {request.group}'s commit checkpointed on {spec.target}")
        log(f"group {request.group} read {len(reader.read)} on {spec.source}; checkpointed")
        while time.monotonic() - started < request.traffic_seconds:
            time.sleep(0.1)
        sandbox = run.details("preflight")["sandbox"]
        cut = _sandbox("kill", sandbox)
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


def _sandbox(action: str, sandbox: dict) -> float:
    """Kill (``kill``) or restart (``up``) the sandbox cluster with ``mirrorflow sandbox``;
    returns when it was done (epoch seconds; for a kill the moment its signal was sent, as the
    command prints it)."""
    command = [
        sys.executable,
        "-m",
        "mirrorflow.cli",
        "sandbox",
        "--dir",
        sandbox["directory"],
        action,
        "--clusters",
        sandbox["cluster"],
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    if result.returncode != 0:
        raise MirrorflowError(
            f"mirrorflow sandbox {action} {sandbox['cluster']} failed: "
            + (result.stderr.strip().splitlines() or ["no output"])[-1]
        )
    if action == "kill":
        sent = re.search(r"SIGKILL at ([0-9.]+)", result.stdout)
        if sent is None:
            raise MirrorflowError(
                f"mirrorflow sandbox kill {sandbox['cluster']}: its broker was not running",
                "start it with mirrorflow sandbox up, then run the drill again",
            )
        return float(sent.group(1))
    return time.time()


def _committed(cluster: str, config: dict[str, str], group: str) -> dict[Partition, int]:
    from confluent_kafka import TopicPartition

    settings = _client(config, **{"group.id": group, "enable.auto.commit": False})
    consumer = clients.consumer(cluster, settings)
    try:
        found = consumer.committed(
            [TopicPartition(DRILL_TOPIC, p) for p in range(DRILL_PARTITIONS)], timeout=30
        )
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


def _wait_positions(spec: MirrorSpec, wanted: dict[Partition, int], timeout: float) -> float:
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


def _wait_copied(spec: MirrorSpec, acked: dict[str, list[int]], timeout: float) -> float | None:
    wanted: dict[Partition, int] = {}
    for partition, offset in acked.values():
        tp = (DRILL_TOPIC, partition)
        wanted[tp] = max(wanted.get(tp, 0), offset + 1)
    try:
        return _wait_positions(spec, wanted, timeout)
    except MirrorflowError:
        return None  # verify counts what is missing


# -- failover ------------------------------------------------------------------------------


def emergency_failover_request(request: DrillRequest) -> failover.FailoverRequest:
    """The request of a destructive drill's emergency failover, as the drill DAG's tasks of the
    failover's own steps (``emergency-failover.<step>``) run it, right after the kill; they skip
    (:class:`StepSkipped`) in a dry run, a non-destructive drill, and when the traffic step did
    not end (no kill: nothing to fail over)."""
    _skip_when_dry(request)
    if request.mode != "destructive":
        raise StepSkipped("non-destructive: the shadow group alone fails over (task failover)")
    if DrillRun(request).step("traffic").get("status") != "success":
        raise StepSkipped("the traffic step did not end: no broker was killed, nothing fails over")
    return request.failover_request()


@WORKFLOW.step("failover", xcom_details=False)
def failover_step(
    request: DrillRequest,
    run: DrillRun,
    record: StepRecord,
    log: Log,
    failover_tasks: bool = False,
) -> None:
    """Non-destructive: the shadow group checkpointed now and committed on the target, nothing
    else. Destructive: the emergency failover's own steps for the drill group, in order
    (preflight, fence-producers and catch-up skipped, stop-mirror, final-sync, report), with a
    failover record and report of their own: run here (``mirrorflow drill``, as ``mirrorflow
    failover`` runs them) or, with ``failover_tasks`` (the drill DAG), already run by the DAG's
    tasks of those steps, as the failover DAG runs them; either way this step collects what
    they did, and fails when they failed."""
    _skip_when_dry(request)
    if run.step("traffic").get("status") != "success":
        raise MirrorflowError("the traffic step did not end: nothing to fail over")
    spec = request.spec()
    if request.mode == "non-destructive":
        trigger = run.event("failover triggered")
        from mirrorflow.replication.group_offset_sync import run_group_sync

        result = run_group_sync(spec, {request.group}, sync_offsets=True)
        for line in result.lines():
            log(line)
        written = result.report.written if result.report else {}
        committed = {
            g: {partition_key(tp): o for tp, o in tps.items()} for g, tps in written.items()
        }
        if result.checkpoints:
            run.change(
                "checkpoints",
                f"wrote {len(result.checkpoints)} checkpoint(s) of {request.group} to "
                f"{spec.source}.checkpoints.internal on {spec.target}",
            )
        for group, offsets in committed.items():
            run.change(
                "group-offsets",
                f"committed offsets of group {group} on {spec.target}: "
                + ", ".join(f"{tp}@{o}" for tp, o in offsets.items()),
                undo={"cluster": spec.target, "group": group},
            )
        details: dict[str, Any] = {
            "committed": committed,
            "positions_at_cut": {
                partition_key(tp): o
                for tp, o in flow_positions(spec).items()
                if tp[0] == DRILL_TOPIC
            },
        }
    else:
        inner = request.failover_request()
        failed: MirrorflowError | None = None
        if failover_tasks:
            inner_run = failover.FailoverRun(inner)
            started = inner_run.step("preflight").get("started")
            if not started:
                raise MirrorflowError(
                    "the drill's emergency failover did not run (its tasks were not started)",
                    "see the tasks emergency-failover.* of this run",
                )
            at_ms = steps.stamp_ms(started)
            trigger = run.event("failover triggered", at_ms[0] / 1000 if at_ms else None)
            if inner_run.failed_steps():
                failed = MirrorflowError(
                    f"the emergency failover of the drill failed at {inner_run.failed_steps()[0]}",
                    f"its report: {inner_run.directory / 'report.md'}",
                )
        else:
            trigger = run.event("failover triggered")
            try:
                failover.run_all(inner, log=log)
            except MirrorflowError as exc:
                failed = exc
        inner_run = failover.FailoverRun(inner)
        final = inner_run.details("final-sync")
        cut = (final.get("rpo") or {}).get("positions_at_cut") or {}
        details = {
            "committed": final.get("committed") or {},
            "targets": final.get("targets") or {},
            "failover_estimate": (final.get("rpo") or {}).get("summary_short"),
            "failover_run_id": inner.run_id,
            "failover_report": str(inner_run.directory / "report.md"),
            "failover_steps": _step_timings(inner_run),
            "held": bool(inner_run.details("stop-mirror").get("held")),
            "positions_at_cut": {
                partition_key((t, int(p))): o
                for t, parts in cut.items()
                for p, o in parts.items()
                if t == DRILL_TOPIC
            },
        }
        if failed is not None:
            details["trigger"] = trigger
            record.details = details
            raise failed
    details["trigger"] = trigger
    record.details = details
    offsets = details["committed"].get(request.group, {})
    record.summary = f"group {request.group} failed over to {spec.target}: " + (
        ", ".join(f"{k}@{v}" for k, v in offsets.items()) or "no offset committed"
    )
    log(record.summary)


def _step_timings(run: steps.Run) -> list[dict]:
    """A run's steps as its report lists them: step, status, seconds, what happened."""
    return [
        {k: s[k] for k in ("step", "status", "seconds", "summary")}
        for s in run.report_header(step_details=False)["steps"]
    ]


# -- verify --------------------------------------------------------------------------------


@WORKFLOW.step("verify")
def verify(request: DrillRequest, run: DrillRun, record: StepRecord, log: Log) -> None:
    """The group reads on the target; RPO, RTO, lost and repeated."""
    _skip_when_dry(request)
    spec = request.spec()
    pre, sent, over = run.details("preflight"), run.details("traffic"), run.details("failover")
    if not sent or not over:
        raise MirrorflowError("the traffic or failover step did not run: nothing to verify")
    remote = pre["remote_topic"]
    target_client = spec.target, spec.target_admin
    # The group reads first, as an application restarted on the target would: what is
    # counted below (nothing moves now: the flow is held or its canaries copied) comes after.
    reader = _GroupReader(*target_client, request.group, safe_run_id(request.run_id), remote)
    deadline = time.monotonic() + request.timeout_s
    try:
        while reader.first_read is None and time.monotonic() < deadline:
            reader.poll(0.5)
        ends = _end_offsets(*target_client, remote, DRILL_PARTITIONS)
        while time.monotonic() < deadline and not _at_ends(reader, remote, ends):
            reader.poll(0.5)
    finally:
        reader.close()
    acked: dict[str, list[int]] = sent["acked"]
    positions = {key_partition(k)[1]: o for k, o in over["positions_at_cut"].items()}
    if request.mode == "destructive":  # the source is still down: what its last reads
        # before the cut brought (a batch in flight at the kill lands after it)
        positions = {p: o for (t, p), o in flow_positions(spec).items() if t == DRILL_TOPIC}
    copied = {s for s, (p, o) in acked.items() if o < positions.get(p, 0)}
    read_on_source = set(sent["read_on_source"])
    expected = copied - read_on_source
    if reader.first_read is not None:
        run.event(f"first record read by {request.group} on {spec.target}", reader.first_read)
        run.change(
            "group-offsets",
            f"group {request.group} read {len(reader.read)} record(s) of this run on "
            f"{spec.target} ({remote}) and committed its reads there",
            undo={"cluster": spec.target, "group": request.group},
        )
    read = reader.read
    lost = sorted(expected - set(read), key=int)
    repeated = len(read) - len(set(read)) + len(set(read) & read_on_source)
    on_target = _records_on_target(spec, remote, run, safe_run_id(request.run_id))
    trigger = sent.get("cut") or over["trigger"]
    rto = None if reader.first_read is None else round(reader.first_read - trigger, 3)
    rpo = len(acked) - len(copied)
    details = {
        "rpo_records": rpo,
        "rto_s": rto,
        "rto_basis": "the source broker's kill"
        if request.mode == "destructive"
        else "the start of the failover step",
        "acked": len(acked),
        "copied_at_cut": len(copied),
        "groups": {
            request.group: {
                "read_on_source": len(read_on_source),
                "expected_on_target": len(expected),
                "read_on_target": len(read),
                "lost": len(lost),
                "lost_examples": lost[:10],
                "repeated": repeated,
            }
        },
        "on_target": on_target,
        "replication_latency_s": sent.get("replication_latency_s"),
    }
    if request.mode == "non-destructive":
        target = ClusterAdmin(spec.target, spec.target_admin)
        source = ClusterAdmin(spec.source, spec.source_admin)
        after = _real_group_offsets(spec, target, spec.target_admin, request)
        after_source = _real_group_offsets(spec, source, spec.source_admin, request)
        details["real_groups_unchanged"] = (
            after == pre["real_groups_before"] and after_source == pre["real_source_groups_before"]
        )
        details["real_groups"] = sorted(after)
    record.details = details
    record.summary = (
        f"RPO {rpo} record(s) (acknowledged by {spec.source}, not on {spec.target} at the "
        f"cut); RTO {'-' if rto is None else f'{rto:.1f}s'} (from {details['rto_basis']} "
        f"to the first read on {spec.target}); group {request.group}: {len(read)} read on "
        f"{spec.target}, {len(lost)} lost, {repeated} repeated"
    )
    log(record.summary)
    if request.mode == "non-destructive":
        log(
            f"canaries on {spec.target}: {on_target['once']} once, {on_target['missing']} "
            f"missing, {on_target['duplicated']} duplicated; real groups "
            + ("unchanged" if details["real_groups_unchanged"] else "CHANGED")
        )
    problems = []
    if reader.first_read is None:
        problems.append(f"{request.group} read nothing on {spec.target}")
    if lost or repeated:
        problems.append(f"{len(lost)} lost, {repeated} repeated")
    if request.mode == "non-destructive" and not details["real_groups_unchanged"]:
        problems.append("the real groups' offsets changed")
    if problems:
        raise MirrorflowError(
            f"drill of {request.flow} failed its verification: {'; '.join(problems)}",
            "see the report for the timeline and per-group figures",
        )


def _at_ends(reader: _GroupReader, topic: str, ends: dict[int, int]) -> bool:
    from confluent_kafka import TopicPartition

    positions = reader.consumer.position([TopicPartition(topic, p) for p in ends])
    return all(tp.offset >= ends[tp.partition] for tp in positions if ends[tp.partition] > 0)


def _records_on_target(spec: MirrorSpec, remote: str, run: DrillRun, tag: str) -> dict:
    """Each acknowledged record of this run found on the target's copy: once, missing, more."""
    from confluent_kafka import TopicPartition

    acked = run.details("traffic")["acked"]
    consumer = clients.consumer(
        spec.target,
        _client(
            spec.target_admin,
            **{
                "group.id": "mirrorflow-drill-probe",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            },
        ),
    )
    ends = _end_offsets(spec.target, spec.target_admin, remote, DRILL_PARTITIONS)
    counts: dict[str, int] = {}
    try:
        consumer.assign([TopicPartition(remote, p, 0) for p in ends])  # 0: from the start
        deadline = time.monotonic() + 60
        done: set[int] = {p for p, e in ends.items() if e == 0}
        while len(done) < len(ends) and time.monotonic() < deadline:
            for m in consumer.consume(1000, 1.0):
                if m.error() is not None:
                    continue
                t, _, seq = (m.value() or b"").decode().rpartition(":")
                if t == tag:
                    counts[seq] = counts.get(seq, 0) + 1
            # positions, not offsets read: an exactly-once copy ends with a commit marker
            for tp in consumer.position([TopicPartition(remote, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
    finally:
        consumer.close()
    return {
        "once": sum(1 for s in acked if counts.get(s) == 1),
        "missing": sum(1 for s in acked if s not in counts),
        "duplicated": sum(1 for n in counts.values() if n > 1),
    }


# -- restore -------------------------------------------------------------------------------


@WORKFLOW.step("restore")
def restore(request: DrillRequest, run: DrillRun, record: StepRecord, log: Log) -> None:
    """Destructive: the broker restarted, the hold released, the flow resumes. Both: the
    drill group deleted on both clusters."""
    _skip_when_dry(request)
    spec = request.spec()
    details: dict = {}
    pre = run.details("preflight")
    if request.mode == "destructive" and pre.get("sandbox"):
        _sandbox("up", pre["sandbox"])
        run.event(f"{spec.source} broker restarted")
        run.change(
            "broker-restarted",
            f"restarted {spec.source}'s broker (sandbox cluster {pre['sandbox']['cluster']})",
        )
        log(f"{spec.source}'s broker restarted")
        # What the drill's failover holds (its ledger): released, and its record marked so.
        inner = failover.FailoverRun(request.failover_request()).data
        released: list[str] = []
        if inner.get("steps"):
            released, kept = failover.release_failover(
                inner, run, request.flow_dir(), request.spec, False, log
            )
            details["kept"] = kept
        details["released"] = released
        log(f"{request.flow}: {'; '.join(released) or 'nothing'} released, the flow resumes")
        if positions_at_cut(inner) is not None:
            try:  # the source is back: the RPO of the drill's failover, counted there
                details["measured_rpo"] = failover.measure_and_record(spec, inner, run, False, log)
            except MirrorflowError as exc:
                details["measured_rpo_error"] = str(exc)
                log(f"the RPO could not be measured on {spec.source}: {exc}")
        acked = run.details("traffic").get("acked", {})
        state_dir = request.flows_state_dir()
        running = jobs.mirror_processes(state_dir, request.flow) or jobs.running_jobs(
            state_dir, request.flow
        )
        if not running:  # e.g. it gave up during the outage: its DAG's retries restart it
            log(
                f"no mirror job runs {request.flow} now: it resumes when the mirror DAG "
                "starts its job again"
            )
        caught = _wait_copied(spec, acked, request.timeout_s) if running else None
        details["mirror_job_running"] = bool(running)
        details["flow_caught_up"] = caught is not None
        if caught is not None:
            run.event(f"the flow copied the rest of the drill's records to {spec.target}", caught)
        log(
            f"{request.flow} "
            + ("copied the rest after the restore" if caught else "has not caught up yet")
        )
    details["deleted_groups"] = _delete_group(spec, request.group)
    for alias in details["deleted_groups"]:
        run.change("group-deleted", f"deleted group {request.group} on {alias}")
    record.details = details
    record.summary = (
        ("broker restarted, flow resumed; " if "released" in details else "")
        + f"group {request.group} deleted on "
        + (", ".join(details["deleted_groups"]) or "no cluster")
    )
    log(record.summary)


def _delete_group(spec: MirrorSpec, group: str) -> list[str]:
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


# -- report --------------------------------------------------------------------------------


NOT_REHEARSED = {
    "non-destructive": [
        "the source's loss: it stays up, and the shadow group is checkpointed now with exact "
        "translation (a planned failover's way), not from the checkpoints stored on the target",
        "stop-mirror: the flow is not held, the mirror job keeps copying",
        "fencing producers",
        "moving real consumer groups: the shadow group alone moves (the real groups' offsets "
        "are only compared)",
        "the time people take to notice, decide and trigger the failover",
        "the failback",
    ],
    "destructive": [
        "fencing producers: an emergency failover cannot (the source is away)",
        "moving real consumer groups: the drill group alone moves",
        "the time people take to notice and decide: the failover starts right after the kill",
        "the loss of more than the source's broker (the DR cluster, the network, the machine "
        "running the mirror job and Airflow all stay up), on sandbox clusters only",
        "the failback: the restore restarts the broker and releases the hold; nothing written "
        "on the DR cluster is copied back",
    ],
}


def report_context(run: DrillRun) -> dict:
    """What the templates show, from the run record (without the per-record lists): the
    timeline, the figures, the ledger (``changes``), what the drill could not rehearse, and,
    destructive, the failover's own steps with their seconds and its ledger."""
    data = run.data
    figures = run.details("verify")
    over = run.details("failover")
    restore = run.details("restore")
    mode = data["request"]["mode"]
    failover_changes: list[dict] = []
    measured = restore.get("measured_rpo")
    failover_steps = over.get("failover_steps") or []
    if over.get("failover_run_id"):
        inner_run = failover.FailoverRun(run.request.failover_request())
        inner = inner_run.data
        failover_changes = list(inner.get("changes") or [])
        measured = measured or inner.get("measured_rpo")
        failover_steps = _step_timings(inner_run)  # its report step too, wherever it ran
    steps_seconds = [s["seconds"] for s in failover_steps if s["seconds"]]
    return {
        **run.report_header(step_details=False, ended=False),
        "mode": mode,
        "timeline": sorted(
            ({"at": e["at"], "event": e["event"]} for e in data["timeline"]),
            key=lambda e: e["at"],
        ),
        "preflight": {
            k: v for k, v in run.details("preflight").items() if not k.startswith("real_")
        },
        "figures": figures,
        "committed": over.get("committed") or {},
        "failover_report": over.get("failover_report"),
        "failover_steps": failover_steps,
        "failover_seconds": round(sum(steps_seconds), 3) if steps_seconds else None,
        "failover_changes": failover_changes,
        "measured_rpo": measured,
        "not_rehearsed": NOT_REHEARSED[mode],
        "restore": restore,
    }


report = WORKFLOW.report
STEP_FUNCTIONS: dict[str, Callable[..., dict]] = WORKFLOW.functions
