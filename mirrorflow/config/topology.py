"""The flow model: clusters and flows from MirrorMaker 2 configuration, layered exactly as MM2 does.

Flow files (properties or YAML, see :mod:`mirrorflow.config.flowfiles`) are merged in order, a later
definition of a key replacing an earlier one. From the merged keys, as ``MirrorMakerConfig`` does:

* ``clusterProps(C)``: every ``C.x`` key, then the client security keys (``bootstrap.servers``,
  ``security.protocol``, ``ssl.*``, ``sasl.*``) copied from ``C.k``, else the top-level ``k``, to
  ``producer.k``, ``consumer.k`` and ``admin.k`` (``C.consumer.k`` > ``C.k`` > top-level ``k``).
* A flow's connector configuration (``connectorBaseConfig``): top-level keys that are connector
  settings (so top-level ``consumer.*`` keys are dropped), ``config.providers*`` and
  ``replication.policy*``; both clusters' props under ``source.``/``target.`` (client roles) or
  ``source.cluster.``/``target.cluster.``; the aliases; then every ``S->T.x`` key, which wins;
  ``enabled`` is false unless set. Cluster keys such as ``A.topics`` therefore have no effect.
  MM2's defaults fill the rest, and the 3.x ``*.blacklist`` aliases apply when the new key is
  absent. Every value keeps the layer and file line it came from (``mirrorflow explain``).
* Flows that run (``clusterPairs``): a pair S->T of listed clusters has a herder if
  ``S->T.enabled`` or heartbeats (``emit.heartbeats.enabled``, default true) are on, read with
  ``Boolean.parseBoolean``; ``--clusters`` keeps pairs whose target is listed. A flow replicates
  when its herder exists and its connector's ``enabled`` is true.
* Clients: a flow's clients layer ``source.cluster.*`` security keys, ``consumer.*`` (or
  ``producer.*``, ``admin.*``) and ``source.consumer.*`` as MM2's connectors do; a cluster's own
  clients (``MirrorClientConfig``) use only security keys: ``C.admin.k`` > ``C.k`` > ``k``.
  Config-provider references are resolved only when a client configuration is built.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Literal

from mirrorflow.config import flowfiles, librdkafka
from mirrorflow.config.properties import Location, Property
from mirrorflow.config.providers import Providers
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs
from mirrorflow.mm2.filters import (
    ConfigPropertyFilter,
    GroupFilter,
    JavaRegexError,
    TopicFilter,
    load_config_property_filter,
    load_group_filter,
    load_topic_filter,
)
from mirrorflow.mm2.policy import ReplicationPolicy, load_policy

Role = Literal[
    "source.consumer",
    "source.producer",
    "source.admin",
    "target.consumer",
    "target.producer",
    "target.admin",
]
ClientRole = Literal["consumer", "producer", "admin"]
TOP_LEVEL = "top-level"
MM2_DEFAULT = "MM2 default"
IMPLICIT = "MM2 (implicit)"
#: The layer of the settings where mirrorflow's default differs from MirrorMaker 2's.
MIRRORFLOW_DEFAULT = "mirrorflow default"
#: The mirror's source consumer reads committed records only: MirrorMaker 2's consumer (Kafka's
#: default, read_uncommitted) copies the records of aborted transactions as ordinary data.
SOURCE_ISOLATION_DEFAULT = "read_committed"
#: Connector settings whose default mirrorflow changes: new topics and partitions (and other
#: flows' heartbeat topics) reach the target within 30 s instead of MirrorMaker 2's 600. A
#: refresh with nothing new costs one metadata request of the source.
MIRRORFLOW_DEFAULTS = {"refresh.topics.interval.seconds": "30"}
_CLIENT_KEY = re.compile(r"^(consumer|producer|admin)")  # MM2's "^consumer.*|^producer.*|…"
_WORKER_PREFIXES = ("config.providers", "replication.policy")
_STORE_LOCATIONS = frozenset({"ssl.truststore.location", "ssl.keystore.location"})


@dataclass(frozen=True)
class Setting:
    """An effective value and its provenance: the layer, the key as written, and where."""

    value: str
    layer: str
    source_key: str | None = None
    location: Location | None = None

    def describe(self) -> str:
        """``layer (file:line, as key)`` for explanations."""
        where = f"{self.location}" if self.location else ""
        written = f"as {self.source_key}" if self.source_key else ""
        detail = ", ".join(p for p in (where, written) if p)
        return f"{self.layer} ({detail})" if detail else self.layer


def _written(prop: Property, layer: str) -> Setting:
    return Setting(prop.value, layer, prop.key, prop.location)


class Cluster:
    """One cluster alias and the keys written for it (``alias.x``, with the prefix stripped)."""

    def __init__(self, topology: Topology, alias: str) -> None:
        self.topology = topology
        self.alias = alias

    def __repr__(self) -> str:
        return f"Cluster({self.alias!r})"

    @cached_property
    def props(self) -> dict[str, Setting]:
        """``MirrorMakerConfig.clusterProps``: cluster keys plus security keys for each role."""
        layer = f"cluster {self.alias}"
        prefix = self.alias + "."
        props = {
            key[len(prefix) :]: _written(p, layer)
            for key, p in self.topology.props.items()
            if key.startswith(prefix)
        }
        for key in sorted(configdefs.client_security_names()):
            if key in props:
                for role in configdefs.CLIENT_ROLES:
                    props.setdefault(f"{role}.{key}", props[key])
        for key in sorted(configdefs.client_security_names()):
            if key in self.topology.props:
                top = _written(self.topology.props[key], TOP_LEVEL)
                for role in configdefs.CLIENT_ROLES:
                    props.setdefault(f"{role}.{key}", top)
                props.setdefault(key, top)
        return props

    def client_settings(self, role: ClientRole) -> dict[str, Setting]:
        """``MirrorClientConfig``'s client settings with provenance: security keys only."""
        props = {k: _written(p, TOP_LEVEL) for k, p in self.topology.props.items()}
        props.update(self.props)
        chosen = {}
        for key in sorted(configdefs.client_security_names()):
            value = props.get(f"{role}.{key}", props.get(key))
            if value is not None:
                chosen[key] = value
        return chosen

    def client_config(self, role: ClientRole, *, librdkafka: bool = False) -> dict[str, str]:
        """Settings for a client of this cluster outside any flow (listing topics, reading
        checkpoints), secrets resolved; Java properties, or librdkafka's if asked."""
        return self.topology.build_client(
            self.client_settings(role), role, f"cluster {self.alias}, {role} client", librdkafka
        )


class Flow:
    """A replication flow S->T: its effective configuration and MM2's decisions for it."""

    def __init__(self, topology: Topology, source: str, target: str) -> None:
        self.topology = topology
        self.source = source
        self.target = target
        self.name = f"{source}->{target}"
        self._decisions: dict[str, str | None] = {}  # topic -> why_not_replicated's answer

    def __repr__(self) -> str:
        return f"Flow({self.name!r})"

    @cached_property
    def originals(self) -> dict[str, Setting]:
        """The connector configuration MM2 builds for this flow (``connectorBaseConfig``), which
        configures its policy, filters and clients; MM2's defaults are not in it."""
        top = self.topology.props
        config: dict[str, Setting] = {
            key: _written(p, TOP_LEVEL)
            for key, p in top.items()
            if key in configdefs.connector_settings()
            or key in configdefs.MIRRORFLOW_ONLY  # mirrorflow's own, for every flow alike
            or key.startswith(_WORKER_PREFIXES)
        }
        for side, alias in (("source", self.source), ("target", self.target)):
            for key, setting in self.topology.cluster(alias).props.items():
                infix = "." if _CLIENT_KEY.match(key) else ".cluster."
                config[side + infix + key] = setting
        config.setdefault("source.cluster.alias", Setting(self.source, IMPLICIT))
        config.setdefault("target.cluster.alias", Setting(self.target, IMPLICIT))
        prefix = self.name + "."
        layer = f"flow {self.name}"
        for key, p in top.items():
            if key.startswith(prefix):
                config[key[len(prefix) :]] = _written(p, layer)
        config.setdefault("enabled", Setting("false", IMPLICIT))
        for legacy, current in configdefs.LEGACY_ALIASES.items():
            if current not in config and legacy in config:
                old = config[legacy]
                config[current] = Setting(
                    old.value, old.layer + " (3.x alias)", old.source_key, old.location
                )
        return config

    @cached_property
    def config(self) -> dict[str, Setting]:
        """:attr:`originals` completed with MM2's defaults: every effective setting."""
        config = dict(self.originals)
        for name in configdefs.mirror_settings():
            default = configdefs.flow_settings()[name].default
            if name in MIRRORFLOW_DEFAULTS:
                layer = f"{MIRRORFLOW_DEFAULT} (MM2: {default})"
                config.setdefault(name, Setting(MIRRORFLOW_DEFAULTS[name], layer))
            elif default is not None:
                config.setdefault(name, Setting(default, MM2_DEFAULT))
        return config

    @cached_property
    def values(self) -> dict[str, str]:
        """:attr:`originals` as plain strings, as MM2 configures its plugins with them."""
        return {key: setting.value for key, setting in self.originals.items()}

    def setting(self, name: str) -> bool | int | float | list[str] | str:
        """A connector setting converted to its type (``bool``, ``int``, ``list[str]``, …)."""
        definition = configdefs.flow_settings().get(name)
        if definition is None:
            close = difflib.get_close_matches(name, configdefs.flow_settings(), 1)
            raise MirrorflowError(
                f"{name!r} is not a MirrorMaker 2 connector setting",
                f"did you mean {close[0]!r}?" if close else "see `mirrorflow explain`",
            )
        setting = self.config.get(name)
        if setting is None:
            raise MirrorflowError(f"flow {self.name}: {name} has no value and no default")
        try:
            return configdefs.parse_value(definition.type, setting.value)
        except configdefs.InvalidValue as exc:
            raise MirrorflowError(
                f"flow {self.name}: {name} = {configdefs.redact(name, setting.value)} is invalid "
                f"({exc}); it comes from {setting.describe()}",
                "fix the value there (`mirrorflow validate` lists every such problem)",
            ) from None

    def numeric_setting(self, name: str) -> float:
        """A SHORT, INT, LONG or DOUBLE setting, as :meth:`setting` converts it (an ``int`` for
        the whole-number types): typed for arithmetic. TypeError for a setting of another type,
        a mistake of the caller."""
        value = self.setting(name)
        if not isinstance(value, int | float):
            raise TypeError(f"{name} is not a numeric setting")
        return value

    def list_setting(self, name: str) -> list[str]:
        """A LIST setting, as :meth:`setting` converts it. TypeError for a setting of another
        type, a mistake of the caller."""
        value = self.setting(name)
        if not isinstance(value, list):
            raise TypeError(f"{name} is not a list setting")
        return value

    @property
    def mirror_application(self) -> str:
        """The name of the Spark application (and mirror DAG) that runs this flow: its
        ``mirror.application``, else its target alias (one application per target site)."""
        return str(self.setting(configdefs.MIRROR_APPLICATION)) or self.target

    def interval(self, feature: str) -> timedelta | None:
        """How often a periodic task runs (``emit.checkpoints``, ``refresh.topics``, …), or None
        when ``<feature>.enabled`` is false: MM2's negative interval, which never runs."""
        if not self.setting(f"{feature}.enabled"):
            return None
        seconds = self.numeric_setting(f"{feature}.interval.seconds")
        return None if seconds < 0 else timedelta(seconds=seconds)

    @cached_property
    def enabled(self) -> bool:
        """Whether MM2 replicates this flow: it has a herder and its connector is enabled."""
        if self.name not in self.topology.herder_pairs:
            return False
        try:
            return bool(self.setting("enabled"))
        except MirrorflowError:
            return False  # MM2's connector fails to start; validation reports it

    @cached_property
    def policy(self) -> ReplicationPolicy:
        class_name = configdefs.java_trim(self.config["replication.policy.class"].value)
        return load_policy(class_name, self.values)

    @cached_property
    def topic_filter(self) -> TopicFilter:
        return self._load_filter(load_topic_filter)

    @cached_property
    def group_filter(self) -> GroupFilter:
        return self._load_filter(load_group_filter)

    @cached_property
    def config_property_filter(self) -> ConfigPropertyFilter:
        return self._load_filter(load_config_property_filter)

    def _load_filter(self, loader):
        try:
            return loader(self.values)
        except JavaRegexError as exc:
            raise MirrorflowError(
                f"flow {self.name}: {exc}", "see `mirrorflow validate` for the line"
            ) from None

    def remote_topic(self, topic: str) -> str:
        """The name ``topic`` gets on the target."""
        return self.policy.format_remote_topic(self.source, topic)

    def checkpoint_topic(self, topic: str) -> str:
        """The target's name for a source topic a group consumed (MirrorMaker 2's
        ``renameTopicPartition``): the original name if the topic came from the target, else
        its remote name."""
        if self.policy.topic_source(topic) == self.target:
            return self.policy.original_topic(topic)
        return self.remote_topic(topic)

    def reverse_remote_topic(self, topic: str) -> str | None:
        """The name on this flow's source of the copy of the target's ``topic`` (the opposite
        flow's remote topic), or None when the policy would not trace it back to the target."""
        remote = self.policy.format_remote_topic(self.target, topic)
        return remote if self.policy.topic_source(remote) == self.target else None

    def is_cycle(self, topic: str) -> bool:
        """MM2's ``isCycle``: the topic, or a topic it was copied from, came from the target."""
        source = self.policy.topic_source(topic)
        if source is None:
            return False
        if source == self.target:
            return True
        upstream = self.policy.upstream_topic(topic)
        if upstream is None or upstream == topic:
            return False
        return self.is_cycle(upstream)

    def why_not_replicated(self, topic: str) -> str | None:
        """None if MM2 replicates ``topic`` in this flow, else the reason, naming the rule.

        Decided once per topic name when the policy and the topic filter are MirrorMaker 2's
        (ported here: their answers depend on the name and the flow's configuration only); a
        job asks for every topic of its source at each refresh, its positions at each report
        and its heartbeats at each beat (hundreds of heartbeat topics in a mesh). A plugged-in
        Python class is asked every time, as MirrorMaker 2 asks its classes."""
        if topic in self._decisions:
            return self._decisions[topic]
        reason = self._why_not_replicated(topic)
        if self._decisions_fixed:
            self._decisions[topic] = reason
        return reason

    @cached_property
    def _decisions_fixed(self) -> bool:
        return all(
            type(plugin).__module__.startswith("mirrorflow.")
            for plugin in (self.policy, self.topic_filter)
        )

    def _why_not_replicated(self, topic: str) -> str | None:
        heartbeats = self.setting("heartbeats.replication.enabled") and (
            self.policy.is_heartbeats_topic(topic)
        )
        if self.policy.is_internal_topic(topic):
            return "internal topic (never replicated)"
        if self.is_cycle(topic):
            return f"cycle: it already came from {self.target}"
        if heartbeats:
            return None
        return self.topic_filter.why_not(topic)

    def should_replicate_topic(self, topic: str) -> bool:
        """``(filter || heartbeats topic) && !internal && !cycle``, as MirrorSourceConnector."""
        return self.why_not_replicated(topic) is None

    def should_replicate_group(self, group: str) -> bool:
        return self.group_filter.should_replicate_group(group)

    def client_settings(self, role: Role) -> dict[str, Setting]:
        """A client's settings with provenance, layered as MM2's connectors layer them."""
        side, kind = role.split(".")
        cluster_prefix = f"{side}.cluster."
        chosen = {
            key[len(cluster_prefix) :]: s
            for key, s in self.originals.items()
            if key.startswith(cluster_prefix)
            and key[len(cluster_prefix) :] in configdefs.client_security_names()
        }
        for prefix in (f"{kind}.", f"{role}."):
            chosen.update(
                {k[len(prefix) :]: s for k, s in self.originals.items() if k.startswith(prefix)}
            )
        if kind == "consumer":
            chosen["enable.auto.commit"] = Setting("false", IMPLICIT)
            chosen.setdefault("auto.offset.reset", Setting("earliest", IMPLICIT))
        if role == "source.consumer":
            chosen.setdefault(
                "isolation.level",
                Setting(SOURCE_ISOLATION_DEFAULT, f"{MIRRORFLOW_DEFAULT} (MM2: read_uncommitted)"),
            )
        return chosen

    @property
    def copies_aborted_transactions(self) -> bool:
        """Whether the flow copies aborted transactions' records as data (its source consumer
        reads ``read_uncommitted``, as MirrorMaker 2's does by default)."""
        level = self.client_settings("source.consumer")["isolation.level"].value
        return level.strip().lower() != "read_committed"

    def client_config(
        self, role: Role, *, librdkafka: bool = False, label: str | None = None
    ) -> dict[str, str]:
        """Settings for one of this flow's clients, secrets resolved: Java properties (for
        Spark's Kafka connector), or librdkafka's (for confluent-kafka) if asked. With a
        ``label``, ``client.id`` gets ``|S->T|label`` appended, as MM2 names its clients."""
        settings = dict(self.client_settings(role))
        if label:
            own = settings.get("client.id")
            suffix = f"{self.name}|{label}"
            settings["client.id"] = Setting(f"{own.value}|{suffix}" if own else suffix, IMPLICIT)
        where = f"flow {self.name}, {role} client"
        return self.topology.build_client(settings, role.split(".")[1], where, librdkafka)


class Topology:
    """Everything the flow files define, read as MirrorMaker 2 reads one merged file."""

    def __init__(
        self,
        definitions: Sequence[Property],
        selected: Sequence[str] | None = None,
        files: Sequence[str] = (),
        base_dir: Path | None = None,
    ) -> None:
        """``base_dir``: where relative file names in the settings (``${file:…}`` paths, key
        and trust store locations) are read from; None: the working directory, as MM2 reads
        them."""
        self.files = list(files) or list(dict.fromkeys(d.location.file for d in definitions))
        self.definitions = list(definitions)
        self.props: dict[str, Property] = {d.key: d for d in self.definitions}
        clusters = self.props.get("clusters")
        self.aliases: list[str] = (
            list(dict.fromkeys(configdefs.parse_list(clusters.value))) if clusters else []
        )
        self.selected = list(dict.fromkeys(selected)) if selected else None
        if self.selected:
            self._check_selection(self.selected)
        self.base_dir = base_dir
        self.providers = Providers({k: p.value for k, p in self.props.items()}, base_dir)
        self._flows: dict[str, Flow] = {}

    @cached_property
    def clusters(self) -> dict[str, Cluster]:
        return {alias: Cluster(self, alias) for alias in self.aliases}

    def cluster(self, alias: str) -> Cluster:
        if alias not in self.clusters:
            raise MirrorflowError(
                f"no cluster {alias!r} in `clusters`", _suggest(alias, self.aliases)
            )
        return self.clusters[alias]

    @cached_property
    def herder_pairs(self) -> list[str]:
        """``clusterPairs()`` after ``--clusters``: the S->T pairs MM2 starts a herder for."""
        raw = {k: p.value for k, p in self.props.items()}
        global_heartbeats = configdefs.parse_boolean(raw.get("emit.heartbeats.enabled", "true"))
        pairs = []
        for source in self.aliases:
            for target in self.aliases:
                if source == target or (self.selected and target not in self.selected):
                    continue
                prefix = f"{source}->{target}."
                enabled = configdefs.parse_boolean(raw.get(prefix + "enabled", "false"))
                heartbeats = raw.get(prefix + "emit.heartbeats.enabled")
                if enabled or (
                    configdefs.parse_boolean(heartbeats)
                    if heartbeats is not None
                    else global_heartbeats
                ):
                    pairs.append(f"{source}->{target}")
        return pairs

    @cached_property
    def pairs(self) -> list[Flow]:
        """A flow for every herder pair, replicating or not (heartbeats still run)."""
        return [self.flow(name) for name in self.herder_pairs]

    @property
    def flows(self) -> list[Flow]:
        """The flows that replicate (enabled, with a herder)."""
        return [f for f in self.pairs if f.enabled]

    def flow(self, name: str) -> Flow:
        """Any flow ``S->T`` between listed clusters (it may be disabled)."""
        source, arrow, target = name.partition("->")
        if not arrow:
            raise MirrorflowError(f"{name!r} is not a flow", "write SOURCE->TARGET, e.g. A->B")
        for alias in (source, target):
            self.cluster(alias)
        if source == target:
            raise MirrorflowError(f"{name} is a flow from a cluster to itself")
        return self._flows.setdefault(name, Flow(self, source, target))

    def build_client(
        self, settings: dict[str, Setting], role: str, where: str, for_librdkafka: bool
    ) -> dict[str, str]:
        """Resolve config-provider references, then translate for librdkafka if asked."""
        try:
            java = {k: self.providers.resolve(k, s.value) for k, s in settings.items()}
        except MirrorflowError as exc:
            raise MirrorflowError(f"{where}: {exc.message}", exc.hint) from None
        if self.base_dir is not None:  # stores are read under it, wherever the client runs
            for key in _STORE_LOCATIONS.intersection(java):
                if java[key]:
                    java[key] = str(self.base_dir / java[key])
        return librdkafka.translate(java, role, where) if for_librdkafka else java

    def handed_over_values(self, flows: Iterable[str]) -> dict[tuple[str, str, str], str]:
        """The references to providers a job's launcher resolves (``${airflow:…}``) in every
        setting a job of ``flows`` may use (top-level keys, its clusters' and its flows'),
        resolved; see :func:`mirrorflow.config.providers.hand_over`."""
        names = [self.flow(name) for name in flows]
        involved = {alias for f in names for alias in (f.source, f.target)}
        wanted = {f.name for f in names}
        found: dict[tuple[str, str, str], str] = {}
        for key, prop in self.props.items():
            head = key.split(".", 1)[0]
            if "->" in head:
                if head not in wanted:
                    continue
            elif head in self.aliases and head not in involved:
                continue
            try:
                found.update(self.providers.resolve_handed_over([prop.value]))
            except MirrorflowError as exc:
                raise MirrorflowError(f"{prop.location}: {key}: {exc.message}", exc.hint) from None
        return found

    def _check_selection(self, selected: list[str]) -> None:
        for alias in selected:
            if alias not in self.aliases:
                raise MirrorflowError(
                    f"--clusters names {alias!r}, which is not in `clusters` "
                    f"({', '.join(self.aliases) or 'none'})",
                    _suggest(alias, self.aliases)
                    + (" (separate aliases with spaces, not commas)" if "," in alias else ""),
                )


def load_topology(
    paths: Iterable[Path | str],
    clusters: Sequence[str] | None = None,
    base_dir: Path | None = None,
) -> Topology:
    """The topology the flow files define (merged in order), optionally limited to flows whose
    target is in ``clusters`` (MM2's ``--clusters``); relative file names in its settings are
    read from ``base_dir`` (None: the working directory)."""
    definitions: list[Property] = []
    files = [str(p) for p in paths]
    for path in files:
        definitions += flowfiles.read(Path(path))
    return Topology(definitions, clusters, files, base_dir)


def _suggest(name: str, candidates: Iterable[str]) -> str:
    close = closest(name, candidates)
    return f"did you mean {close!r}?" if close else "check the spelling"


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most similar to ``name`` (case-insensitive), if any is close."""
    by_folded = {c.casefold(): c for c in candidates}
    match = difflib.get_close_matches(name.casefold(), list(by_folded), n=1, cutoff=0.6)
    return by_folded[match[0]] if match else None
