"""Replication policies: how remote topics are named and recognised, as MirrorMaker 2 does it.

A port of ``org.apache.kafka.connect.mirror.ReplicationPolicy`` and its two implementations from
the MirrorMaker 2 release mirrorflow pins (see ``mirrorflow/mm2/data/mm2_config_defs.json``):

* :class:`DefaultReplicationPolicy` names a remote topic ``<source><separator><topic>`` and finds
  the source of a topic with Java's ``String.split`` semantics (trailing empty parts dropped, a
  leading empty part kept), so ``"A."`` is not remote, ``".x"`` comes from ``""`` and ``"A..b"``
  from ``"A"``. Internal topics use the separator too unless
  ``replication.policy.internal.topic.separator.enabled=false``, which MM2 only reads when a
  separator is configured explicitly.
* :class:`IdentityReplicationPolicy` keeps topic names, except heartbeats topics (any name ending
  in ``heartbeats``), which stay prefixed; every other topic's source is the configured
  ``source.cluster.alias``, so it cannot detect cycles.

``replication.policy.class`` names either MM2's Java class (selecting the port here) or a Python
class by dotted path (``package.module.Class``) that subclasses :class:`ReplicationPolicy`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TypeVar

from mirrorflow.errors import MirrorflowError

SEPARATOR = "replication.policy.separator"
INTERNAL_SEPARATOR_ENABLED = "replication.policy.internal.topic.separator.enabled"
SOURCE_CLUSTER_ALIAS = "source.cluster.alias"
HEARTBEATS_TOPIC = "heartbeats"

T = TypeVar("T")


class ReplicationPolicy:
    """Naming rules for remote topics; subclasses implement the first three methods.

    ``configure`` receives the flow's connector configuration (raw strings), as MM2 passes the
    connector's originals to a ``Configurable`` policy.
    """

    def configure(self, config: Mapping[str, str]) -> None:
        """Read settings from the flow's connector configuration (default: none)."""

    def format_remote_topic(self, source_alias: str, topic: str) -> str:
        raise NotImplementedError

    def topic_source(self, topic: str) -> str | None:
        """The alias of the cluster ``topic`` was replicated from, or None if it is not remote."""
        raise NotImplementedError

    def upstream_topic(self, topic: str) -> str | None:
        """The topic's name one hop upstream, or None if it is not remote."""
        raise NotImplementedError

    def original_topic(self, topic: str) -> str:
        """The topic's name on the cluster where it was first produced (following every hop)."""
        upstream = self.upstream_topic(topic)
        if upstream is None or upstream == topic:
            return topic
        return self.original_topic(upstream)

    def heartbeats_topic(self) -> str:
        return HEARTBEATS_TOPIC

    def offset_syncs_topic(self, alias: str) -> str:
        return f"mm2-offset-syncs.{alias}.internal"

    def checkpoints_topic(self, alias: str) -> str:
        return f"{alias}.checkpoints.internal"

    def is_heartbeats_topic(self, topic: str) -> bool:
        return self.heartbeats_topic() == self.original_topic(topic)

    def is_checkpoints_topic(self, topic: str) -> bool:
        return topic.endswith(".checkpoints.internal")

    def is_mm2_internal_topic(self, topic: str) -> bool:
        return (topic.startswith("mm2") and topic.endswith(".internal")) or (
            self.is_checkpoints_topic(topic)
        )

    def is_internal_topic(self, topic: str) -> bool:
        """Topics MM2 never replicates: its own internal topics and ``__x`` / ``.x`` topics."""
        return self.is_mm2_internal_topic(topic) or topic.startswith("__") or topic.startswith(".")


class DefaultReplicationPolicy(ReplicationPolicy):
    """``<source><separator><topic>``; the separator defaults to ``.``."""

    def __init__(self) -> None:
        self.separator = "."
        self.internal_separator_enabled = True

    def configure(self, config: Mapping[str, str]) -> None:
        if SEPARATOR in config:
            self.separator = config[SEPARATOR]
            if INTERNAL_SEPARATOR_ENABLED in config:
                # Boolean.parseBoolean: "true" in any case, nothing trimmed.
                enabled = config[INTERNAL_SEPARATOR_ENABLED]
                self.internal_separator_enabled = enabled.lower() == "true"

    def format_remote_topic(self, source_alias: str, topic: str) -> str:
        return source_alias + self.separator + topic

    def topic_source(self, topic: str) -> str | None:
        parts = _java_split(topic, self.separator)
        return parts[0] if len(parts) >= 2 else None

    def upstream_topic(self, topic: str) -> str | None:
        source = self.topic_source(topic)
        if source is None:
            return None
        return topic[len(source) + len(self.separator) :]

    @property
    def _internal_separator(self) -> str:
        return self.separator if self.internal_separator_enabled else "."

    def offset_syncs_topic(self, alias: str) -> str:
        sep = self._internal_separator
        return f"mm2-offset-syncs{sep}{alias}{sep}internal"

    def checkpoints_topic(self, alias: str) -> str:
        return alias + self._checkpoints_suffix

    def is_checkpoints_topic(self, topic: str) -> bool:
        return topic.endswith(self._checkpoints_suffix)

    def is_mm2_internal_topic(self, topic: str) -> bool:
        internal_suffix = self._internal_separator + "internal"
        return (topic.startswith("mm2") and topic.endswith(internal_suffix)) or (
            self.is_checkpoints_topic(topic)
        )

    @property
    def _checkpoints_suffix(self) -> str:
        sep = self._internal_separator
        return f"{sep}checkpoints{sep}internal"


class IdentityReplicationPolicy(DefaultReplicationPolicy):
    """Remote topics keep their names (heartbeats topics excepted); cycles go undetected."""

    def __init__(self) -> None:
        super().__init__()
        self.source_alias: str | None = None

    def configure(self, config: Mapping[str, str]) -> None:
        super().configure(config)
        if SOURCE_CLUSTER_ALIAS in config:
            self.source_alias = config[SOURCE_CLUSTER_ALIAS]

    def _looks_like_heartbeat(self, topic: str) -> bool:
        return topic.endswith(self.heartbeats_topic())

    def format_remote_topic(self, source_alias: str, topic: str) -> str:
        if self._looks_like_heartbeat(topic):
            return super().format_remote_topic(source_alias, topic)
        return topic

    def topic_source(self, topic: str) -> str | None:
        if self._looks_like_heartbeat(topic):
            return super().topic_source(topic)
        return self.source_alias

    def upstream_topic(self, topic: str) -> str | None:
        if self._looks_like_heartbeat(topic):
            return super().upstream_topic(topic)
        return topic


_JAVA_PACKAGE = "org.apache.kafka.connect.mirror."
BUILTIN_POLICIES: dict[str, type[ReplicationPolicy]] = {
    _JAVA_PACKAGE + "DefaultReplicationPolicy": DefaultReplicationPolicy,
    _JAVA_PACKAGE + "IdentityReplicationPolicy": IdentityReplicationPolicy,
}


def load_policy(class_name: str, config: Mapping[str, str]) -> ReplicationPolicy:
    """The policy ``replication.policy.class`` names, configured with the flow's config."""
    cls = load_class(class_name, BUILTIN_POLICIES, ReplicationPolicy, "replication.policy.class")
    policy = cls()
    policy.configure(config)
    return policy


def load_class(name: str, builtins: Mapping[str, type[T]], base: type[T], key: str) -> type[T]:
    """A class named by a setting: one of MM2's Java classes ported here, or a Python dotted path.

    Shared by every pluggable setting (policies, filters); the error names the ``key``.
    """
    if name in builtins:
        return builtins[name]
    module_name, _, attr = name.rpartition(".")
    cls = None
    if module_name:
        try:
            cls = getattr(importlib.import_module(module_name), attr, None)
        except ImportError:
            cls = None
    if isinstance(cls, type) and issubclass(cls, base):
        return cls
    known = ", ".join(sorted(builtins))
    if name.startswith(("org.", "com.", "io.")) and cls is None:
        problem = f"{key} = {name} is a Java class mirrorflow cannot run"
    else:
        problem = f"{key} = {name} is not an importable subclass of {base.__qualname__}"
    raise MirrorflowError(
        problem,
        f"use one of MirrorMaker 2's built-ins ({known}) or a Python class by dotted path "
        f"(package.module.Class) that subclasses mirrorflow's {base.__qualname__}",
    )


def _java_split(text: str, separator: str) -> list[str]:
    """``Pattern.compile(Pattern.quote(separator)).split(text)``: trailing empty parts dropped."""
    parts = list(text) if separator == "" else text.split(separator)
    while parts and parts[-1] == "":
        parts.pop()
    return parts
