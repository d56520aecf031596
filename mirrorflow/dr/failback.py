"""Failback of one flow ``S->T`` after its failover: the records written on ``T`` during the
failover go back to ``S``, the consumer groups are translated back, and ``S->T`` resumes from the
positions it was held at, so nothing the old primary already has is copied again.

The failback copies the reverse direction itself (confluent-kafka, no Spark job), from where the
failover left ``T`` to ``T``'s end, so it needs no reverse flow in the flow files: an identity
policy cannot have one (a cycle, a validation error). It writes that copy's end as the positions
of ``T->S`` (``mm2-offsets.<T>.internal`` on ``S``), so a reverse flow enabled later, or the next
failback, starts after it.

Steps (:data:`STEPS`):

``preflight``
    Both clusters answer; the failover being undone (the latest run of ``S->T`` that held it,
    not a dry run: its ``positions_at_cut``); ``S->T`` still held; the replication policy; what
    to copy back: per partition of each replicated topic, the range of ``T``'s topic written
    during the failover (default policy: ``T``'s own ``orders``, copied to ``T.orders`` on ``S``
    as MirrorMaker 2's active/active names it; identity: ``orders`` past the forward flow's last
    copy, copied to ``orders``); with the identity policy, the records on ``S`` past the cut
    (never copied to ``T``); the consumer groups on ``T`` (the flow's ``groups``, narrowed by the
    run's pattern); no reverse flow running (a job running ``T->S`` must be paused first).
``fence-producers``
    With principals: ACL DENY WRITE on ``T``'s copied topics, so nothing more is written there.
``set-aside``
    Identity policy: the records of ``S`` past the cut are copied to
    ``<topic>.diverged.<run id>`` on ``S`` (same partition) and reported, never dropped. Skipped
    with the default policy: those records keep their place in ``orders`` and ``S->T`` copies
    them to ``S.orders`` on ``T`` when it resumes.
``reverse-copy``
    Copies each range found by the preflight (to its end now) to ``S``, keeping partition, key,
    value, headers and timestamp, records where each copy landed (the run record), and writes
    the positions of ``T->S``.
``group-sync``
    Each group's committed offsets on ``T`` translated back: on the forward flow's remote topics
    with its offset map (the first source record whose copy the group had not read), on the
    copied topics with the copy's record of where each record landed; committed on ``S`` (a
    group with members there is left alone, reported).
``unfence``
    Removes exactly the DENY WRITE ACLs the failover created on ``S`` (``fences.json``).
``resume``
    Identity policy: ``S->T``'s positions moved to ``S``'s end after the reverse copy (the
    diverged records are set aside, the copied ones came from ``T``: copying either to ``T``
    would duplicate or loop). Then its hold is released and it is unpaused: it resumes from its
    positions, copying only what is written on ``S`` from now on (default policy: also the
    records written on ``S`` after the cut).
``report``
    The report (``templates/failback_report.*.j2``) with the counts: records written on ``T``
    during the failover, records copied back, records set aside, groups and offsets.

A dry run computes and reports everything and changes nothing. Records and reports live in
``$MIRRORFLOW_STATE/reports/failback/<run id>/``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mirrorflow import paths
from mirrorflow.dr.failover import (
    FailoverRun,
    Log,
    Partition,
    StepSkipped,
    _key,
    _replicated_partitions,
    _source_bounds,
    fences_file,
    reachable,
    reports_dir,
    safe_run_id,
)
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ADMIN_TIMEOUT_S, ClusterAdmin, cluster_error
from mirrorflow.runtime import jobs

STEPS = (
    "preflight",
    "fence-producers",
    "set-aside",
    "reverse-copy",
    "group-sync",
    "unfence",
    "resume",
    "report",
)
DIVERGED_SUFFIX = "diverged"


@dataclass(frozen=True)
class FailbackRequest:
    """What a failback run was asked to do (a DAG run's Params, or a command's options)."""

    flow: str  # the flow failed over, S->T: the failback goes from T back to S
    flow_files: tuple[str, ...]
    run_id: str
    group_pattern: str = ".*"
    fence_principals: tuple[str, ...] = ()
    dry_run: bool = False
    failover_run_id: str = ""  # the failover undone (default: the latest that held the flow)
    reachability_timeout_s: float = 15.0
    state_dir: str | None = None

    def __post_init__(self) -> None:
        jobs.split_flow(self.flow)
        try:
            re.compile(self.group_pattern)
        except re.error as exc:
            raise MirrorflowError(
                f"group pattern {self.group_pattern!r} is not a regular expression: {exc}",
                "write a Python regex, e.g. billing.* or .*",
            ) from None
        for principal in self.fence_principals:
            if not re.fullmatch(r"(User:)?[^\s:,]+", principal):
                raise MirrorflowError(
                    f"fence principal {principal!r} is not a principal name",
                    "write it as alice or User:alice",
                )

    mode = "failback"
    catch_up_timeout_s = 0.0

    @property
    def source(self) -> str:
        return jobs.split_flow(self.flow)[0]

    @property
    def target(self) -> str:
        return jobs.split_flow(self.flow)[1]

    @property
    def principals(self) -> list[str]:
        return sorted({p if p.startswith("User:") else f"User:{p}" for p in self.fence_principals})

    def flows_state_dir(self) -> Path:
        return Path(self.state_dir) if self.state_dir else jobs.default_state_dir()

    def flow_dir(self) -> Path:
        return jobs.JobFiles.for_flow(self.flow, self.state_dir).flow_dir(self.flow)


class FailbackRun(FailoverRun):
    """A failback's record (``reports/failback/<run id>/run.json``), as a failover's."""

    KIND = "failback"


def _spec_and_policy(request: FailbackRequest):
    """The forward flow's spec and its replication policy (the flow files, from the project
    root as the mirror job reads them)."""
    import contextlib

    from mirrorflow.config.topology import load_topology
    from mirrorflow.replication.spec import spec_for_flow

    files = [Path(p) for p in request.flow_files]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise MirrorflowError(f"flow file(s) not found: {', '.join(missing)}")
    with contextlib.chdir(paths.project_root()):
        spec = spec_for_flow(files, request.flow)
        topology = load_topology(files)
    return spec, topology, topology.flow(request.flow).policy


def _is_identity(policy) -> bool:
    from mirrorflow.mm2.policy import IdentityReplicationPolicy

    return isinstance(policy, IdentityReplicationPolicy)


def latest_failover(flow: str, run_id: str = "") -> dict:
    """The run record of the failover a failback undoes: ``run_id``'s, else the latest run of
    ``flow`` that held it (not a dry run). Fails, saying so, when there is none."""
    folder = reports_dir()
    candidates = []
    for path in sorted(folder.glob("*/run.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("flow") != flow or data.get("request", {}).get("dry_run"):
            continue
        if run_id and data.get("run_id") != run_id and path.parent.name != safe_run_id(run_id):
            continue
        steps = {s["step"]: s for s in data.get("steps", [])}
        held = steps.get("stop-mirror", {}).get("details", {}).get("held")
        rpo = steps.get("final-sync", {}).get("details", {}).get("rpo")
        if held and rpo:
            candidates.append((data.get("started") or "", data))
    if not candidates:
        raise MirrorflowError(
            f"no failover of {flow} to fail back"
            + (f" with run id {run_id}" if run_id else "")
            + f" in {folder} (one that held the flow and measured its cut)",
            "run the failover first (failover DAG or `mirrorflow failover`)",
        )
    return max(candidates, key=lambda c: c[0])[1]


def _end_offsets(admin: ClusterAdmin, partitions: list[Partition]) -> dict[Partition, int]:
    return {tp: end for tp, (_s, end) in _source_bounds(None, admin, partitions).items()}  # type: ignore[arg-type]


def _topic_partitions(admin: ClusterAdmin, topic: str) -> list[int]:
    found = admin.metadata().topics.get(topic)
    if found is None or found.error is not None:
        return []
    return sorted(found.partitions)


def _reverse_positions(spec: MirrorSpec) -> dict[Partition, int]:
    """``T->S``'s positions on ``S`` (next offset to copy), as a failback or a flow wrote them."""
    from mirrorflow.replication.positions import SourceOffsetReader, offsets_topic

    reader = SourceOffsetReader(
        spec.source_consumer_client,
        spec.source_admin,
        offsets_topic(spec.target),
        spec.target,
        spec.source,
    )
    reader.missing_ok = True
    try:
        return {tp: last + 1 for tp, last in reader.read_to_end().items()}
    finally:
        reader.close()


def _nested(values: dict[Partition, int]) -> dict[str, dict[str, int]]:
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), value in sorted(values.items()):
        nested.setdefault(topic, {})[str(partition)] = value
    return nested


def _flat(nested: dict[str, dict[str, int]]) -> dict[Partition, int]:
    return {(t, int(p)): int(v) for t, parts in (nested or {}).items() for p, v in parts.items()}


# -- the steps ---------------------------------------------------------------------------------


def preflight(request: FailbackRequest, log: Log = print) -> dict:
    """The failover undone, both clusters, the policy, the ranges to copy back and set aside."""
    from mirrorflow.replication.checkpoints import read_offset_map

    run = FailbackRun(request)
    with run.recording("preflight") as record:
        spec, _topology, policy = _spec_and_policy(request)
        for alias, config in ((spec.source, spec.source_admin), (spec.target, spec.target_admin)):
            down = reachable(alias, config, request.reachability_timeout_s)
            if down:
                raise ClusterUnreachable(
                    f"a failback of {request.flow} needs {alias}, which is unreachable: {down}",
                    f"wait until {alias} is back, then trigger the failback again",
                )
        failover = latest_failover(request.flow, request.failover_run_id)
        steps = {s["step"]: s for s in failover["steps"]}
        cut = _flat(steps["final-sync"]["details"]["rpo"]["positions_at_cut"])
        if not jobs.held(request.flow_dir()):
            raise MirrorflowError(
                f"{request.flow} is not held paused: it was resumed after failover "
                f"{failover['run_id']}, so its positions are no longer the cut",
                "a failback resumes a held flow; fail over again first",
            )
        reverse = f"{spec.target}->{spec.source}"
        running = jobs.mirror_processes(request.flows_state_dir(), reverse) or jobs.running_jobs(
            request.flows_state_dir(), reverse
        )
        if running:
            raise MirrorflowError(
                f"the reverse flow {reverse} runs in mirror job(s) {running}: the failback "
                "copies the reverse direction itself",
                f"pause flow__{spec.target}__{spec.source} (or its mirror DAG) and trigger "
                "the failback again; it resumes after the failback's copy",
            )
        identity = _is_identity(policy)
        source = ClusterAdmin(spec.source, spec.source_admin)
        target = ClusterAdmin(spec.target, spec.target_admin)
        # The flow's topics now (positions of topics its filter no longer takes are history),
        # without the heartbeats: the target's own heartbeats are no data to bring back.
        topics = sorted(
            t
            for t in {t for t, _p in _replicated_partitions(spec, source)} | {t for t, _ in cut}
            if spec.should_replicate(t) and not policy.is_heartbeats_topic(t)
        )
        # What T holds that S does not: default policy, T's own topic of the same name (written
        # there during the failover); identity, the same topic past the forward flow's copies.
        forward_map = read_offset_map(spec)
        reverse_positions = _reverse_positions(spec)
        copies = []
        for topic in topics:
            partitions = _topic_partitions(target, topic)
            if not partitions:
                continue
            ends = _end_offsets(target, [(topic, p) for p in partitions])
            bounds = _source_bounds(spec, target, [(topic, p) for p in partitions])
            for p in partitions:
                if identity:
                    last = forward_map.last_run((topic, p))
                    start = last.downstream_end if last is not None else bounds[(topic, p)][0]
                else:
                    start = bounds[(topic, p)][0]
                start = max(start, reverse_positions.get((topic, p), 0), bounds[(topic, p)][0])
                copies.append(
                    {
                        "topic": topic,
                        "partition": p,
                        "to": topic if identity else policy.format_remote_topic(spec.target, topic),
                        "start": start,
                        "end": max(start, ends[(topic, p)]),
                    }
                )
        diverged = []
        if identity:
            held = {tp: position for tp, position in cut.items() if tp[0] in topics}
            ends = _end_offsets(source, sorted(held))
            side = {t: f"{t}.{DIVERGED_SUFFIX}.{safe_run_id(request.run_id)}" for t, _ in held}
            for (topic, p), position in sorted(held.items()):
                if ends[(topic, p)] > position:
                    diverged.append(
                        {
                            "topic": topic,
                            "partition": p,
                            "to": side[topic],
                            "start": position,
                            "end": ends[(topic, p)],
                        }
                    )
        groups = _target_groups(spec, target, request.group_pattern)
        written_on_target = sum(c["end"] - c["start"] for c in copies)
        record.details = {
            "source": spec.source,
            "target": spec.target,
            "failover_run_id": failover["run_id"],
            "policy": type(policy).__name__,
            "identity": identity,
            "positions_at_cut": _nested(cut),
            "topics": topics,  # the flow's topics now, heartbeats left out
            "copies": copies,
            "written_on_target": written_on_target,
            "diverged": diverged,
            "diverged_records": sum(d["end"] - d["start"] for d in diverged),
            "groups": groups,
        }
        record.summary = (
            f"failback of {request.flow} (failover {failover['run_id']}, "
            f"{type(policy).__name__}): {written_on_target} record(s) written on {spec.target} "
            f"during the failover to copy back, {len(groups)} group(s)"
            + (
                f", {record.details['diverged_records']} record(s) on {spec.source} past the "
                "cut to set aside"
                if identity
                else ""
            )
            + (" (dry run: nothing will be changed)" if request.dry_run else "")
        )
        log(record.summary)
    return {"step": "preflight", **record.details, "summary": record.summary}


def _target_groups(spec: MirrorSpec, target: ClusterAdmin, pattern: str) -> list[str]:
    try:
        listed = target.client.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result()
    except Exception as exc:
        raise cluster_error(
            target, "listing consumer groups", exc, "DESCRIBE on the groups"
        ) from None
    return sorted(
        g.group_id
        for g in listed.valid
        if spec.should_replicate_group(g.group_id) and re.fullmatch(pattern, g.group_id)
    )


def _details(run: FailbackRun, step: str) -> dict:
    return run.step(step).get("details", {})


def fence_producers(request: FailbackRequest, log: Log = print) -> dict:
    """Deny WRITE on ``T``'s copied topics to the named principals (kept after the failback)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    run = FailbackRun(request)
    with run.recording("fence-producers") as record:
        principals = request.principals
        if not principals:
            raise StepSkipped("no principal to fence")
        spec, _t, _p = _spec_and_policy(request)
        topics = sorted({c["topic"] for c in _details(run, "preflight").get("copies", [])})
        bindings = [
            AclBinding(
                ResourceType.TOPIC,
                topic,
                ResourcePatternType.LITERAL,
                principal,
                "*",
                AclOperation.WRITE,
                AclPermissionType.DENY,
            )
            for topic in topics
            for principal in principals
        ]
        acls = [{"principal": b.principal, "topic": b.name} for b in bindings]
        verb = "would deny" if request.dry_run else "denied"
        if bindings and not request.dry_run:
            target = ClusterAdmin(spec.target, spec.target_admin)
            try:
                for future in target.client.create_acls(
                    bindings, request_timeout=ADMIN_TIMEOUT_S
                ).values():
                    future.result()
            except Exception as exc:
                raise cluster_error(
                    target, "creating DENY WRITE ACLs", exc, "ALTER on the cluster"
                ) from None
        record.details = {"acls": acls, "applied": not request.dry_run}
        record.summary = (
            f"{verb} WRITE on {len(topics)} topic(s) of {spec.target} to "
            f"{', '.join(principals)} ({len(acls)} ACL(s); kept after the failback)"
        )
        log(record.summary)
    return {"step": "fence-producers", **record.details, "summary": record.summary}


def copy_range(
    source_config: dict[str, str],
    target_config: dict[str, str],
    topic: str,
    partition: int,
    start: int,
    end: int,
    to_topic: str,
) -> list[list[int]]:
    """Copy the committed records of ``topic``-``partition`` in ``[start, end)`` to
    ``to_topic``'s same partition (key, value, headers, timestamp), in order; returns where they
    landed as runs ``[first source offset, first copy's offset, count]`` (both advancing by one
    within a run)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

    if end <= start:
        return []
    consumer = Consumer(
        {
            **source_config,
            "group.id": "mirrorflow-failback",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    producer = Producer({**target_config, "enable.idempotence": True, "acks": "all"})
    landed: list[tuple[int, int]] = []
    errors: list = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + 120
        while True:
            msg = consumer.poll(1.0)
            if msg is None:
                if consumer.position([TopicPartition(topic, partition)])[0].offset >= end:
                    break
                if time.monotonic() > deadline:
                    raise MirrorflowError(f"reading {topic}-{partition} timed out at {start}")
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if (
                        msg.offset() >= end
                        or consumer.position([TopicPartition(topic, partition)])[0].offset >= end
                    ):
                        break
                    continue
                raise KafkaException(msg.error())
            if msg.offset() >= end:
                break
            offset = msg.offset()
            producer.produce(
                to_topic,
                value=msg.value(),
                key=msg.key(),
                partition=partition,
                headers=msg.headers(),
                timestamp=msg.timestamp()[1],
                on_delivery=lambda err, m, o=offset: (
                    errors.append(err) if err else landed.append((o, m.offset()))
                ),
            )
            producer.poll(0)
            if offset + 1 >= end:
                break
        if producer.flush(60) or errors:
            raise MirrorflowError(
                f"copying {topic}-{partition} to {to_topic} failed: "
                + (errors[0].str() if errors else "not acknowledged within 60s")
            )
    finally:
        consumer.close()
    runs: list[list[int]] = []
    for upstream, downstream in sorted(landed):
        last = runs[-1] if runs else None
        if last and upstream == last[0] + last[2] and downstream == last[1] + last[2]:
            runs[-1][2] += 1
        else:
            runs.append([upstream, downstream, 1])
    return runs


def _ensure_topic(admin: ClusterAdmin, topic: str, like: ClusterAdmin, like_topic: str) -> None:
    """Create ``topic`` on ``admin``'s cluster with ``like_topic``'s partition count."""
    from confluent_kafka.admin import NewTopic

    if topic in admin.metadata().topics:
        return
    partitions = max(1, len(_topic_partitions(like, like_topic)))
    brokers = len(admin.metadata().brokers)
    for name, future in admin.client.create_topics(
        [NewTopic(topic, partitions, min(3, brokers))], request_timeout=ADMIN_TIMEOUT_S
    ).items():
        try:
            future.result()
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise cluster_error(
                    admin, f"creating topic {name}", exc, f"CREATE on {name}"
                ) from None


def set_aside(request: FailbackRequest, log: Log = print) -> dict:
    """Identity policy: copy the records of ``S`` past the cut to the side topic."""
    run = FailbackRun(request)
    with run.recording("set-aside") as record:
        pre = _details(run, "preflight")
        if not pre.get("identity"):
            raise StepSkipped(
                f"{pre.get('policy')}: the records written on {request.source} after the cut "
                f"stay in their topics and reach {request.target} when {request.flow} resumes"
            )
        spec, _t, _p = _spec_and_policy(request)
        source = ClusterAdmin(spec.source, spec.source_admin)
        ranges = pre.get("diverged", [])
        for d in ranges:
            line = (
                f"{d['topic']}-{d['partition']} offsets {d['start']}..{d['end'] - 1} "
                f"({d['end'] - d['start']} record(s)) written on {spec.source} after the cut, "
                f"never copied to {spec.target}"
            )
            if request.dry_run:
                log(f"would set aside {line} in {d['to']}")
                continue
            _ensure_topic(source, d["to"], source, d["topic"])
            d["copies"] = copy_range(
                spec.source_consumer_client,
                spec.source_client,
                d["topic"],
                d["partition"],
                d["start"],
                d["end"],
                d["to"],
            )
            log(f"set aside {line} in {d['to']}")
        records = sum(d["end"] - d["start"] for d in ranges)
        record.details = {"diverged": ranges, "records": records, "applied": not request.dry_run}
        record.summary = (
            f"{'would set' if request.dry_run else 'set'} aside {records} record(s) of "
            f"{spec.source} written after the cut in "
            f"{', '.join(sorted({d['to'] for d in ranges})) or 'no topic (none diverged)'}"
        )
        log(record.summary)
    return {"step": "set-aside", **record.details, "summary": record.summary}


def reverse_copy(request: FailbackRequest, log: Log = print) -> dict:
    """Copy what ``T`` holds past the failover's point back to ``S``; ``T->S``'s positions."""
    from mirrorflow.replication.positions import PositionWriter, offsets_topic

    run = FailbackRun(request)
    with run.recording("reverse-copy") as record:
        spec, _t, _p = _spec_and_policy(request)
        pre = _details(run, "preflight")
        source = ClusterAdmin(spec.source, spec.source_admin)
        target = ClusterAdmin(spec.target, spec.target_admin)
        copies = [dict(c) for c in pre.get("copies", [])]
        ends = _end_offsets(target, [(c["topic"], c["partition"]) for c in copies])
        for c in copies:
            c["end"] = max(c["start"], ends[(c["topic"], c["partition"])])
        total = sum(c["end"] - c["start"] for c in copies)
        copied = 0
        if not request.dry_run:
            for c in copies:
                if c["end"] <= c["start"]:
                    c["runs"] = []
                    continue
                _ensure_topic(source, c["to"], target, c["topic"])
                c["runs"] = copy_range(
                    spec.target_consumer,
                    spec.source_client,
                    c["topic"],
                    c["partition"],
                    c["start"],
                    c["end"],
                    c["to"],
                )
                copied += sum(r[2] for r in c["runs"])
            if copies:
                from mirrorflow.replication.topics import ensure_internal_topic

                topic = offsets_topic(spec.target)
                ensure_internal_topic(
                    source,
                    topic,
                    min(spec.offsets_replication_factor, len(source.metadata().brokers)),
                    "offset.storage.replication.factor",
                    spec.offsets_partitions,
                )
                writer = PositionWriter(spec.source_client, topic, spec.target, spec.source)
                try:
                    writer.write({(c["topic"], c["partition"]): c["end"] for c in copies})
                finally:
                    writer.close()
        after = (
            {}
            if request.dry_run  # the topics may not exist yet
            else _end_offsets(source, sorted({(c["to"], c["partition"]) for c in copies}))
        )
        resume_at = {}
        if pre.get("identity"):
            topics = set(pre.get("topics", []))
            cut = [tp for tp in _flat(pre.get("positions_at_cut", {})) if tp[0] in topics]
            resume_at = _end_offsets(source, sorted(cut)) if not request.dry_run else {}
        for c in copies:
            log(
                f"{'would copy' if request.dry_run else 'copied'} {spec.target} "
                f"{c['topic']}-{c['partition']} offsets {c['start']}..{c['end'] - 1} "
                f"({c['end'] - c['start']} record(s)) to {c['to']} on {spec.source}"
            )
        record.details = {
            "copies": copies,
            "written_on_target": total,
            "copied": copied,
            "source_ends_after": {_key(tp): o for tp, o in sorted(after.items())},
            "resume_positions": _nested(resume_at),
        }
        record.summary = (
            f"{'would copy' if request.dry_run else 'copied'} "
            f"{total if request.dry_run else copied} record(s) written on {spec.target} during "
            f"the failover back to {spec.source} "
            f"({', '.join(sorted({c['to'] for c in copies})) or 'no topic'}); "
            f"{'would write' if request.dry_run else 'wrote'} {spec.target}->{spec.source}'s "
            "positions after them"
        )
        log(record.summary)
    return {"step": "reverse-copy", **record.details, "summary": record.summary}


def _via_runs(runs: list[list[int]], offset: int, end: int, after: int | None) -> int | None:
    """Where a group at ``offset`` of the copied range resumes on ``S``: the copy of the first
    record at or past it; past the last copy, right after it; nothing copied, ``after``."""
    for upstream, downstream, count in runs:
        if offset < upstream + count:
            return downstream + max(0, offset - upstream)
    if runs:
        return runs[-1][1] + runs[-1][2]
    return after


def group_sync(request: FailbackRequest, log: Log = print) -> dict:
    """The groups' offsets on ``T`` translated back and committed on ``S``."""
    from confluent_kafka import TopicPartition

    from mirrorflow.replication.checkpoints import (
        GroupOffsetsClient,
        GroupOffsetSync,
        read_offset_map,
    )

    run = FailbackRun(request)
    with run.recording("group-sync") as record:
        spec, _t, _p = _spec_and_policy(request)
        pre = _details(run, "preflight")
        copy = _details(run, "reverse-copy")
        identity = pre.get("identity")
        target = ClusterAdmin(spec.target, spec.target_admin)
        source = ClusterAdmin(spec.source, spec.source_admin)
        forward = read_offset_map(spec)
        copies = {(c["topic"], c["partition"]): c for c in copy.get("copies", [])}
        resumes = _flat(copy.get("resume_positions", {}))  # identity: S's ends after the copy
        remote: dict[Partition, Partition] = {}  # T's copy of S's partition -> S's partition
        for topic, p in forward.partitions:
            remote[(spec.remote_topic(topic), p)] = (topic, p)
        reader = GroupOffsetsClient(target, spec.target_consumer)
        state = GroupOffsetSync(spec, {spec.target: source}, dict)  # describes groups on S
        writer = GroupOffsetsClient(source, spec.source_consumer_client)
        results: dict[str, list[dict]] = {}
        committed: dict[str, dict[str, int]] = {}
        active = []
        for group in pre.get("groups", []):
            offsets = reader.committed(group, sorted(set(remote) | set(copies)))
            rows = []
            for (topic, p), (offset, _meta) in sorted(offsets.items()):
                c = copies.get((topic, p))
                # Identity: a group at or past the forward flow's last copy has read nothing
                # the failback sets aside: it resumes at the copies, after those records.
                in_copy = c is not None and (not identity or offset >= c["start"])
                if in_copy:
                    if "runs" not in c:  # a dry run: where the copies land is not known
                        at, how = None, "copy (dry run: known after the copy)"
                    else:
                        at = _via_runs(c["runs"], offset, c["end"], resumes.get((topic, p)))
                        how = "copy"
                    where = c["to"]
                elif (topic, p) in remote:
                    translation = forward.translate_back(remote[(topic, p)], offset)
                    at = None if translation is None else translation.upstream
                    where, how = remote[(topic, p)][0], "offset map"
                else:
                    continue
                rows.append(
                    {
                        "on_target": f"{topic}-{p}",
                        "target_offset": offset,
                        "topic": where,
                        "partition": p,
                        "offset": at,
                        "how": how,
                    }
                )
            results[group] = rows
            wanted = [
                TopicPartition(r["topic"], r["partition"], r["offset"])
                for r in rows
                if r["offset"] is not None
            ]
            if not wanted:
                continue
            if state._state(group) == "ACTIVE":
                active.append(group)
                log(f"group {group} has members on {spec.source}: its offsets are not committed")
                continue
            if not request.dry_run:
                writer.commit(group, wanted)
            committed[group] = {f"{t.topic}-{t.partition}": t.offset for t in wanted}
        for group, rows in results.items():
            where = ", ".join(
                f"{r['topic']}-{r['partition']}@{'-' if r['offset'] is None else r['offset']}"
                for r in rows
            )
            log(f"group {group}: read on {spec.source} from {where or 'nothing yet'}")
        record.details = {"targets": results, "committed": committed, "active": active}
        record.summary = (
            f"{'would commit' if request.dry_run else 'committed'} "
            f"{sum(len(o) for o in committed.values())} offset(s) of {len(committed)} group(s) "
            f"on {spec.source}" + (f", skipped {len(active)} with members there" if active else "")
        )
        log(record.summary)
    return {"step": "group-sync", **record.details, "summary": record.summary}


def unfence(request: FailbackRequest, log: Log = print) -> dict:
    """Remove exactly the DENY WRITE ACLs the failover recorded in ``fences.json``."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    run = FailbackRun(request)
    with run.recording("unfence") as record:
        path = fences_file(request.flow)
        try:
            fences = json.loads(path.read_text())
        except (OSError, ValueError):
            fences = []
        if not fences:
            raise StepSkipped(f"the failover fenced no producer ({path} lists none)")
        spec, _t, _p = _spec_and_policy(request)
        acls = sorted({(f["principal"], f["topic"]) for f in fences})
        if not request.dry_run:
            source = ClusterAdmin(spec.source, spec.source_admin)
            filters = [
                AclBindingFilter(
                    ResourceType.TOPIC,
                    topic,
                    ResourcePatternType.LITERAL,
                    principal,
                    "*",
                    AclOperation.WRITE,
                    AclPermissionType.DENY,
                )
                for principal, topic in acls
            ]
            try:
                for future in source.client.delete_acls(
                    filters, request_timeout=ADMIN_TIMEOUT_S
                ).values():
                    future.result()
            except Exception as exc:
                raise cluster_error(
                    source, "removing DENY WRITE ACLs", exc, "ALTER on the cluster"
                ) from None
            paths.write_private(path, "[]\n")
        verb = "would remove" if request.dry_run else "removed"
        for principal, topic in acls:
            log(f"{verb} DENY WRITE on topic {topic} of {spec.source} for {principal}")
        record.details = {
            "acls": [{"principal": p, "topic": t} for p, t in acls],
            "applied": not request.dry_run,
        }
        record.summary = f"{verb} the failover's {len(acls)} DENY WRITE ACL(s) on {spec.source}"
        log(record.summary)
    return {"step": "unfence", **record.details, "summary": record.summary}


def resume(request: FailbackRequest, log: Log = print) -> dict:
    """Release ``S->T``'s hold and unpause it (identity: its positions past the copies)."""
    from mirrorflow.replication.checkpoints import flow_positions
    from mirrorflow.replication.positions import PositionWriter

    run = FailbackRun(request)
    with run.recording("resume") as record:
        spec, _t, _p = _spec_and_policy(request)
        pre = _details(run, "preflight")
        copy = _details(run, "reverse-copy")
        before = flow_positions(spec)
        moved = _flat(copy.get("resume_positions", {})) if pre.get("identity") else {}
        moved = {tp: o for tp, o in moved.items() if o > before.get(tp, 0)}
        flow_dir = request.flow_dir()
        if not request.dry_run:
            if moved:
                writer = PositionWriter(
                    spec.target_client, spec.offsets_topic, spec.source, spec.target
                )
                try:
                    writer.write(moved)
                finally:
                    writer.close()
            jobs.release(flow_dir)
            jobs.set_paused(flow_dir, False)
        verb = "would" if request.dry_run else ""
        for (topic, p), offset in sorted(moved.items()):
            log(
                f"{verb + ' move' if verb else 'moved'} {request.flow}'s position in "
                f"{topic}-{p} from {before.get((topic, p), 0)} to {offset} (past the records "
                "set aside and those copied back)"
            )
        record.details = {
            "positions_before": _nested(before),
            "positions_moved": _nested(moved),
            "released": not request.dry_run,
        }
        record.summary = (
            f"{'would release' if request.dry_run else 'released'} {request.flow}'s hold and "
            f"{'unpause' if request.dry_run else 'unpaused'} it: it resumes from its positions"
            + (f" ({len(moved)} moved past the failback's copies)" if moved else "")
        )
        log(record.summary)
    return {"step": "resume", **record.details, "summary": record.summary}


def report_context(run: FailbackRun) -> dict:
    """What the failback templates show, from the run record."""
    from mirrorflow.dr.report import _seconds

    data = run.data
    steps = [{**s, "seconds": _seconds(s.get("started"), s.get("ended"))} for s in data["steps"]]
    pre = _details(run, "preflight")
    copy = _details(run, "reverse-copy")
    aside = _details(run, "set-aside")
    groups = _details(run, "group-sync")
    dry = bool(data["request"]["dry_run"])
    failed = [s for s in steps if s["status"] == "failed"]
    changes = []
    would = "would " if dry else ""
    for c in copy.get("copies", []):
        if c["end"] > c["start"]:
            changes.append(
                f"{would}copy {pre.get('target')} {c['topic']}-{c['partition']} "
                f"[{c['start']}, {c['end']}) to {c['to']} on {pre.get('source')}"
            )
    for d in aside.get("diverged", []):
        changes.append(
            f"{would}set aside {d['topic']}-{d['partition']} [{d['start']}, {d['end']}) "
            f"in {d['to']}"
        )
    for group, offsets in (groups.get("committed") or {}).items():
        where = ", ".join(f"{tp}@{o}" for tp, o in offsets.items())
        changes.append(f"{would}commit offsets of group {group} on {pre.get('source')}: {where}")
    for a in _details(run, "unfence").get("acls", []):
        changes.append(f"{would}remove DENY WRITE on {a['topic']} for {a['principal']}")
    for a in _details(run, "fence-producers").get("acls", []):
        changes.append(
            f"{would}deny WRITE on {a['topic']} of {pre.get('target')} to {a['principal']}"
        )
    resumed = _details(run, "resume")
    if resumed:
        changes.append(f"{would}release the hold of {data['flow']} and unpause it")
    ended = steps[-1]["ended"] if steps else None
    return {
        "kind": "failback",
        "flow": data["flow"],
        "reverse": f"{pre.get('target')}->{pre.get('source')}",
        "run_id": data["run_id"],
        "request": data["request"],
        "dry_run": dry,
        "started": data.get("started"),
        "ended": ended,
        "seconds": _seconds(data.get("started"), ended),
        "status": "failed at " + failed[0]["step"] if failed else "success",
        "steps": steps,
        "preflight": pre,
        "copies": copy.get("copies") or pre.get("copies") or [],
        "written_on_target": copy.get("written_on_target", pre.get("written_on_target", 0)),
        "copied": copy.get("copied", 0),
        "diverged": aside.get("diverged") or pre.get("diverged") or [],
        "diverged_records": pre.get("diverged_records", 0),
        "targets": groups.get("targets") or {},
        "active": groups.get("active") or [],
        "changes": changes,
    }


def report(request: FailbackRequest, log: Log = print) -> dict:
    """Write the failback's report (Markdown, HTML, JSON)."""
    from mirrorflow.dr.report import write_report

    run = FailbackRun(request)
    with run.recording("report") as record:
        record.details = {"directory": str(run.directory)}
        record.summary = f"report written to {run.directory}"
    written = write_report(run, report_context(run))
    log(f"failback report: {written['markdown']} (and report.html, report.json)")
    failed = [s["step"] for s in run.steps if s["status"] == "failed"]
    return {"step": "report", **written, "failed_steps": failed}


STEP_FUNCTIONS: dict[str, Callable[..., dict]] = {
    "preflight": preflight,
    "fence-producers": fence_producers,
    "set-aside": set_aside,
    "reverse-copy": reverse_copy,
    "group-sync": group_sync,
    "unfence": unfence,
    "resume": resume,
    "report": report,
}


def run_all(request: FailbackRequest, log: Log = print) -> FailbackRun:
    """Every step in order (``mirrorflow failback``): skipped steps pass, the first failure
    ends the run, the report is written however it ended."""
    failed: MirrorflowError | None = None
    for name in STEPS:
        if failed is not None and name != "report":
            continue
        try:
            STEP_FUNCTIONS[name](request, log=log)
        except StepSkipped as skipped:
            log(f"{name}: skipped: {skipped}")
        except MirrorflowError as exc:
            log(f"{name}: failed: {exc}")
            failed = exc
    run = FailbackRun(request)
    if failed is not None:
        raise MirrorflowError(
            f"failback of {request.flow} failed: {failed.message}",
            (failed.hint + "; " if failed.hint else "") + f"report: {run.directory / 'report.md'}",
        )
    return run
