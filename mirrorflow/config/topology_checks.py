"""Validation of the topology as a whole (see :mod:`mirrorflow.config.validation`, which checks
each definition): the cluster list, definitions repeated across files, clusters without
``bootstrap.servers``, config providers, identity policies on cycles of flows, provenance paths
and each flow's transforms."""

from __future__ import annotations

import itertools
from collections import defaultdict

from mirrorflow.config import providers
from mirrorflow.config.findings import TRAILING_COMMENT, Finding, Severity, at
from mirrorflow.config.properties import Location, Property
from mirrorflow.config.topology import Flow, Setting, Topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs, policy, transforms


def cluster_list(topology: Topology) -> list[Finding]:
    clusters = topology.props.get("clusters")
    if clusters is None:
        guessed = _guess_aliases(topology)
        first = topology.files[0] if topology.files else "<no file>"
        fix = f"add `clusters = {', '.join(guessed)}`" if guessed else "add `clusters = A, B`"
        return [
            Finding(
                "error",
                Location(first, 1),
                "clusters",
                "missing: MirrorMaker 2 refuses to start without the list of cluster aliases",
                fix,
            )
        ]
    found = []
    separator = topology.props.get("replication.policy.separator")
    sep = separator.value if separator else "."
    for alias in configdefs.parse_list(clusters.value):
        if alias == "":
            problem = "an empty alias (a stray comma)"
            found.append(Finding("error", clusters.location, "clusters", problem, "remove it"))
        elif sep and sep in alias and not TRAILING_COMMENT.search(alias):
            found.append(
                Finding(
                    "warning",
                    clusters.location,
                    "clusters",
                    f"alias {alias!r} contains the separator {sep!r}: its remote topics look "
                    f"like they come from {alias.split(sep)[0]!r}, so cycle detection fails",
                    f"rename the alias without {sep!r}",
                )
            )
    return found


def intended_aliases(topology: Topology) -> list[str]:
    """The aliases the author meant, to tell cluster and flow keys apart: the listed ones (before
    a trailing comment, reported on its own), or those the keys use if none are listed."""
    clusters = topology.props.get("clusters")
    if clusters is None:
        return _guess_aliases(topology)
    return configdefs.parse_list(TRAILING_COMMENT.split(clusters.value)[0])


def _guess_aliases(topology: Topology) -> list[str]:
    """Aliases the keys use: flow sources and targets, owners of ``*.bootstrap.servers``."""
    guessed: dict[str, None] = {}
    for key in topology.props:
        source, arrow, rest = key.partition("->")
        if arrow and "." in rest:
            guessed[source] = guessed[rest.split(".")[0]] = None
        elif key.endswith(".bootstrap.servers"):
            owner = key.removesuffix(".bootstrap.servers")
            for role in configdefs.CLIENT_ROLES:
                owner = owner.removesuffix("." + role)
            guessed[owner] = None
    return [a for a in guessed if a and a != "bootstrap.servers"]


def duplicates(topology: Topology) -> list[Finding]:
    by_key: dict[str, list[Property]] = defaultdict(list)
    for prop in topology.definitions:
        by_key[prop.key].append(prop)
    found = []
    for key, props in by_key.items():
        for earlier, later in itertools.pairwise(props):
            if earlier.value == later.value:
                continue
            values = (configdefs.redact(key, earlier.value), configdefs.redact(key, later.value))
            if earlier.location.file == later.location.file:
                found.append(
                    Finding(
                        "warning",
                        later.location,
                        key,
                        f"defined again ({values[1]!r}; line {earlier.location.line} says "
                        f"{values[0]!r}): Java keeps only this last one",
                        "delete the definition you do not want",
                    )
                )
            else:
                found.append(
                    Finding(
                        "error",
                        later.location,
                        key,
                        f"{values[1]!r} here but {values[0]!r} in {earlier.location}: MM2 "
                        "processes given different files fight over the configuration they "
                        "share through the target cluster",
                        "define the key once, in one file every process uses",
                    )
                )
    return found


def bootstrap_servers(topology: Topology) -> list[Finding]:
    clusters = topology.props.get("clusters")
    if clusters is None:
        return []  # no aliases then
    used = {alias for pair in topology.herder_pairs for alias in pair.split("->")}
    found = []
    for alias in topology.aliases:
        if TRAILING_COMMENT.search(alias):
            continue  # the comment in `clusters` is reported on its own
        if alias in used and "bootstrap.servers" not in topology.cluster(alias).props:
            found.append(
                Finding(
                    "error",
                    clusters.location,
                    "clusters",
                    f"cluster {alias!r} has no bootstrap.servers: MM2 cannot connect to it",
                    f"add `{alias}.bootstrap.servers = host:9092`",
                )
            )
    return found


def config_providers(topology: Topology) -> list[Finding]:
    """Providers mirrorflow cannot run, and references it could never resolve."""
    findings = []
    listed = topology.props.get("config.providers")
    for name, provider in topology.providers.by_name.items():
        defined = topology.props.get(f"config.providers.{name}.class")
        if defined is None:
            if listed is not None:
                findings.append(
                    at(
                        listed,
                        "warning",
                        f"provider {name!r} has no class: MM2 skips it, and ${{{name}:…}} "
                        "references stay as written",
                        f"set config.providers.{name}.class (e.g. {providers.AIRFLOW})",
                    )
                )
        elif provider.class_name not in (*providers.KAFKA_PROVIDERS, *providers.PYTHON_PROVIDERS):
            problem, fix = providers.unknown_class(name, provider.class_name)
            findings.append(at(defined, "error", problem, fix))
    for prop in topology.props.values():
        for name, path, key in topology.providers.references(prop.value):
            wrong = providers.reference_problem(topology.providers.by_name[name], path, key)
            if wrong:
                findings.append(at(prop, "error", *wrong))
    return findings


def identity_cycles(topology: Topology) -> list[Finding]:
    """A cycle of enabled flows with an identity policy on it replicates records forever, unless
    every flow on it runs in provenance mode (``provenance.header.enabled``), which never copies
    a record to the cluster it was first written on."""
    edges: dict[str, list[str]] = defaultdict(list)
    plain: list[tuple[str, str]] = []  # flows without provenance mode
    for flow in topology.flows:
        edges[flow.source].append(flow.target)
        if not flow.setting(configdefs.PROVENANCE):
            plain.append((flow.source, flow.target))
    found = []
    for flow in topology.flows:
        try:
            identity = isinstance(flow.policy, policy.IdentityReplicationPolicy)
        except MirrorflowError:
            continue  # reported with the class key
        path = _path(edges, flow.target, flow.source) if identity else None
        if path and flow.setting(configdefs.PROVENANCE):
            # looping needs a flow on the cycle that neither marks nor checks the origin
            path = next(
                (
                    [*before, *after]
                    for u, v in plain
                    if (before := _path(edges, flow.target, u))
                    and (after := _path(edges, v, flow.source))
                ),
                None,
            )
        if path:
            setting = flow.config["replication.policy.class"]
            loop = "->".join([flow.source, *path])
            found.append(
                Finding(
                    "error",
                    setting.location or topology.props["clusters"].location,
                    setting.source_key or "replication.policy.class",
                    f"flow {flow.name} uses IdentityReplicationPolicy on the cycle {loop}: it "
                    "cannot tell copies from originals, so records loop forever",
                    f"use DefaultReplicationPolicy for {flow.name}, break the cycle, or set "
                    f"{configdefs.PROVENANCE} = true for every flow on it",
                )
            )
    return found + _provenance_paths(topology)


def _provenance_paths(topology: Topology) -> list[Finding]:
    """In provenance mode a record goes on along every flow that does not lead back to where it
    was first written: two paths from one cluster to another copy it there twice."""
    edges: dict[str, list[str]] = defaultdict(list)
    for flow in topology.flows:
        if flow.setting(configdefs.PROVENANCE):
            edges[flow.source].append(flow.target)
    found = []
    for origin in sorted(edges):
        arrivals: dict[str, list[list[str]]] = defaultdict(list)
        stack = [[origin]]
        while stack:
            path = stack.pop()
            for nxt in edges.get(path[-1], []):
                if nxt != origin and nxt not in path:
                    arrivals[nxt].append([*path, nxt])
                    stack.append([*path, nxt])
        for target, paths in sorted(arrivals.items()):
            if len(paths) > 1:
                setting = topology.props["clusters"]
                shown = ", ".join("->".join(p) for p in sorted(paths, key=len)[:2])
                found.append(
                    Finding(
                        "warning",
                        setting.location,
                        "clusters",
                        f"in provenance mode, records first written on {origin} reach {target} "
                        f"by {len(paths)} paths ({shown}): each is copied there "
                        f"{len(paths)} times where the paths' topics overlap",
                        "keep one path between two clusters (or disjoint topics per path)",
                    )
                )
    return found


def _path(edges: dict[str, list[str]], start: str, goal: str) -> list[str] | None:
    """A path of cluster aliases from ``start`` to ``goal`` along ``edges`` (breadth first)."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        if node == goal:
            path = [node]
            while (before := previous[path[-1]]) is not None:
                path.append(before)
            return path[::-1]
        for nxt in edges.get(node, []):
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return None


def flow_transforms(topology: Topology) -> list[Finding]:
    """A flow's Connect transforms and ``record.filter`` (see :mod:`mirrorflow.mm2.transforms`):
    an error for what mirrorflow cannot honour, a warning where MirrorMaker 2 differs."""
    return [f for flow in topology.flows for f in _transforms_of(topology, flow)]


def _transforms_of(topology: Topology, flow: Flow) -> list[Finding]:
    config = flow.values

    def at(key: str, severity: Severity, problem: str, fix: str) -> Finding:
        setting = flow.originals.get(key) or flow.originals.get(
            key.split(".", 1)[0], Setting("", "")
        )
        return Finding(
            severity,
            setting.location or topology.props["clusters"].location,
            setting.source_key or f"{flow.name}.{key}",
            f"flow {flow.name}: {problem}",
            fix,
        )

    try:
        chain = transforms.compile_transforms(config, config.get(transforms.RECORD_FILTER, ""))
    except transforms.TransformError as exc:
        if exc.key in topology.props:  # written at top level, which MirrorMaker 2 drops
            return [
                Finding(
                    "error",
                    topology.props[exc.key].location,
                    exc.key,
                    f"flow {flow.name} misses it: MirrorMaker 2 drops a transform's and a "
                    "predicate's settings at top level",
                    f"write it per flow: {flow.name}.{exc.key}",
                )
            ]
        return [at(exc.key, "error", exc.problem, exc.fix)]
    found = []
    aliases = [a.strip() for a in config.get("transforms", "").split(",") if a.strip()]
    listed = {"transforms": aliases, "predicates": config.get("predicates", "").split(",")}
    for key in sorted(config):
        kind, _, rest = key.partition(".")
        alias = rest.split(".", 1)[0] if kind in listed else ""
        if alias and alias not in [a.strip() for a in listed[kind]]:
            found.append(
                at(
                    key,
                    "warning",
                    f"{alias} is not listed in {kind}: neither MirrorMaker 2 nor mirrorflow "
                    "applies it",
                    f"add {alias} to {kind}, or remove the key",
                )
            )
    if chain is None or not aliases:
        return found
    kinds = [transforms.transform_kind(config.get(f"transforms.{a}.type", "")) for a in aliases]
    if "Filter" in kinds:
        found.append(
            at(
                "transforms",
                "warning",
                "MirrorMaker 2 also runs the flow's transforms over its heartbeat and "
                "checkpoint records, where a Filter may drop them; mirrorflow transforms "
                "only the records it copies",
                "keep them, knowing that mirrorflow never drops heartbeats or checkpoints",
            )
        )
    for alias, stage in zip(aliases, kinds, strict=True):
        if stage == "InsertHeader":
            found.append(
                at(
                    f"transforms.{alias}.type",
                    "warning",
                    "MirrorMaker 2 fails every record with InsertHeader (its header "
                    "converter, ByteArrayConverter, takes bytes, not the literal's string); "
                    "mirrorflow writes the literal as UTF-8 text",
                    "keep it for mirrorflow, not for MirrorMaker 2",
                )
            )
    return found


def worker_overrides(topology: Topology) -> list[Finding]:
    """A cluster's worker setting that a top-level one overrides: MirrorMaker 2 puts the
    top-level ``offset.storage*``, ``task*``, ``worker*`` ... worker settings over the target
    cluster's (``MirrorMakerConfig.workerConfig``), and so does mirrorflow."""
    found = []
    for alias in topology.aliases:
        prefix = alias + "."
        for key, prop in topology.props.items():
            if not key.startswith(prefix):
                continue
            name = key[len(prefix) :]
            top = topology.props.get(name)
            taken = next(
                (p for p in configdefs.WORKER_TOP_LEVEL_PREFIXES if name.startswith(p)), ""
            )
            if (
                top is None
                or not taken
                or name not in configdefs.worker_names()
                or configdefs.java_trim(top.value) == configdefs.java_trim(prop.value)
            ):
                continue
            value = configdefs.redact(name, top.value)
            found.append(
                at(
                    prop,
                    "warning",
                    f"overridden by the top-level {name} = {value} ({top.location}): MirrorMaker 2 "
                    f"puts top-level {taken}* worker settings over each cluster's",
                    f"remove `{name}` or `{key}`",
                )
            )
    return found
