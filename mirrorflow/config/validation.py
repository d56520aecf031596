"""Whole-topology validation: every problem found before anything runs, one line each (each
definition here, the topology as a whole in :mod:`mirrorflow.config.topology_checks`).

A finding names the file and line, the key, what MirrorMaker 2 would do with it, and a fix.
Errors are configurations MM2 rejects, misreads or runs into harm (a missing ``clusters``, a
typo in an alias, a value with a trailing ``# comment``, an invalid regex, the identity policy on
a cycle of flows, conflicting definitions across files); warnings are keys MM2 ignores or
handles surprisingly (unknown keys, keys at a level where they have no effect, legacy aliases).
"""

from __future__ import annotations

import functools
import re
from difflib import SequenceMatcher

from mirrorflow.config import flowfiles
from mirrorflow.config import topology_checks as checks
from mirrorflow.config.findings import TRAILING_COMMENT, Finding, Severity, at
from mirrorflow.config.properties import Property
from mirrorflow.config.topology import (
    MIRRORFLOW_DEFAULT,
    MIRRORFLOW_DEFAULTS,
    Topology,
    closest,
)
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs, filters, policy

EXIT_OK, EXIT_WARNINGS, EXIT_ERRORS = 0, 1, 2

_ESCAPE = re.compile(r"\\(.)", re.S)  # scanned left to right, so "\\\\" is one escape
_KNOWN_ESCAPES = set("tnrfu\\:=#! \t\r\n\f")  # the rest lose their backslash
_HOST_PORT = re.compile(r".*?\[?([0-9a-zA-Z\-%._:]*)\]?:([0-9]+)")  # ClientUtils.HOST_PORT
_PATTERN_KEYS = (
    "topics",
    "topics.exclude",
    "groups",
    "groups.exclude",
    "config.properties.exclude",
)
_CLASS_KEYS = (
    "replication.policy.class", "topic.filter.class", "group.filter.class",
    "config.property.filter.class",
)  # fmt: skip
_RAW_BOOLEANS = ("enabled", "emit.heartbeats.enabled")  # also read with Boolean.parseBoolean
_MISNOMERS = {"sync.topic.configs.exclude": "config.properties.exclude"}
_ROLE_PREFIXES = {
    f"{side}{role}.": role
    for side in ("", "source.", "target.")
    for role in configdefs.CLIENT_ROLES
}


def exit_code(findings: list[Finding]) -> int:
    """0 without findings, 1 with warnings only, 2 with any error."""
    if any(f.severity == "error" for f in findings):
        return EXIT_ERRORS
    return EXIT_WARNINGS if findings else EXIT_OK


def validate(topology: Topology) -> list[Finding]:
    """Every finding for the topology, in file and line order."""
    findings: list[Finding] = []
    findings += checks.cluster_list(topology)
    findings += checks.duplicates(topology)
    aliases = checks.intended_aliases(topology)
    for prop in topology.props.values():
        findings += _definition(prop, aliases)
    findings += checks.bootstrap_servers(topology)
    findings += checks.identity_cycles(topology)
    findings += checks.flow_transforms(topology)
    findings += checks.config_providers(topology)
    findings += checks.worker_overrides(topology)
    order = {f: i for i, f in enumerate(topology.files)}
    return sorted(findings, key=lambda f: (order.get(f.location.file, 0), f.location.line))


def notes(topology: Topology) -> list[str]:
    """What the flows that replicate do differently from MirrorMaker 2's defaults, a line per
    behaviour (``validate`` prints them before its summary): whether aborted transactions reach
    the target, and how often new topics are looked for where mirrorflow's default applies."""
    committed: list[str] = []
    uncommitted: list[str] = []
    for flow in topology.flows:
        (uncommitted if flow.copies_aborted_transactions else committed).append(flow.name)
    refresh = "refresh.topics.interval.seconds"
    sooner = [
        f.name for f in topology.flows if f.config[refresh].layer.startswith(MIRRORFLOW_DEFAULT)
    ]
    paced = [
        f.name
        for f in topology.flows
        if "transaction.boundary" not in f.originals
        and (p := topology.cluster(f.target).props.get("exactly.once.source.support")) is not None
        and p.value.strip().lower() == "enabled"
    ]
    lines = []
    if paced:
        lines.append(
            f"exactly-once flows commit at most every {DEFAULT_TRANSACTION_INTERVAL_MS} ms once "
            "caught up (mirrorflow's default; MirrorMaker 2's transaction.boundary: poll, a "
            f"transaction per batch): {', '.join(paced)}"
        )
    if sooner:
        lines.append(
            f"new topics and partitions are looked for every {MIRRORFLOW_DEFAULTS[refresh]} s "
            f"(mirrorflow's default {refresh}; MirrorMaker 2's: "
            f"{configdefs.flow_settings()[refresh].default}): {', '.join(sooner)}"
        )
    if committed:
        lines.append(
            "aborted transactions are not copied (the source is read read_committed, "
            "mirrorflow's default; MirrorMaker 2 copies them as data, as "
            f"consumer.isolation.level = read_uncommitted does): {', '.join(committed)}"
        )
    if uncommitted:
        lines.append(
            "aborted transactions are copied as data, as MirrorMaker 2 does "
            f"(consumer.isolation.level = read_uncommitted): {', '.join(uncommitted)}"
        )
    return lines


def require_valid(topology: Topology, consequence: str) -> list[Finding]:
    """The topology's warnings; a :class:`MirrorflowError` listing its errors if it has any.

    ``consequence`` says what does not happen because of them (``"so no DAG is rendered"``).
    Every command that acts on clusters calls this first, so a file ``validate`` rejects never
    starts a job, a sync or a commit.
    """
    findings = validate(topology)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        listed = "; ".join(str(f) for f in errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise MirrorflowError(
            f"the flow files have {len(errors)} validation error(s), {consequence}: {listed}{more}",
            "fix them (`mirrorflow validate` lists every finding) and try again",
        )
    return findings


def _definition(prop: Property, aliases: list[str]) -> list[Finding]:
    """Findings for one effective definition: its key, then its value. ``aliases`` are the
    listed clusters (or, when ``clusters`` is missing, those the keys use)."""
    if prop.key == "clusters":
        return _value(prop, None)
    if prop.key == "":
        problem = f"no key before the value {prop.value!r} (the line starts with = or :)"
        return [at(prop, "error", problem + ": MM2 ignores it", "write the key before the value")]
    section, owner, rest = flowfiles.classify(prop.key, aliases)
    if section == "flows":
        source, target = owner.split("->")
        if source == target:
            return [at(prop, "error", "a flow from a cluster to itself: MM2 never runs it",
                        "remove the key")]  # fmt: skip
        return (
            _flow_key(prop, rest)
            + _value(prop, rest, raw_booleans=True)
            + _not_honoured(prop, rest)
        )
    if section == "clusters":
        return _cluster_key(prop, owner, rest) + _value(prop, None) + _not_honoured(prop, rest)
    raw_boolean = prop.key == "emit.heartbeats.enabled"
    return (
        _top_level_key(prop, aliases)
        + _value(prop, prop.key, raw_booleans=raw_boolean)
        + _not_honoured(prop, prop.key)
    )


NOT_HONOURED: dict[str, str] = {
    "use.incremental.alter.configs": "MirrorMaker 2 4.x removed it; mirrorflow always syncs "
    "topic configs by incremental alter, as 4.x does",
    "tasks.max": "mirrorflow copies each source partition as a Spark task: size it with the "
    "Spark master's cores",
}
"""MirrorMaker 2 settings mirrorflow accepts but does not (yet) act on, with what it does."""
_NOT_HONOURED_PREFIXES = {
    ("errors.",): "mirrorflow stops a flow at a record it cannot copy: no Connect error handling",
    ("key.converter", "value.converter", "header.converter"): "mirrorflow copies bytes as "
    "MirrorMaker 2's default ByteArrayConverter does",
}


HONOURED_WORKER_SETTINGS = frozenset(
    {
        "exactly.once.source.support",  # exactly once
        "offset.flush.interval.ms",  # how often positions and held-back syncs are written
        "offset.storage.partitions",  # the positions' topic, mm2-offsets.<source>.internal
        "offset.storage.replication.factor",
        "task.shutdown.graceful.timeout.ms",  # how long a stream's end waits for its copies
    }
)
"""The Connect worker settings mirrorflow acts on, where MirrorMaker 2 reads them: ``<target>.``,
or top level for those :data:`~mirrorflow.mm2.configdefs.WORKER_TOP_LEVEL_PREFIXES` names."""
_WORKER_NOT_HONOURED = (
    "a Connect worker setting, and mirrorflow runs no Connect worker: it keeps positions in "
    "mm2-offsets.<source>.internal on the target (as MirrorMaker 2's dedicated mode names "
    "them), creates remote topics itself and has no REST API"
)


@functools.cache
def _worker_only(name: str) -> bool:
    """Whether ``name`` is a Connect worker's setting and no client's nor MirrorMaker 2's."""
    return (
        name in configdefs.worker_names()
        and not any(name in configdefs.client_names(r) for r in configdefs.CLIENT_ROLES)
        and name not in configdefs.client_security_names()
        and name not in configdefs.mirrormaker_names()
    )


def _not_honoured(prop: Property, name: str) -> list[Finding]:
    """A warning for a setting mirrorflow does not act on, saying what it does instead."""
    reason = NOT_HONOURED.get(name) or next(
        (why for prefixes, why in _NOT_HONOURED_PREFIXES.items() if name.startswith(prefixes)),
        None,
    )
    if reason is None and _worker_only(name) and name not in HONOURED_WORKER_SETTINGS:
        reason = _WORKER_NOT_HONOURED
    if reason is None:
        return []
    return [
        at(
            prop,
            "warning",
            f"not honoured by mirrorflow: {reason}",
            "remove it, or keep it for MirrorMaker 2 knowing that mirrorflow ignores it",
        )
    ]


CONNECT_SOURCE_SETTINGS = ("transaction.boundary", "transaction.boundary.interval.ms")
"""Settings of Connect's source connectors that MirrorMaker 2 hands its connector from the flow's
keys (``S->T.<key>``; a top-level one it drops), which mirrorflow acts on in exactly-once mode:
when a caught-up flow commits (see :func:`mirrorflow.replication.spec.transaction_interval_ms`)."""
DEFAULT_TRANSACTION_INTERVAL_MS = 100
"""How often a caught-up exactly-once flow commits when ``transaction.boundary`` is unset (the
spec's default; MirrorMaker 2's is ``poll``: each batch)."""


def _connect_source_setting(prop: Property, rest: str) -> list[Finding]:
    value = prop.value.strip()
    if rest == "transaction.boundary":
        if value.lower() == "connector":
            return [at(prop, "error", "transaction.boundary = connector: MirrorMaker 2's "
                       "connector defines no transaction boundaries, and its worker refuses it",
                       "set poll or interval, or remove it")]  # fmt: skip
        if value.lower() not in ("poll", "interval"):
            return [at(prop, "error", f"{value!r} is not one of poll, interval, connector",
                       "set poll or interval, or remove it")]  # fmt: skip
    elif not value.isdigit():
        return [at(prop, "error", f"{value!r} is not a whole number of milliseconds >= 0",
                   "fix the value")]  # fmt: skip
    return []


def _flow_key(prop: Property, rest: str) -> list[Finding]:
    if rest in CONNECT_SOURCE_SETTINGS:
        return _connect_source_setting(prop, rest)
    if rest in configdefs.flow_settings() or rest in configdefs.REMOVED_IN_4:
        return _legacy(prop, rest)
    role = next((p for p in _ROLE_PREFIXES if rest.startswith(p)), None)
    if role and rest[len(role) :] in configdefs.client_names(_ROLE_PREFIXES[role]):
        return []
    if rest.startswith(("source.cluster.", "target.cluster.")):
        return []
    if rest.startswith(("transforms.", "predicates.")):
        return []  # a transform's or predicate's own settings: checked by _transforms
    candidates = [*configdefs.flow_settings(), *_role_keys("")]
    return [_unknown(prop, rest, candidates)]


def _cluster_key(prop: Property, alias: str, rest: str) -> list[Finding]:
    if _is_cluster_setting(rest):
        return []
    if rest in configdefs.flow_settings():
        return [
            at(
                prop,
                "warning",
                f"{rest} has no effect on a cluster: MM2 only passes cluster keys to clients "
                "and Connect workers",
                f"set `{rest}` (every flow) or `<source>->{alias}.{rest}` (one flow)",
            )
        ]
    candidates = [*configdefs.worker_names(), *configdefs.client_security_names(), *_role_keys("")]
    return [_unknown(prop, rest, candidates)]


def _is_cluster_setting(rest: str) -> bool:
    role = next((p for p in configdefs.CLIENT_ROLES if rest.startswith(p + ".")), None)
    if role:
        return rest[len(role) + 1 :] in configdefs.client_names(role)
    return (
        rest in configdefs.worker_names()
        or rest in configdefs.client_security_names()
        or rest in configdefs.mirrormaker_names()
        or rest.startswith(("key.converter.", "value.converter.", "header.converter."))
    )


def _role_keys(prefix: str) -> list[str]:
    return [f"{prefix}{r}.{n}" for r in configdefs.CLIENT_ROLES for n in configdefs.client_names(r)]


def _top_level_key(prop: Property, aliases: list[str]) -> list[Finding]:
    key = prop.key
    if key in configdefs.REMOVED_IN_4:
        return _legacy(prop, key)
    if key in configdefs.connector_settings():
        if key == "enabled" and configdefs.parse_boolean(configdefs.java_trim(prop.value)):
            return [
                at(
                    prop,
                    "warning",
                    "turns on every flow between the listed clusters (each pair has a "
                    "heartbeats herder, so each pair replicates)",
                    "enable flows one by one with `<source>-><target>.enabled = true`",
                )
            ]
        return _legacy(prop, key)
    if key in configdefs.MIRRORFLOW_ONLY:  # mirrorflow's own: every flow inherits it
        return []
    if key in configdefs.FILTER_ONLY:
        return [
            at(
                prop,
                "warning",
                "MM2 drops it at top level (no connector defines it)",
                f"set it per flow: `<source>-><target>.{key}`",
            )
        ]
    if (
        key in configdefs.mirrormaker_names()
        or key in configdefs.client_security_names()
        or key.startswith("config.providers")
        or (key.startswith(configdefs.WORKER_TOP_LEVEL_PREFIXES) and _is_cluster_setting(key))
    ):
        return []
    typo = _alias_typo(key, aliases)
    if typo:
        return [at(prop, *typo)]
    role = next((r for r in configdefs.CLIENT_ROLES if key.startswith(r + ".")), None)
    is_client_key = any(key in configdefs.client_names(r) for r in configdefs.CLIENT_ROLES)
    if role or is_client_key or _is_cluster_setting(key):
        where = f"<cluster>.{key}" if role else f"<cluster>.{key} or <cluster>.consumer.{key}"
        return [
            at(
                prop,
                "warning",
                "MM2 ignores this client or worker setting at top level",
                f"set it per cluster: `{where}` (or per flow: `<source>-><target>.{key}`)",
            )
        ]
    candidates = [*configdefs.connector_settings(), *configdefs.mirrormaker_names()]
    return [_unknown(prop, key, candidates)]


def _alias_typo(key: str, aliases: list[str]) -> tuple[Severity, str, str] | None:
    """For a key that belongs to no listed cluster: the alias it probably misspells."""
    source, arrow, rest = key.partition("->")
    if arrow and "." not in rest:
        return "error", "not a flow setting: MM2 ignores it", "write <source>-><target>.<setting>"
    if arrow:
        if source not in aliases:
            bad, tail = source, "->" + rest
        else:
            splits = [(rest[:i], rest[i:]) for i, ch in enumerate(rest) if ch == "."]
            bad, tail = max(splits or [(rest, "")], key=lambda s: _similarity(s[0], aliases))
        good = closest(bad, aliases)
        fixed = key.replace(bad + tail, good + tail, 1) if good else None
        problem = f"names the cluster {bad!r}, which is not in `clusters`: MM2 ignores the key"
        return "error", problem, f"write `{fixed}`" if fixed else f"add {bad} to `clusters`"
    for i, ch in enumerate(key):
        if ch == "." and _is_cluster_setting(key[i + 1 :]):
            prefix = key[:i]
            good = closest(prefix, aliases)
            if good:
                return (
                    "error",
                    f"names the cluster {prefix!r}, which is not in `clusters`: MM2 ignores it",
                    f"write `{good}{key[i:]}`",
                )
            return (
                "warning",
                f"configures the cluster {prefix!r}, which is not in `clusters`: MM2 ignores it",
                f"add {prefix} to `clusters` or remove the key",
            )
    return None


def _similarity(name: str, aliases: list[str]) -> float:
    folded = name.casefold()
    return max((SequenceMatcher(None, folded, a.casefold()).ratio() for a in aliases), default=0)


def _unknown(prop: Property, name: str, candidates: list[str]) -> Finding:
    suggestion = _MISNOMERS.get(name) or closest(name, candidates)
    fix = f"did you mean {suggestion}?" if suggestion else "remove it or check the MM2 docs"
    return at(prop, "warning", f"unknown key {name!r}: MirrorMaker 2 ignores it", fix)


def _legacy(prop: Property, name: str) -> list[Finding]:
    if name in configdefs.LEGACY_ALIASES:
        current = configdefs.LEGACY_ALIASES[name]
        return [
            at(
                prop,
                "warning",
                f"removed in MirrorMaker 2 4.0, which ignores it; mirrorflow still applies it as "
                f"{current} (3.x behaviour: {current} wins if both are set)",
                f"rename it to {prop.key.removesuffix(name)}{current}",
            )
        ]
    if name in configdefs.REMOVED_IN_4:
        return [
            at(
                prop,
                "warning",
                f"removed in MirrorMaker 2 4.0 ({configdefs.REMOVED_IN_4[name]}): it is ignored",
                "delete it",
            )
        ]
    return []


def _value(prop: Property, name: str | None, raw_booleans: bool = False) -> list[Finding]:
    """Findings about the value of ``prop``. ``name`` is its setting name (prefix stripped) when
    it is a flow setting whose type to check; ``raw_booleans`` when MM2 also reads ``enabled``
    and ``emit.heartbeats.enabled`` there with ``Boolean.parseBoolean``."""
    value = prop.value
    shown = configdefs.redact(prop.key, value)
    if not configdefs.is_sensitive(prop.key) and TRAILING_COMMENT.search(value):
        return [
            at(
                prop,
                "error",
                f"the value {shown!r} ends in a comment, but .properties files have no trailing "
                "comments: MM2 reads the comment as part of the value",
                "move the comment to a line of its own",
            )
        ]
    found = []
    if prop.location.file.endswith(".properties") and not (prop.key + value).isascii():
        found.append(
            at(
                prop,
                "warning",
                "non-ASCII text: MM2 reads properties files as ISO-8859-1, so UTF-8 arrives "
                "garbled",
                "write such characters as \\uXXXX escapes (mirrorflow convert does)",
            )
        )
    if raw_booleans and name in _RAW_BOOLEANS and value.lower() not in ("true", "false"):
        return [
            *found,
            at(
                prop,
                "error",
                f"{shown!r} is not exactly true or false: MM2 decides which flows run with "
                "Boolean.parseBoolean, which reads it as false",
                "write true or false, nothing else on the line",
            ),
        ]
    dropped = next(
        (m for m in _ESCAPE.finditer(prop.source or "") if m.group(1) not in _KNOWN_ESCAPES), None
    )
    if dropped:
        found.append(
            at(
                prop,
                "warning",
                f"the properties format drops the backslash of \\{dropped.group(1)}, so MM2 "
                f"reads {shown!r}",
                f"write \\\\{dropped.group(1)} to pass a backslash (e.g. a regex \\.)",
            )
        )
    if prop.key.endswith("bootstrap.servers"):
        found += _bootstrap_format(prop)
    if not name:
        return found
    definition = configdefs.flow_settings().get(name)
    if definition is None:
        return found
    try:
        parsed = configdefs.parse_value(definition.type, value)
    except configdefs.InvalidValue as exc:
        return [
            *found,
            at(prop, "error", f"{shown!r} is invalid ({exc}): MM2's connectors refuse to start",
                "correct the value"),
        ]  # fmt: skip
    # Each check below applies to settings of one type (the intervals, timeouts and health
    # bounds are whole numbers, the patterns lists, the classes names): isinstance() says so.
    if (
        name.endswith((".interval.seconds", ".timeout.ms"))
        and isinstance(parsed, int | float)
        and parsed <= 0
    ):
        found.append(_interval(prop, name, parsed))
    if name.startswith("health.") and isinstance(parsed, int | float) and parsed < 0:
        found.append(at(prop, "error", f"{name} is negative", "use 0 (no bound) or more"))
    if name == "health.stall.timeout.seconds" and parsed == 0:
        found.append(at(prop, "error", "zero: every flow would be STALLED at once",
                         "use a positive number of seconds (default 120)"))  # fmt: skip
    if (
        name == configdefs.MIRROR_APPLICATION
        and isinstance(parsed, str)
        and parsed
        and not configdefs.APPLICATION_NAME.fullmatch(parsed)
    ):
        found.append(at(prop, "error", f"{shown!r} cannot name a mirror DAG (mirror__<name>)",
                         "use letters, digits, '_', '.' and '-' only"))  # fmt: skip
    if (name in _PATTERN_KEYS or name in configdefs.LEGACY_ALIASES) and isinstance(parsed, list):
        try:
            filters.compile_pattern_list(parsed)
        except filters.JavaRegexError as exc:
            found.append(at(prop, "error", f"invalid pattern list {shown!r}: {exc}",
                             "fix the regular expression"))  # fmt: skip
    if name in _CLASS_KEYS and isinstance(parsed, str):
        try:
            if name == "replication.policy.class":
                policy.load_policy(parsed, {})
            else:
                filters.filter_class(name, parsed)
        except MirrorflowError as exc:
            found.append(at(prop, "error", exc.message, exc.hint or "name another class"))
    return found


def _interval(prop: Property, name: str, value: float) -> Finding:
    if value == 0:
        return at(prop, "error", "zero: MM2 would spin without pause or fail to schedule it",
                   "use a positive value")  # fmt: skip
    feature = name.removesuffix(".interval.seconds")
    if name.endswith(".interval.seconds"):
        fix = f"write `{prop.key.removesuffix(name)}{feature}.enabled = false` instead"
        return at(prop, "warning", "negative: MM2 silently never runs this task", fix)
    return at(prop, "error", "negative: every wait would time out at once", "use a positive value")


def _bootstrap_format(prop: Property) -> list[Finding]:
    if "${" in prop.value:
        return []
    bad = []
    for entry in configdefs.parse_list(prop.value):
        match = _HOST_PORT.fullmatch(entry)
        if not match or not match.group(1):
            bad.append(entry)
    if not bad:
        return []
    return [
        at(prop, "error", f"{', '.join(map(repr, bad))} is not host:port: clients refuse it",
            "list brokers as host:port, separated by commas")
    ]  # fmt: skip
