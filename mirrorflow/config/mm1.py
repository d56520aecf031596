"""MirrorMaker 1 (``kafka-mirror-maker.sh``, removed in Kafka 4.0) as a flow file.

MirrorMaker 1 takes a consumer's and a producer's properties and a topic regex::

    kafka-mirror-maker.sh --consumer.config consumer.properties \\
        --producer.config producer.properties --whitelist 'A|B'

and copies every topic the regex matches to a topic of the same name on the producer's
cluster, its consumer group resuming from the offsets it committed. :func:`convert` writes the
one flow ``source->target`` that does the same with MirrorMaker 2's settings:

- **the topics**: ``--include`` (or the deprecated ``--whitelist``) read as Kafka's
  ``TopicFilter`` reads it (trimmed, ``,`` for ``|``, spaces and surrounding quotes dropped),
  a Java regex matched against the whole topic name; ``*`` alone, which Kafka's old docs give
  for "every topic" and Java refuses, is read as ``.*``;
- **same names**: ``IdentityReplicationPolicy``;
- **the start**: a partition starts at the offset MirrorMaker 1's group (the consumer's
  ``group.id``) committed on the source (mirrorflow's ``starting.offsets.group``), else as the
  consumer's ``auto.offset.reset`` says (``latest`` when unset, the Java consumer's default,
  which MirrorMaker 1 kept). So a migration neither skips nor repeats what MirrorMaker 1 copied
  and committed. Once a partition has a position, the flow's own positions
  (``mm2-offsets.<source>.internal``) decide, as for any flow;
- **the clients**: connection and security settings (``bootstrap.servers``, ``security.*``,
  ``ssl.*``, ``sasl.*``) become the clusters', other settings the source's consumer's or the
  target's producer's. Keys MirrorMaker 1 set itself (serialisers, ``client.id``,
  ``enable.auto.commit``, ``producer.type``) are dropped, each with a note.

Secrets are never copied: each secret value becomes a ``${file:<path>:<key>}`` reference to the
properties file it came from, read by Kafka's ``FileConfigProvider`` when a client is made.

The rest is MirrorMaker 2's (and mirrorflow's) as for any flow, and differs from MirrorMaker 1
where 1 had nothing: remote topics are created with the source's partitions and configs,
heartbeats and checkpoints are written, each record keeps its source partition (MirrorMaker 1
let the producer partition by key), and aborted transactions are not copied (MirrorMaker 1's
consumer read them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mirrorflow.config import properties
from mirrorflow.config.properties import Location, Property
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs

IDENTITY_POLICY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
FILE_PROVIDER = "org.apache.kafka.common.config.provider.FileConfigProvider"

# Set by MirrorMaker 1 itself whatever the file said, or meaningless without its consumer group.
_CONSUMER_DROPPED = {
    "key.deserializer": "MirrorMaker 1 always read bytes, as mirrorflow does",
    "value.deserializer": "MirrorMaker 1 always read bytes, as mirrorflow does",
    "client.id": "MirrorMaker 1 replaced it by <group.id>-<stream>",
    "enable.auto.commit": "mirrorflow keeps its positions in mm2-offsets.<source>.internal on "
    "the target, not in a consumer group",
}
_PRODUCER_DROPPED = {
    "key.serializer": "MirrorMaker 1 always wrote bytes, as mirrorflow does",
    "value.serializer": "MirrorMaker 1 always wrote bytes, as mirrorflow does",
    "producer.type": "mirrorflow writes a batch's positions only once every copy is acknowledged",
}


@dataclass(frozen=True)
class Mm1Command:
    """MirrorMaker 1's command line, as ``kafka-mirror-maker.sh`` took it (Kafka 3.x)."""

    consumer_config: Path
    producer_config: Path
    include: str | None = None  # --include
    whitelist: str | None = None  # --whitelist (deprecated; ignored when --include is given)
    num_streams: int | None = None  # --num.streams
    offset_commit_interval_ms: int | None = None  # --offset.commit.interval.ms
    abort_on_send_failure: str | None = None  # --abort.on.send.failure


@dataclass(frozen=True)
class Conversion:
    """The flow file's definitions, and what the user should know of the conversion."""

    definitions: list[Property]
    aliases: list[str]
    notes: list[str]


def include_regex(raw: str) -> str:
    """MirrorMaker 1's topic regex as Kafka's ``TopicFilter`` reads it (``*`` alone: ``.*``)."""
    regex = raw.strip().replace(",", "|").replace(" ", "")
    regex = re.sub(r"""^["']+""", "", regex)
    regex = re.sub(r"""["']+$""", "", regex)
    return ".*" if regex == "*" else regex


def convert(command: Mm1Command, source: str = "source", target: str = "target") -> Conversion:
    """The flow ``source->target`` doing what MirrorMaker 1 did with ``command``."""
    if source == target:
        raise MirrorflowError(
            f"the source and target cluster names are both {source!r}",
            "give them different names with --source and --target",
        )
    raw = command.include if command.include is not None else command.whitelist
    if not raw or not raw.strip():
        raise MirrorflowError(
            "MirrorMaker 1's topics are missing: --include (or --whitelist) is required",
            "give the regex MirrorMaker 1 ran with, e.g. --include 'orders|payments'",
        )
    if (command.abort_on_send_failure or "true").strip().lower() != "true":
        raise MirrorflowError(
            "--abort.on.send.failure false is not supported: MirrorMaker 1 then skipped the "
            "records it could not send; mirrorflow never skips a record",
            "drop the flag: a flow stops at a record it cannot send, naming it",
        )
    flow = f"{source}->{target}"
    consumer = _read(command.consumer_config, "--consumer.config")
    producer = _read(command.producer_config, "--producer.config")
    notes: list[str] = []
    out: list[tuple[str, str]] = [
        ("clusters", f"{source}, {target}"),
        (f"{flow}.enabled", "true"),
        (f"{flow}.topics", include_regex(raw)),
        ("replication.policy.class", IDENTITY_POLICY),
    ]
    secrets = False
    for alias, path, props, role, dropped in (
        (source, command.consumer_config, consumer, "consumer", _CONSUMER_DROPPED),
        (target, command.producer_config, producer, "producer", _PRODUCER_DROPPED),
    ):
        if "bootstrap.servers" not in props:
            raise MirrorflowError(
                f"{path} has no bootstrap.servers: MirrorMaker 1's {role} needs it",
                f"add the {alias} cluster's bootstrap.servers to {path}",
            )
        for key, value in props.items():
            if key in dropped:
                notes.append(f"{path}: {key} dropped: {dropped[key]}")
                continue
            if role == "consumer" and key == "group.id":
                out.append((f"{flow}.{configdefs.STARTING_OFFSETS_GROUP}", value))
                continue
            name = (
                f"{alias}.{key}"
                if key in configdefs.client_security_names()
                else f"{alias}.{role}.{key}"
            )
            if configdefs.is_sensitive(key):
                value, secrets = f"${{file:{path.resolve()}:{key}}}", True
            out.append((name, value))
    if "group.id" not in consumer:
        notes.append(
            f"{command.consumer_config} has no group.id: the flow starts as "
            "auto.offset.reset says, not where MirrorMaker 1 stopped"
        )
    if "auto.offset.reset" not in consumer:
        out.append((f"{source}.consumer.auto.offset.reset", "latest"))
    if secrets:
        out += [("config.providers", "file"), ("config.providers.file.class", FILE_PROVIDER)]
        notes.append(
            "secrets are read from the MirrorMaker 1 files when a client is made "
            "(${file:...} references): keep those files, readable by the mirror job only"
        )
    if command.num_streams is not None:
        notes.append(
            "--num.streams dropped: a flow copies every partition in parallel, as Spark's "
            "executors allow"
        )
    if command.offset_commit_interval_ms is not None:
        notes.append(
            "--offset.commit.interval.ms dropped: a flow writes its positions after each "
            "batch, once its copies are acknowledged"
        )
    where = Location(str(command.consumer_config), 1)
    return Conversion([Property(k, v, where) for k, v in out], [source, target], notes)


def _read(path: Path, flag: str) -> dict[str, str]:
    if not path.is_file():
        raise MirrorflowError(
            f"{flag} {path}: no such file", "give the properties file MirrorMaker 1 ran with"
        )
    return {p.key: p.value for p in properties.load(path)}
