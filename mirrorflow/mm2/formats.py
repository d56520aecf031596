"""MirrorMaker 2's internal record formats: heartbeats, checkpoints and offset syncs.

MirrorMaker 2 writes these records with Kafka's ``protocol.types.Schema``: the fields of a key or
value follow each other in declaration order, with no tags, padding or length prefix.

- ``INT16``/``INT32``/``INT64`` are big-endian two's complement integers of 2, 4 and 8 bytes.
- ``STRING`` is an ``INT16`` byte count N (0..32767) followed by N bytes of UTF-8. Like Java,
  reading replaces invalid UTF-8 with U+FFFD instead of failing (MirrorMaker 2 never writes
  any; for a few malformed sequences, such as encoded surrogates, the count of U+FFFD differs).
- Heartbeat and checkpoint values start with an ``INT16`` version, always 0. An offset sync has
  no version.
- Readers ignore bytes after the last field, as ``Schema.read`` does.

Every class here encodes byte for byte what MirrorMaker 2 writes and decodes what it reads. A
record that cannot be decoded raises :class:`SchemaError`, which names the record, the field and
what is wrong. MirrorMaker 2's readers skip such records; callers can do the same.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import NamedTuple, Self

VERSION = 0
"""The only version MirrorMaker 2 writes at the start of heartbeat and checkpoint values."""

MAX_STRING_BYTES = 32767
"""The longest ``STRING`` that Kafka's schema types can hold, in UTF-8 bytes."""

_INT16, _INT32, _INT64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class SchemaError(ValueError):
    """A value that cannot be encoded, or bytes that are not a valid record of the expected type.

    This corresponds to Kafka's ``SchemaException``.
    """


class TopicPartition(NamedTuple):
    """A topic and partition, as written in checkpoint and offset-sync keys."""

    topic: str
    partition: int


def _int(kind: struct.Struct, field: str, value: int) -> bytes:
    bits = kind.size * 8
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise SchemaError(f"{field}={value} does not fit in INT{bits}")
    return kind.pack(value)


def _string(field: str, value: str) -> bytes:
    if not isinstance(value, str):
        raise SchemaError(f"{field} must be a string, not {value!r}")
    encoded = value.encode("utf-8")
    if len(encoded) > MAX_STRING_BYTES:
        raise SchemaError(
            f"{field} is {len(encoded)} bytes in UTF-8; a STRING holds at most {MAX_STRING_BYTES}"
        )
    return _INT16.pack(len(encoded)) + encoded


class _Reader:
    """Reads the fields of one key or value in order, naming the field in any error."""

    def __init__(self, record: str, data: bytes | None) -> None:
        if data is None:
            raise SchemaError(f"{record} is missing (null)")
        self._record = record
        self._data = memoryview(data)
        self._position = 0

    def _take(self, field: str, count: int) -> memoryview:
        available = len(self._data) - self._position
        if count > available:
            raise SchemaError(
                f"{self._record} is truncated: {field} needs {count} bytes at byte "
                f"{self._position}, only {available} left"
            )
        chunk = self._data[self._position : self._position + count]
        self._position += count
        return chunk

    def int(self, kind: struct.Struct, field: str) -> int:
        return kind.unpack(self._take(field, kind.size))[0]

    def string(self, field: str) -> str:
        length = self.int(_INT16, f"length of {field}")
        if length < 0:
            raise SchemaError(f"{self._record} has a negative length ({length}) for {field}")
        return str(self._take(field, length), "utf-8", "replace")

    def version(self) -> None:
        version = self.int(_INT16, "version")
        if version != VERSION:
            raise SchemaError(
                f"{self._record} has version {version}; only version {VERSION} is known"
            )


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat of the flow from one cluster alias to another, as in ``heartbeats`` topics.

    Key: ``sourceClusterAlias: STRING, targetClusterAlias: STRING``.
    Value: ``version: INT16, timestamp: INT64`` (milliseconds since the epoch).
    """

    source_cluster_alias: str
    target_cluster_alias: str
    timestamp: int

    def key(self) -> bytes:
        return _string("sourceClusterAlias", self.source_cluster_alias) + _string(
            "targetClusterAlias", self.target_cluster_alias
        )

    def value(self) -> bytes:
        return _int(_INT16, "version", VERSION) + _int(_INT64, "timestamp", self.timestamp)

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> Self:
        k = _Reader("heartbeat key", key)
        v = _Reader("heartbeat value", value)
        v.version()
        return cls(
            source_cluster_alias=k.string("sourceClusterAlias"),
            target_cluster_alias=k.string("targetClusterAlias"),
            timestamp=v.int(_INT64, "timestamp"),
        )


@dataclass(frozen=True)
class Checkpoint:
    """A consumer group's offset on one partition, translated for the target cluster.

    ``topic`` and ``partition`` name the downstream (target) partition. ``metadata`` is the
    group's commit metadata, ``""`` when it has none.

    Key: ``group: STRING, topic: STRING, partition: INT32``.
    Value: ``version: INT16, upstreamOffset: INT64, offset: INT64, metadata: STRING``.
    """

    group: str
    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int
    metadata: str = ""

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def key(self) -> bytes:
        return (
            _string("group", self.group)
            + _string("topic", self.topic)
            + _int(_INT32, "partition", self.partition)
        )

    def value(self) -> bytes:
        return (
            _int(_INT16, "version", VERSION)
            + _int(_INT64, "upstreamOffset", self.upstream_offset)
            + _int(_INT64, "offset", self.downstream_offset)
            + _string("metadata", self.metadata)
        )

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> Self:
        k = _Reader("checkpoint key", key)
        v = _Reader("checkpoint value", value)
        v.version()
        return cls(
            group=k.string("group"),
            topic=k.string("topic"),
            partition=k.int(_INT32, "partition"),
            upstream_offset=v.int(_INT64, "upstreamOffset"),
            downstream_offset=v.int(_INT64, "offset"),
            metadata=v.string("metadata"),
        )


@dataclass(frozen=True)
class OffsetSync:
    """The downstream offset of the copy of one upstream record.

    ``topic`` and ``partition`` name the upstream (source) partition.

    Key: ``topic: STRING, partition: INT32``.
    Value: ``upstreamOffset: INT64, offset: INT64``, with no version.
    """

    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def key(self) -> bytes:
        return _string("topic", self.topic) + _int(_INT32, "partition", self.partition)

    def value(self) -> bytes:
        return _int(_INT64, "upstreamOffset", self.upstream_offset) + _int(
            _INT64, "offset", self.downstream_offset
        )

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> Self:
        k = _Reader("offset sync key", key)
        v = _Reader("offset sync value", value)
        return cls(
            topic=k.string("topic"),
            partition=k.int(_INT32, "partition"),
            upstream_offset=v.int(_INT64, "upstreamOffset"),
            downstream_offset=v.int(_INT64, "offset"),
        )


@dataclass(frozen=True)
class SourceOffset:
    """A ``MirrorSourceConnector`` position in Connect's offsets topic (``mm2-offsets.<source>
    .internal`` on the target): the last upstream offset of ``topic``-``partition`` that was
    replicated. Written by Connect's ``JsonConverter`` (schemas disabled) as the compact JSON
    key ``["MirrorSourceConnector",{"cluster":…,"partition":…,"topic":…}]`` and value
    ``{"offset":…}``; MirrorMaker 2 resumes at ``offset + 1``.
    """

    cluster: str
    topic: str
    partition: int
    offset: int

    CONNECTOR = "MirrorSourceConnector"

    def key(self) -> bytes:
        partition = {"cluster": self.cluster, "partition": self.partition, "topic": self.topic}
        return json.dumps([self.CONNECTOR, partition], separators=(",", ":")).encode()

    def value(self) -> bytes:
        return json.dumps({"offset": self.offset}, separators=(",", ":")).encode()

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> Self | None:
        """The position in a record of the offsets topic; None for other connectors' records
        and for tombstones."""
        try:
            connector, partition = json.loads(key or b"null")
            if connector != cls.CONNECTOR or value is None:
                return None
            return cls(
                partition["cluster"],
                partition["topic"],
                int(partition["partition"]),
                int(json.loads(value)["offset"]),
            )
        except (ValueError, TypeError, KeyError):
            return None
