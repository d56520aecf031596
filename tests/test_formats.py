"""MirrorMaker 2's heartbeat, checkpoint and offset-sync records, byte for byte.

Golden bytes come from the reference (mm2-internals.md §1); the compatibility tests run
MirrorMaker 2's own classes (connect-mirror 4.3.1) through ``tests/java/Mm2Oracle.java``.
"""

from __future__ import annotations

import re

import pytest

from mirrorflow.mm2.formats import (
    MAX_STRING_BYTES,
    Checkpoint,
    Heartbeat,
    OffsetSync,
    SchemaError,
    TopicPartition,
)
from tests.mm2_oracle import Mm2Oracle, Mm2Rejected, Record, shared

INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


@pytest.fixture(scope="module")
def mm2() -> Mm2Oracle:
    return shared()


@pytest.mark.parametrize(
    ("record", "key", "value"),
    [
        (Heartbeat("A", "B", 0), "000141000142", "0000" + "0000000000000000"),
        (Heartbeat("A", "B", 1_700_000_000_123), "000141000142", "0000" + "0000018bcfe5687b"),
        (
            Checkpoint("g", "A.t", 1, 10, 7, ""),
            "0001670003412e7400000001",
            "0000" + "000000000000000a" + "0000000000000007" + "0000",
        ),
        (
            Checkpoint("g", "A.t", 1, 10, 7, "meta"),
            "0001670003412e7400000001",
            "0000" + "000000000000000a" + "0000000000000007" + "0004" + "6d657461",
        ),
        (OffsetSync("t", 0, 5, 3), "00017400000000", "0000000000000005" + "0000000000000003"),
    ],
    ids=repr,
)
def test_records_have_mirrormaker_2s_documented_bytes(record: Record, key: str, value: str):
    assert (record.key().hex(), record.value().hex()) == (key, value)
    assert type(record).from_record(bytes.fromhex(key), bytes.fromhex(value)) == record


def test_decoding_ignores_trailing_bytes_like_schema_read():
    checkpoint = Checkpoint("group", "A.topic", 3, 100, 42, "m")
    decoded = Checkpoint.from_record(checkpoint.key() + b"\x01\x02", checkpoint.value() + b"\xff")
    assert decoded == checkpoint


def test_checkpoint_and_offset_sync_name_their_topic_partition():
    assert Checkpoint("g", "A.t", 2, 1, 1).topic_partition == TopicPartition("A.t", 2)
    assert OffsetSync("t", 7, 1, 1).topic_partition == ("t", 7)


@pytest.mark.parametrize(
    ("kind", "key", "value", "message"),
    [
        (Heartbeat, None, "00000000000000000000", "heartbeat key is missing"),
        (Heartbeat, "000141000142", "0000000000", "heartbeat value is truncated: timestamp"),
        (Heartbeat, "0001410001", "00000000000000000000", "targetClusterAlias needs 1 bytes"),
        (Heartbeat, "000141000142", "00010000000000000000", "heartbeat value has version 1"),
        (Checkpoint, "ffff", "0000" + "00" * 18, "negative length (-1) for group"),
        (Checkpoint, "000167000141000000", "0000" + "00" * 18, "partition needs 4 bytes"),
        (Checkpoint, "00016700014100000000", "0000", "upstreamOffset needs 8 bytes"),
        (Checkpoint, "00016700014100000000", "0000" + "00" * 16, "length of metadata"),
        (OffsetSync, "0001740000", "00" * 16, "offset sync key is truncated: partition"),
        (OffsetSync, "00017400000000", "00" * 12, "offset sync value is truncated: offset"),
        (OffsetSync, "00017400000000", None, "offset sync value is missing"),
    ],
)
def test_malformed_records_fail_with_the_field_named(kind, key, value, message):
    with pytest.raises(SchemaError, match=re.escape(message)):
        kind.from_record(key and bytes.fromhex(key), value and bytes.fromhex(value))


def test_strings_longer_than_32767_utf8_bytes_cannot_be_written():
    longest = "é" * (MAX_STRING_BYTES // 2) + "x"  # 32767 bytes
    assert len(Heartbeat(longest, "B", 0).key()) == 2 + MAX_STRING_BYTES + 3
    with pytest.raises(SchemaError, match="sourceClusterAlias is 32768 bytes"):
        Heartbeat(longest + "x", "B", 0).key()
    with pytest.raises(SchemaError, match="metadata is 32769 bytes"):
        Checkpoint("g", "t", 0, 0, 0, longest + "é").value()


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (OffsetSync("t", INT32_MAX + 1, 0, 0), "partition=2147483648 does not fit in INT32"),
        (OffsetSync("t", 0, INT64_MAX + 1, 0), "upstreamOffset=.* does not fit in INT64"),
        (Checkpoint("g", "t", 0, 0, -(2**63) - 1), "offset=.* does not fit in INT64"),
        (Heartbeat("A", None, 0), "targetClusterAlias must be a string, not None"),  # type: ignore[arg-type]
    ],
    ids=repr,
)
def test_values_outside_the_schema_cannot_be_written(record: Record, message: str):
    with pytest.raises(SchemaError, match=message):
        record.key() + record.value()


# Compatibility with MirrorMaker 2's own classes.

UNICODE = "Grüße-日本-🚀"
SAMPLES: list[Record] = [
    Heartbeat("A", "B", 1_700_000_000_123),
    Heartbeat("", "", 0),
    Heartbeat(UNICODE, "ünïcødé", -1),
    Heartbeat("a" * MAX_STRING_BYTES, "🚀" * (MAX_STRING_BYTES // 4), INT64_MAX),
    Checkpoint("g", "A.t", 1, 10, 7, ""),
    Checkpoint("consumer group with spaces", "B.A.orders", INT32_MAX, INT64_MAX, 0, "meta"),
    Checkpoint(UNICODE, "t", 0, -(2**63), -1, UNICODE * 100),
    Checkpoint("g", "t", -(2**31), 0, INT64_MAX, "é" * (MAX_STRING_BYTES // 2)),
    OffsetSync("t", 0, 5, 3),
    OffsetSync("orders", INT32_MAX, INT64_MAX, 2**62),
    OffsetSync(UNICODE, -1, -(2**63), -1),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: repr(r)[:60])
def test_encoding_is_identical_to_mirrormaker_2s(mm2: Mm2Oracle, record: Record):
    assert mm2.encode(record) == (record.key(), record.value())


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: repr(r)[:60])
def test_each_side_decodes_what_the_other_encodes(mm2: Mm2Oracle, record: Record):
    assert mm2.decode(type(record), record.key(), record.value()) == record
    assert type(record).from_record(*mm2.encode(record)) == record


@pytest.mark.parametrize(
    ("record", "key_suffix", "value_suffix"),
    [
        (Heartbeat("A", "B", 9), "ff", "0102"),
        (Checkpoint("g", "t", 1, 2, 3, "m"), "00", "ffffffff"),
        (OffsetSync("t", 1, 2, 3), "0000", "01"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else v,
)
def test_both_sides_ignore_trailing_bytes(mm2, record, key_suffix, value_suffix):
    key, value = (
        record.key() + bytes.fromhex(key_suffix),
        record.value() + bytes.fromhex(value_suffix),
    )
    assert mm2.decode(type(record), key, value) == record
    assert type(record).from_record(key, value) == record


@pytest.mark.parametrize("bad_utf8", ["ff", "61c3", "e282", "c0af", "f4908080"])
def test_invalid_utf8_decodes_to_the_same_replacement_text_as_mirrormaker_2(mm2, bad_utf8):
    raw = bytes.fromhex(bad_utf8)
    key = len(raw).to_bytes(2, "big") + raw + bytes.fromhex("00000001")
    value = OffsetSync("t", 1, 2, 3).value()
    assert OffsetSync.from_record(key, value) == mm2.decode(OffsetSync, key, value)
    assert "\ufffd" in OffsetSync.from_record(key, value).topic


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        (Heartbeat, "000141000142", "0000000000"),  # truncated timestamp
        (Heartbeat, "000141000142", "00010000000000000000"),  # unknown version
        (Checkpoint, "ffff", "0000" + "00" * 18),  # negative string length
        (Checkpoint, "000567", "0000" + "00" * 18),  # string longer than the key
        (Checkpoint, "000167000141000000", "0000" + "00" * 18),  # truncated partition
        (OffsetSync, "00017400000000", "00" * 15),  # truncated downstream offset
    ],
)
def test_both_sides_reject_the_same_malformed_records(mm2, kind, key, value):
    key, value = bytes.fromhex(key), bytes.fromhex(value)
    with pytest.raises(Mm2Rejected):
        mm2.decode(kind, key, value)
    with pytest.raises(SchemaError):
        kind.from_record(key, value)


def test_both_sides_refuse_to_write_a_32768_byte_string(mm2):
    too_long = Heartbeat("x" * (MAX_STRING_BYTES + 1), "B", 0)
    with pytest.raises(Mm2Rejected, match="larger than the maximum"):
        mm2.encode(too_long)
    with pytest.raises(SchemaError):
        too_long.key()
