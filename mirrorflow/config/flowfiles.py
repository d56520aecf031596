"""Flow files: MirrorMaker 2 ``.properties`` and mirrorflow's YAML twin, read and written.

Both syntaxes hold the same flat MirrorMaker 2 keys; the YAML form only groups them::

    clusters:                      # clusters = primary, secondary
      primary:
        bootstrap.servers: broker1:9092        # primary.bootstrap.servers
        consumer:
          isolation.level: read_committed      # primary.consumer.isolation.level
      secondary:
        bootstrap.servers: broker2:9092
    flows:
      primary->secondary:
        enabled: true                          # primary->secondary.enabled
        topics: [orders, payments-.*]          # a list is written as "orders, payments-.*"
    settings:                                  # top-level keys, as written in properties
      replication.factor: 3

Nested mappings join their keys with ``.``; booleans become ``true``/``false``, lists are joined
with ``", "``. Each YAML definition keeps its line, as each properties definition does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import yaml

from mirrorflow.config import properties
from mirrorflow.config.properties import Location, Property
from mirrorflow.errors import MirrorflowError

YAML_SUFFIXES = (".yaml", ".yml")
SECTIONS = ("clusters", "flows", "settings")
_ROLE_PREFIXES = ("consumer.", "producer.", "admin.")


def read(path: Path) -> list[Property]:
    """Every definition in a flow file (YAML by suffix, else Java properties), in file order."""
    if path.suffix in YAML_SUFFIXES:
        return _read_yaml(path)
    return properties.load(path)


def classify(key: str, aliases: Iterable[str]) -> tuple[str, str, str]:
    """Where ``key`` belongs: ``("clusters", alias, rest)``, ``("flows", "S->T", rest)`` or
    ``("settings", "", key)``. The longest matching alias wins (aliases may contain dots)."""
    by_length = sorted(set(aliases), key=len, reverse=True)
    source, arrow, after = key.partition("->")
    if arrow and source in by_length:
        for target in by_length:
            if after.startswith(target + "."):
                return "flows", f"{source}->{target}", after[len(target) + 1 :]
    for alias in by_length:
        if key.startswith(alias + "."):
            return "clusters", alias, key[len(alias) + 1 :]
    return "settings", "", key


def to_yaml(definitions: list[Property], aliases: list[str]) -> str:
    """The YAML form of ``definitions`` (the last definition of a key wins, as in Java)."""
    doc: dict[str, dict] = {"clusters": {a: {} for a in aliases}, "flows": {}, "settings": {}}
    for key, value in _last_values(definitions).items():
        if key == "clusters":
            continue
        section, owner, rest = classify(key, aliases)
        entry = doc["settings"] if section == "settings" else doc[section].setdefault(owner, {})
        role = next((p for p in _ROLE_PREFIXES if rest.startswith(p)), None)
        if role and section != "settings":
            entry = entry.setdefault(role[:-1], {})
            rest = rest[len(role) :]
        entry[rest] = _yaml_scalar(value)
    doc = {name: section for name, section in doc.items() if section}
    # PyYAML writes NEL and the Unicode line and paragraph separators unescaped, and reads them
    # back as line breaks: where they occur, every non-ASCII character is escaped instead.
    breaks = any(c in text for d in definitions for text in (d.key, d.value) for c in _BREAKS)
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=not breaks)
    return _YAML_HEADER + body


_BREAKS = "\x85\u2028\u2029"
_YAML_HEADER = "# mirrorflow flow file: MirrorMaker 2 settings (see `mirrorflow convert --help`)\n"


def _yaml_scalar(value: str) -> str | bool | int:
    """Booleans and integers as YAML writes them when they read back as the same text."""
    if value in ("true", "false"):
        return value == "true"
    if re.fullmatch(r"-?[1-9][0-9]*|0", value):
        return int(value)
    return value


def to_properties(definitions: list[Property], aliases: list[str]) -> str:
    """The properties form of ``definitions``: clusters, then flows, then other settings."""
    groups: dict[str, list[str]] = {name: [] for name in SECTIONS}
    for key, value in _last_values(definitions).items():
        section = "clusters" if key == "clusters" else classify(key, aliases)[0]
        groups[section].append(properties.format_line(key, value))
    titles = {"clusters": "# Clusters", "flows": "# Flows", "settings": "# Top-level settings"}
    blocks = [[titles[name], *lines] for name, lines in groups.items() if lines]
    return "\n\n".join("\n".join(block) for block in blocks) + "\n"


def _last_values(definitions: list[Property]) -> dict[str, str]:
    return {d.key: d.value for d in definitions}


def _read_yaml(path: Path) -> list[Property]:
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise MirrorflowError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})",
            "save the YAML flow file as UTF-8",
        ) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = getattr(exc, "strerror", None) or str(exc)
        raise MirrorflowError(
            f"cannot read {path!s:.200}: {reason}", "check the path and its permissions"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line
        raise MirrorflowError(
            f"{where}: not valid YAML ({problem})",
            "fix the syntax (see the YAML form in `mirrorflow convert --help`)",
        ) from None
    if root is None:
        return []
    found: list[Property] = []
    for key_node, value_node in _mapping(root, path, "the document"):
        section = key_node.value
        here = _location(path, key_node)
        if section not in SECTIONS:
            raise MirrorflowError(
                f"{here}: unknown section {section!r}",
                f"a flow file has the sections {', '.join(SECTIONS)}",
            )
        if section == "settings":
            found += _flatten(value_node, "", path)
            continue
        owners = _mapping(value_node, path, section)
        if section == "clusters":
            found.append(Property("clusters", ", ".join(str(k.value) for k, _ in owners), here))
        for owner_node, settings_node in owners:
            found += _flatten(settings_node, f"{owner_node.value}.", path)
    return found


def _mapping(node: yaml.Node, path: Path, what: str) -> list[tuple[yaml.Node, yaml.Node]]:
    """The (key, value) nodes of a mapping; an empty value counts as an empty mapping."""
    if isinstance(node, yaml.ScalarNode) and _construct(node, path) is None:
        return []
    if not isinstance(node, yaml.MappingNode):
        raise MirrorflowError(f"{_location(path, node)}: {what} must be a mapping (key: value)")
    return node.value


def _flatten(node: yaml.Node, prefix: str, path: Path) -> list[Property]:
    """The definitions under a mapping node, keys joined with dots after ``prefix``."""
    found = []
    for key_node, value_node in _mapping(node, path, prefix.rstrip(".") or "settings"):
        key = f"{prefix}{key_node.value}"
        if isinstance(value_node, yaml.MappingNode):
            found += _flatten(value_node, key + ".", path)
        elif isinstance(value_node, yaml.SequenceNode):
            items = [_scalar(item, path) for item in value_node.value]
            found.append(Property(key, ", ".join(items), _location(path, key_node)))
        else:
            found.append(Property(key, _scalar(value_node, path), _location(path, key_node)))
    return found


def _scalar(node: yaml.Node, path: Path) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise MirrorflowError(f"{_location(path, node)}: expected a single value here")
    value = _construct(node, path)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _construct(node: yaml.ScalarNode, path: Path) -> object:
    """The value of a scalar node, typed as ``yaml.safe_load`` types it (an empty one is None)."""
    try:
        return yaml.SafeLoader("").construct_object(node)
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise MirrorflowError(
            f"{_location(path, node)}: not a valid YAML value ({problem})",
            "write the value as plain text, without a YAML tag",
        ) from None


def _location(path: Path, node: yaml.Node) -> Location:
    return Location(str(path), node.start_mark.line + 1)
