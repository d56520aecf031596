"""A flow's record transforms: MirrorMaker 2's Connect ``transforms`` / ``predicates`` keys and
mirrorflow's ``record.filter``, compiled to two Spark SQL expressions over the source record.

Connect runs a connector's transformation chain on each record before it is produced
(``TransformationStage.apply``): a stage with a predicate transforms the record when
``negate XOR predicate.test(record)``; ``Filter`` drops it (returns null) and ends the chain. Of
Connect's transforms, these make sense on MirrorMaker 2's raw bytes (key, value and header
converters are ``ByteArrayConverter``) and are honoured:

- ``Filter``, alone (drops every record) or with a predicate: ``TopicNameMatches`` (a Java regex
  matched in full against the record's topic, which in MirrorMaker 2 is the *remote* topic),
  ``HasHeaderKey`` (a header of that name, whatever its value) and ``RecordIsTombstone`` (a
  null value);
- ``DropHeaders`` (every header of the listed names);
- ``InsertHeader`` (appends a header ``header`` whose value is ``value.literal`` as UTF-8 text).
  MirrorMaker 2 itself fails every record with it: Connect parses the literal into a string,
  number or boolean, and MirrorMaker 2's header converter, ``ByteArrayConverter``, takes bytes
  only. ``validate`` says so.

Every other transform (``HeaderFrom``, ``Cast``, ``ReplaceField``, … need a struct or map value,
which byte arrays are not) and every other predicate are refused by ``validate``.

mirrorflow's own ``record.filter`` is a Spark SQL boolean expression over the record as read from
the source (columns :data:`COLUMNS`); a record is copied when the chain keeps it and the filter
is true (not false, not null).

The result, :class:`RecordTransform`, is the chain as ``keep`` (boolean) and ``headers`` (the
headers to write) over :data:`COLUMNS`; both copy paths evaluate exactly these expressions with
Spark SQL (the exactly-once path as DataFrame columns, the JVM copier with the same analysed
expressions), so they cannot disagree. A dropped record is not copied; the flow's position moves
past it, and the offset map and offset syncs simply have no copy of it (a gap), so translated
group offsets stay exact.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from mirrorflow.mm2.configdefs import PROVENANCE, RECORD_FILTER
from mirrorflow.mm2.filters import JavaRegexError, compile_java_regex
from mirrorflow.mm2.policy import DefaultReplicationPolicy, ReplicationPolicy

__all__ = [
    "PROVENANCE",
    "RECORD_FILTER",
    "RecordTransform",
    "TransformError",
    "compile_transforms",
]

COLUMNS = (
    ("topic", "STRING"),
    ("remote_topic", "STRING"),
    ("partition", "INT"),
    ("offset", "BIGINT"),
    ("timestamp", "TIMESTAMP"),
    ("key", "BINARY"),
    ("value", "BINARY"),
    ("headers", "ARRAY<STRUCT<key: STRING, value: BINARY>>"),
)
"""The record as the expressions see it: its source topic and the remote topic it goes to."""

_PACKAGE = "org.apache.kafka.connect.transforms."
TRANSFORMS = ("Filter", "InsertHeader", "DropHeaders")
PREDICATES = ("TopicNameMatches", "HasHeaderKey", "RecordIsTombstone")


_NO_NULL_HEADERS = "coalesce(headers, CAST(array() AS ARRAY<STRUCT<key: STRING, value: BINARY>>))"
"""A record's headers, an empty array when it has none (Spark's Kafka source gives null)."""


ORIGIN_HEADER = "mirrorflow.origin"
"""Provenance mode's header: the alias of the cluster where the record was first written."""


def _hex(text: str) -> str:
    return "X'" + text.encode().hex().upper() + "'"


def _not_from(target: str) -> str:
    """True unless the record's origin header names ``target`` (it would loop back there)."""
    origin = f"h.key = {sql_string(ORIGIN_HEADER)} AND h.value = {_hex(target)}"
    return f"NOT coalesce(exists(headers, h -> {origin}), false)"


def _with_origin(headers: str, source: str) -> str:
    """``headers`` (after the flow's transforms) with the source record's origin header, or one
    naming ``source`` when it has none (it was first written there)."""
    named = f"h.key = {sql_string(ORIGIN_HEADER)}"
    base = _NO_NULL_HEADERS if headers == "headers" else headers
    new = f"array(named_struct('key', {sql_string(ORIGIN_HEADER)}, 'value', {_hex(source)}))"
    origin = f"IF(exists(headers, h -> {named}), filter(headers, h -> {named}), {new})"
    return f"concat(filter({base}, h -> NOT ({named})), {origin})"


class TransformError(ValueError):
    """A transform or predicate mirrorflow cannot honour: ``key`` names the setting."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem
        self.fix = fix


@dataclass(frozen=True)
class RecordTransform:
    """The flow's chain as Spark SQL: ``keep`` is true for a record to copy; ``headers`` is
    the headers to write (``"headers"``: unchanged)."""

    keep: str
    headers: str = "headers"
    description: str = ""
    key: str = "key"  # the key to write (BINARY)
    value: str = "value"  # the value to write (BINARY)

    @property
    def changes_headers(self) -> bool:
        """Whether the copies' headers differ from the source records'."""
        return self.headers != "headers"

    @property
    def changes_record(self) -> bool:
        """Whether the copies' keys or values differ from the source records'."""
        return (self.key, self.value) != ("key", "value")


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (the parser unescapes backslashes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _list(value: str) -> list[str]:
    """A Connect LIST value: comma-separated, trimmed, empty items dropped."""
    return [item.strip() for item in value.split(",") if item.strip()]


def transform_kind(value: str) -> str | None:
    """The simple name of a transform class mirrorflow honours (:data:`TRANSFORMS`), if it is
    one."""
    return _kind(value, TRANSFORMS)


def _kind(value: str, known: tuple[str, ...]) -> str | None:
    """The simple name of a Connect plugin class (its full name or its alias), if known."""
    name = value.strip()
    for simple in known:
        full = _PACKAGE + ("predicates." if simple in PREDICATES else "") + simple
        if name in (full, simple):
            return simple
    return None


def _require(config: Mapping[str, str], key: str, what: str) -> str:
    value = config.get(key, "").strip()
    if not value:
        raise TransformError(key, f"missing: {what}", f"set {key}")
    return value


def _predicate(config: Mapping[str, str], alias: str, headers: str) -> str:
    prefix = f"predicates.{alias}."
    declared = _list(config.get("predicates", ""))
    if alias not in declared:
        raise TransformError(
            "predicates",
            f"predicate {alias!r} is used but not listed",
            f"add {alias} to predicates",
        )
    kind_value = _require(config, prefix + "type", "the predicate's class")
    kind = _kind(kind_value, PREDICATES)
    if kind is None:
        raise TransformError(
            prefix + "type",
            f"predicate {kind_value} is not one mirrorflow honours ({', '.join(PREDICATES)})",
            "use one of those, or a record.filter (Spark SQL)",
        )
    if kind == "TopicNameMatches":
        pattern = _require(config, prefix + "pattern", "a Java regex of topic names")
        try:
            compile_java_regex(pattern)
        except (JavaRegexError, re.error) as exc:
            raise TransformError(prefix + "pattern", f"not a Java regex: {exc}", "fix it") from None
        # Java's Pattern.matches (full match), evaluated by Spark's RLIKE (java.util.regex)
        full = sql_string("\\A(?:" + pattern + ")\\z")
        return f"(remote_topic RLIKE {full})"
    if kind == "HasHeaderKey":
        name = _require(config, prefix + "name", "a header name")
        return f"coalesce(exists({headers}, h -> h.key = {sql_string(name)}), false)"
    return "(value IS NULL)"


def heartbeats_predicate(policy: ReplicationPolicy) -> str:
    """Spark SQL that is true for a heartbeats topic (its own or a copy, on the source) under
    ``policy``: MirrorMaker 2's ``isHeartbeatsTopic`` for its two policies (a custom policy's
    own heartbeats topic only)."""
    name = policy.heartbeats_topic()
    own = f"(topic = {sql_string(name)})"
    if isinstance(policy, DefaultReplicationPolicy):
        return f"({own} OR endswith(topic, {sql_string(policy.separator + name)}))"
    return own


def compile_transforms(
    config: Mapping[str, str],
    record_filter: str = "",
    provenance: tuple[str, str] | None = None,
    heartbeats: str = "false",
    projection: Mapping[str, str] | None = None,
) -> RecordTransform | None:
    """The chain of a flow's connector config (MirrorMaker 2's ``transforms``, ``predicates``
    and their ``transforms.<alias>.*`` / ``predicates.<alias>.*`` keys, as the flow's
    connector sees them) plus ``record_filter`` and, with ``provenance`` (the flow's source and
    target aliases), the provenance header (:data:`ORIGIN_HEADER`); None when the flow copies
    records unchanged. ``heartbeats`` (:func:`heartbeats_predicate`) tells the heartbeats
    topics, which ``record_filter`` never drops and ``projection`` (``{"key": sql, "value":
    sql}``, mirrorflow's ``record.key`` / ``record.value``) never rewrites. Raises
    :class:`TransformError` for what cannot be honoured."""
    aliases = _list(config.get("transforms", ""))
    duplicates = sorted({a for a in aliases if aliases.count(a) > 1})
    if duplicates:
        raise TransformError(
            "transforms", f"duplicate alias {duplicates[0]!r}", "list each transform once"
        )
    predicates = _list(config.get("predicates", ""))
    if len(set(predicates)) != len(predicates):
        raise TransformError("predicates", "duplicate alias", "list each predicate once")
    keep: list[str] = []
    headers = "headers"
    steps: list[str] = []
    for alias in aliases:
        prefix = f"transforms.{alias}."
        kind_value = _require(config, prefix + "type", "the transform's class")
        kind = _kind(kind_value, TRANSFORMS)
        if kind is None:
            raise TransformError(
                prefix + "type",
                f"transform {kind_value} cannot work on MirrorMaker 2's raw bytes or is not one "
                f"mirrorflow honours ({', '.join(TRANSFORMS)})",
                "use one of those, or a record.filter (Spark SQL)",
            )
        negate = config.get(prefix + "negate", "false").strip().lower()
        if negate not in ("true", "false"):
            raise TransformError(prefix + "negate", f"{negate!r} is not a boolean", "true or false")
        applies = "true"
        predicate_alias = config.get(prefix + "predicate", "").strip()
        if predicate_alias:
            test = _predicate(config, predicate_alias, headers)
            applies = f"(NOT {test})" if negate == "true" else test  # tests are never null
        elif negate == "true":
            raise TransformError(
                prefix + "negate", "negate without a predicate", f"set {prefix}predicate"
            )
        if kind == "Filter":
            keep.append(f"NOT {applies}" if predicate_alias else "false")
            steps.append(f"{alias}: drop when {predicate_alias or 'always'}")
            continue
        base = _NO_NULL_HEADERS if headers == "headers" else headers
        if kind == "DropHeaders":
            names = _list(_require(config, prefix + "headers", "the header names to drop"))
            listed = ", ".join(sql_string(n) for n in names)
            changed = f"filter({base}, h -> NOT array_contains(array({listed}), h.key))"
            steps.append(f"{alias}: drop headers {', '.join(names)}")
        else:  # InsertHeader
            name = _require(config, prefix + "header", "the header's name")
            if prefix + "value.literal" not in config:
                raise TransformError(
                    prefix + "value.literal", "missing: the header's value", "set it"
                )
            literal = _hex(config[prefix + "value.literal"])
            added = f"array(named_struct('key', {sql_string(name)}, 'value', {literal}))"
            changed = f"concat({base}, {added})"
            steps.append(f"{alias}: add header {name}")
        headers = changed if applies == "true" else f"IF({applies}, {changed}, {headers})"
    used = {config.get(f"transforms.{a}.predicate", "").strip() for a in aliases}
    for alias in predicates:
        if alias not in used:
            # Connect validates every listed predicate; an unused one is only a mistake.
            _predicate(config, alias, "headers")
    text = record_filter.strip()
    if text:
        keep.append(f"coalesce(({text}), false) OR {heartbeats}")
        steps.append(f"{RECORD_FILTER}: {text}")
    if provenance is not None:
        source, target = provenance
        keep.insert(0, _not_from(target))
        headers = _with_origin(headers, source)
        steps.append(f"{PROVENANCE}: drop records from {target}, mark the others")
    rewritten = {}
    for column, text in sorted((projection or {}).items()):
        if text.strip():
            # a STRING becomes its UTF-8 bytes; the heartbeats topics keep their records
            rewritten[column] = f"IF({heartbeats}, {column}, CAST(({text.strip()}) AS BINARY))"
            steps.append(f"record.{column}: {text.strip()}")
    if not keep and headers == "headers" and not rewritten:
        return None
    return RecordTransform(
        keep=" AND ".join(f"({k})" for k in keep) or "true",
        headers=headers,
        description="; ".join(steps),
        **rewritten,
    )
