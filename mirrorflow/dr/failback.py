"""Failback of one flow ``S->T`` after its failover: the records written on ``T`` during the
failover go back to ``S``, the consumer groups are translated back, and ``S->T`` resumes from the
positions it was held at, so nothing the old primary already has is copied again.

The failback copies the reverse direction itself (confluent-kafka, no Spark job), from where the
failover left ``T`` to ``T``'s end, so it needs no reverse flow in the flow files: an identity
policy cannot have one (a cycle, a validation error). It writes that copy's end as the positions
of ``T->S`` (``mm2-offsets.<T>.internal`` on ``S``), so a reverse flow enabled later, or the next
failback, starts after it.

Provenance mode (same topic names in active/active, ``provenance.header.enabled``) has the
reverse flow: it copies ``T``'s records back itself (``reverse-copy`` and ``set-aside`` are
skipped), the groups resume at the first record of either side they have not read (both flows'
offset maps), and ``S->T`` resumes from its held positions.

Steps (:data:`STEPS`):

``preflight``
    The failover being undone (:func:`latest_failover`: the latest failover of ``S->T`` that
    changed something, not a dry run, not rolled back; its ``positions_at_cut``): one that failed
    is refused in one line naming the rollback (or: run the failover again); both clusters
    answer; ``S->T`` still held; the failover's RPO measured on ``S`` unless it was
    (:func:`mirrorflow.dr.rpo.measure_missing`); the replication policy; what
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
    group with members there is left alone, reported). Default policy: a group that read a
    topic's records on ``T`` but has no offset on a partition of ``T``'s own topic that was
    copied back starts that partition of ``T.orders`` at its first record copied back.
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

Each change goes in the run's ledger as it is made. A dry run computes and reports everything
and changes nothing. Records and reports live in ``$MIRRORFLOW_STATE/reports/failback/<run id>/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mirrorflow import paths
from mirrorflow.dr import range_copy
from mirrorflow.dr.clusters import (
    end_offsets,
    log_bounds,
    reachable,
    replicated_groups,
    replicated_partitions,
)
from mirrorflow.dr.failback_run import (  # noqa: F401  (the workflow's names, as callers use them)
    DIVERGED_SUFFIX,
    STEPS,
    WORKFLOW,
    FailbackRequest,
    FailbackRun,
    latest_failover,
    report_context,
)
from mirrorflow.dr.failover_rollback import measure_and_record
from mirrorflow.dr.fences import (
    create_acls,
    delete_acls,
    deny_write_bindings,
    fences_file,
    read_fences,
    write_fences,
)
from mirrorflow.dr.offsets import flat_offsets, nested_offsets, partition_key
from mirrorflow.dr.records import positions_at_cut
from mirrorflow.dr.steps import Log, Partition, StepRecord, StepSkipped, safe_run_id
from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.group_offsets_client import GroupOffsetsClient
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin
from mirrorflow.runtime import jobs


def _spec_and_policy(request: FailbackRequest):
    """The forward flow's spec and its replication policy (the flow files, from the project
    root as the mirror job reads them)."""
    from mirrorflow.config.topology import load_topology

    files = request.flow_paths()
    spec = request.spec()
    topology = load_topology(files, base_dir=paths.project_root())
    return spec, topology, topology.flow(request.flow).policy


def _is_identity(policy) -> bool:
    from mirrorflow.mm2.policy import IdentityReplicationPolicy

    return isinstance(policy, IdentityReplicationPolicy)


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


# -- the steps ---------------------------------------------------------------------------------


@WORKFLOW.step("preflight")
def preflight(request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log) -> None:
    """The failover undone, both clusters, the policy, the ranges to copy back and set aside."""
    from mirrorflow.replication.checkpoint_stores import read_offset_map

    spec, _topology, policy = _spec_and_policy(request)
    # The failover first: one that failed is refused before any cluster is asked.
    failover = latest_failover(request.flow, request.failover_run_id, jobs.held(request.flow_dir()))
    for alias, config in ((spec.source, spec.source_admin), (spec.target, spec.target_admin)):
        down = reachable(alias, config, request.reachability_timeout_s)
        if down:
            raise ClusterUnreachable(
                f"a failback of {request.flow} needs {alias}, which is unreachable: {down}",
                f"wait until {alias} is back, then trigger the failback again",
            )
    cut = flat_offsets(positions_at_cut(failover) or {})
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
    provenance = spec.provenance  # the reverse flow copies T's records back itself
    if running and not provenance:
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
        for t in {t for t, _p in replicated_partitions(spec, source)} | {t for t, _ in cut}
        if spec.should_replicate(t) and not policy.is_heartbeats_topic(t)
    )
    # What T holds that S does not: default policy, T's own topic of the same name (written
    # there during the failover); identity, the same topic past the forward flow's copies.
    forward_map = read_offset_map(spec)
    reverse_positions = _reverse_positions(spec)
    copies: list[dict[str, Any]] = []
    for topic in [] if provenance else topics:
        partitions = range_copy.topic_partitions(target, topic)
        if not partitions:
            continue
        ends = end_offsets(target, [(topic, p) for p in partitions])
        bounds = log_bounds(target, [(topic, p) for p in partitions])
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
    diverged: list[dict[str, Any]] = []
    if identity and not provenance:  # provenance: S's later records go to T when S->T resumes
        held = {tp: position for tp, position in cut.items() if tp[0] in topics}
        ends = end_offsets(source, sorted(held))
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
    groups = replicated_groups(spec, target, request.group_pattern)
    written_on_target = sum(c["end"] - c["start"] for c in copies)
    # The failover's RPO, measured now that its source is back (once: kept in its record).
    measured = failover.get("measured_rpo")
    measure_error = None
    if measured is None:
        try:
            measured = measure_and_record(spec, failover, run, request.dry_run, log)
        except MirrorflowError as exc:  # a figure for the report: the failback goes on
            measure_error = str(exc)
            log(f"the RPO of failover {failover['run_id']} could not be measured: {exc}")
    record.details = {
        "source": spec.source,
        "target": spec.target,
        "failover_run_id": failover["run_id"],
        "policy": type(policy).__name__,
        "identity": identity,
        "provenance": provenance,
        "positions_at_cut": nested_offsets(cut),
        "topics": topics,  # the flow's topics now, heartbeats left out
        "copies": copies,
        "written_on_target": written_on_target,
        "diverged": diverged,
        "diverged_records": sum(d["end"] - d["start"] for d in diverged),
        "groups": groups,
        "failover_measured_rpo": measured,
        "failover_measured_rpo_error": measure_error,
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


@WORKFLOW.step("fence-producers")
def fence_producers(
    request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log
) -> None:
    """Deny WRITE on ``T``'s copied topics to the named principals (kept after the failback)."""
    principals = request.principals
    if not principals:
        raise StepSkipped("no principal to fence")
    spec, _t, _p = _spec_and_policy(request)
    topics = sorted({c["topic"] for c in run.details("preflight").get("copies", [])})
    bindings = deny_write_bindings([(p, t) for t in topics for p in principals])
    acls = [{"principal": b.principal, "topic": b.name} for b in bindings]
    verb = "would deny" if request.dry_run else "denied"

    def created(binding) -> None:
        run.change(
            "fence-acl",
            f"{verb} WRITE on topic {binding.name} of {spec.target} to {binding.principal} "
            "(kept after the failback)",
            undo=None
            if request.dry_run
            else {"cluster": spec.target, "principal": binding.principal, "topic": binding.name},
        )

    if request.dry_run:
        for binding in bindings:
            created(binding)
    elif bindings:
        create_acls(ClusterAdmin(spec.target, spec.target_admin), bindings, created)
    record.details = {"acls": acls, "applied": not request.dry_run}
    record.summary = (
        f"{verb} WRITE on {len(topics)} topic(s) of {spec.target} to "
        f"{', '.join(principals)} ({len(acls)} ACL(s); kept after the failback)"
    )
    log(record.summary)


@WORKFLOW.step("set-aside")
def set_aside(request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log) -> None:
    """Identity policy: copy the records of ``S`` past the cut to the side topic."""
    pre = run.details("preflight")
    if pre.get("provenance"):
        raise StepSkipped(
            f"provenance mode: the records written on {request.source} after the cut stay in "
            f"their topics and reach {request.target} when {request.flow} resumes"
        )
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
            run.change("records-copied", f"would set aside {line} in {d['to']}")
            log(f"would set aside {line} in {d['to']}")
            continue
        range_copy.ensure_topic(run, source, d["to"], source, d["topic"])
        d["copies"] = range_copy.copy_recorded(
            run, (spec.source, spec.source), spec.source_consumer_client, spec.source_client, d
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


@WORKFLOW.step("reverse-copy")
def reverse_copy(request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log) -> None:
    """Copy what ``T`` holds past the failover's point back to ``S``; ``T->S``'s positions."""
    from mirrorflow.replication.positions import PositionWriter, offsets_topic

    spec, _t, _p = _spec_and_policy(request)
    pre = run.details("preflight")
    if pre.get("provenance"):
        _reverse_flow_copies(request, spec)
    source = ClusterAdmin(spec.source, spec.source_admin)
    target = ClusterAdmin(spec.target, spec.target_admin)
    copies = [dict(c) for c in pre.get("copies", [])]
    ends = end_offsets(target, [(c["topic"], c["partition"]) for c in copies])
    for c in copies:
        c["end"] = max(c["start"], ends[(c["topic"], c["partition"])])
    total = sum(c["end"] - c["start"] for c in copies)
    copied = 0
    if not request.dry_run:
        for c in copies:
            if c["end"] <= c["start"]:
                c["runs"] = []
                continue
            range_copy.ensure_topic(run, source, c["to"], target, c["topic"])
            c["runs"] = range_copy.copy_recorded(
                run, (spec.target, spec.source), spec.target_consumer, spec.source_client, c
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
            written = {(c["topic"], c["partition"]): c["end"] for c in copies}
            try:
                writer.write(written)
            finally:
                writer.close()
            run.change(
                "positions",
                f"wrote {spec.target}->{spec.source}'s positions to {topic} on {spec.source}: "
                + ", ".join(f"{partition_key(tp)}@{o}" for tp, o in sorted(written.items())),
            )
    else:
        for c in copies:
            if c["end"] > c["start"]:
                run.change(
                    "records-copied",
                    f"would copy {c['topic']}-{c['partition']} [{c['start']}, {c['end']}) to "
                    f"{c['to']} on {spec.source}",
                )
        if copies:
            run.change(
                "positions",
                f"would write {spec.target}->{spec.source}'s positions after the copies",
            )
    after = (
        {}
        if request.dry_run  # the topics may not exist yet
        else end_offsets(source, sorted({(c["to"], c["partition"]) for c in copies}))
    )
    resume_at = {}
    if pre.get("identity") and not pre.get("provenance"):
        topics = set(pre.get("topics", []))
        cut = [tp for tp in flat_offsets(pre.get("positions_at_cut", {})) if tp[0] in topics]
        resume_at = end_offsets(source, sorted(cut)) if not request.dry_run else {}
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
        "source_ends_after": {partition_key(tp): o for tp, o in sorted(after.items())},
        "resume_positions": nested_offsets(resume_at),
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


def _reverse_flow_copies(request: FailbackRequest, spec: MirrorSpec) -> None:
    """Provenance mode: the reverse flow ``T->S`` copies ``T``'s records back (it never copies
    ``S``'s own back, and marks the others): raises StepSkipped saying how far it is."""
    reverse = _reverse_spec(request, spec)
    target = ClusterAdmin(spec.target, spec.target_admin)
    partitions = [
        tp for tp in replicated_partitions(reverse, target) if not tp[0].endswith("heartbeats")
    ]
    ends = end_offsets(target, partitions)
    positions = _reverse_positions(spec)
    behind = sum(max(0, ends[tp] - positions.get(tp, 0)) for tp in partitions)
    raise StepSkipped(
        f"provenance mode: the reverse flow {reverse.flow} copies what was written on "
        f"{spec.target} back to {spec.source} (its mirror job must run); it has "
        f"{behind} offset(s) of {spec.target} still to read"
    )


def _reverse_spec(request: FailbackRequest, spec: MirrorSpec) -> MirrorSpec:
    """The opposite flow's spec (``T->S``), from the same flow files."""
    from mirrorflow.replication.spec import spec_for_flow

    reverse = f"{spec.target}->{spec.source}"
    return spec_for_flow(request.flow_paths(), reverse, base_dir=paths.project_root())


def _via_runs(runs: list[list[int]], offset: int, end: int, after: int | None) -> int | None:
    """Where a group at ``offset`` of the copied range resumes on ``S``: the copy of the first
    record at or past it; past the last copy, right after it; nothing copied, ``after``."""
    for upstream, downstream, count in runs:
        if offset < upstream + count:
            return downstream + max(0, offset - upstream)
    if runs:
        return runs[-1][1] + runs[-1][2]
    return after


def _first_copies(
    group: str,
    offsets: dict[Partition, tuple[int, str]],
    remote: dict[Partition, Partition],
    copies: dict[Partition, dict],
    on_source: GroupOffsetsClient,
    source: str,
) -> list[dict]:
    """Default policy: where ``group`` starts on the copied-back topics (``T.orders`` on ``S``)
    for the partitions it has no offset of on ``T``'s own topic, though it read that topic's
    data (on ``S.orders`` there, say): at the first record copied back, so it reads every
    record written on ``T`` during the failover once. A group that has an offset there on
    ``S`` already (an earlier failback) keeps it. Identity policy: the copies land in ``orders``
    itself, after what a group that never read it on ``T`` has not read on ``S``: it keeps its
    offset there, and nothing is committed for it (the caller does not ask)."""
    read = {remote[tp][0] for tp in offsets if tp in remote}
    read |= {tp[0] for tp in offsets if tp in copies}
    unread = [
        (tp, c)
        for tp, c in sorted(copies.items())
        if tp[0] in read and tp not in offsets and c["end"] > c["start"] and c.get("runs") != []
    ]
    if not unread:
        return []
    copied = [(tp, c) for tp, c in unread if c.get("runs")]
    kept = on_source.committed(group, [(c["to"], tp[1]) for tp, c in copied]) if copied else {}
    rows = []
    for (topic, p), c in unread:
        row = {"on_target": f"{topic}-{p}", "target_offset": None, "topic": c["to"]}
        if "runs" not in c:  # a dry run: where the copies land is not known
            at, how = None, "first copied record (dry run: known after the copy)"
        elif (c["to"], p) in kept:
            at, how = None, f"kept: {kept[(c['to'], p)][0]} on {source} already"
        else:
            at, how = c["runs"][0][1], "first copied record (no offset on the DR cluster)"
        rows.append({**row, "partition": p, "offset": at, "how": how})
    return rows


@WORKFLOW.step("group-sync")
def group_sync(request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log) -> None:
    """The groups' offsets on ``T`` translated back and committed on ``S``."""
    from confluent_kafka import TopicPartition

    from mirrorflow.replication.checkpoint_stores import read_offset_map
    from mirrorflow.replication.group_offset_sync import GroupOffsetSync

    spec, _t, _p = _spec_and_policy(request)
    pre = run.details("preflight")
    copy = run.details("reverse-copy")
    identity = pre.get("identity")
    target = ClusterAdmin(spec.target, spec.target_admin)
    source = ClusterAdmin(spec.source, spec.source_admin)
    forward = read_offset_map(spec)
    # Provenance mode: T's topics also hold T's own records, which the reverse flow copied to
    # S; a group resumes at the earlier of the first record of either side it has not read.
    reverse = read_offset_map(_reverse_spec(request, spec)) if pre.get("provenance") else None
    reverse_positions = _reverse_positions(spec) if reverse is not None else {}
    copies = {(c["topic"], c["partition"]): c for c in copy.get("copies", [])}
    resumes = flat_offsets(copy.get("resume_positions", {}))  # identity: S's ends after the copy
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
            if in_copy and c is not None:  # (in_copy says c is not None)
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
                if reverse is not None:
                    own = reverse.translate((topic, p), offset, reverse_positions.get((topic, p)))
                    if own is not None:
                        at = own.downstream if at is None else min(at, own.downstream)
                        how = "offset maps of both flows"
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
        if not identity:
            rows += _first_copies(group, offsets, remote, copies, writer, spec.source)
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
        committed[group] = offsets_now = {f"{t.topic}-{t.partition}": t.offset for t in wanted}
        where = ", ".join(f"{tp}@{o}" for tp, o in offsets_now.items())
        if request.dry_run:
            run.change(
                "group-offsets", f"would commit offsets of group {group} on {spec.source}: {where}"
            )
        else:
            writer.commit(group, wanted)
            run.change(
                "group-offsets",
                f"committed offsets of group {group} on {spec.source}: {where}",
                undo={"cluster": spec.source, "group": group},
            )
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


@WORKFLOW.step("unfence")
def unfence(request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log) -> None:
    """Remove exactly the DENY WRITE ACLs the failover recorded in ``fences.json``."""
    path = fences_file(request.flow)
    fences = read_fences(request.flow)
    if not fences:
        raise StepSkipped(f"the failover fenced no producer ({path} lists none)")
    spec, _t, _p = _spec_and_policy(request)
    acls = sorted({(f["principal"], f["topic"]) for f in fences})
    verb = "would remove" if request.dry_run else "removed"

    def removed(acl: tuple[str, str]) -> None:
        run.change(
            "fence-removed",
            f"{verb} DENY WRITE on topic {acl[1]} of {spec.source} for {acl[0]}",
            undo=None
            if request.dry_run
            else {"cluster": spec.source, "principal": acl[0], "topic": acl[1]},
        )
        log(f"{verb} DENY WRITE on topic {acl[1]} of {spec.source} for {acl[0]}")

    if request.dry_run:
        for acl in acls:
            removed(acl)
    else:
        delete_acls(ClusterAdmin(spec.source, spec.source_admin), acls, removed)
        write_fences(request.flow, [])
        run.change("fences-file", f"emptied {path}: the fences it listed are removed")
    record.details = {
        "acls": [{"principal": p, "topic": t} for p, t in acls],
        "applied": not request.dry_run,
    }
    record.summary = f"{verb} the failover's {len(acls)} DENY WRITE ACL(s) on {spec.source}"
    log(record.summary)


@WORKFLOW.step("resume")
def resume(request: FailbackRequest, run: FailbackRun, record: StepRecord, log: Log) -> None:
    """Release ``S->T``'s hold and unpause it (identity: its positions past the copies)."""
    from mirrorflow.replication.positions import PositionWriter
    from mirrorflow.replication.remote_cluster import flow_positions

    spec, _t, _p = _spec_and_policy(request)
    pre = run.details("preflight")
    copy = run.details("reverse-copy")
    before = flow_positions(spec)
    moved = flat_offsets(copy.get("resume_positions", {})) if pre.get("identity") else {}
    moved = {tp: o for tp, o in moved.items() if o > before.get(tp, 0)}
    flow_dir = request.flow_dir()
    would = "would " if request.dry_run else ""
    if moved:
        if not request.dry_run:
            writer = PositionWriter(
                spec.target_client, spec.offsets_topic, spec.source, spec.target
            )
            try:
                writer.write(moved)
            finally:
                writer.close()
        run.change(
            "positions",
            f"{would}{'move' if would else 'moved'} {request.flow}'s positions past the "
            "records set aside and copied back: "
            + ", ".join(
                f"{partition_key(tp)} {before.get(tp, 0)}->{o}" for tp, o in sorted(moved.items())
            ),
            undo={"positions": nested_offsets({tp: before.get(tp, 0) for tp in moved})},
        )
    hold = jobs.held(flow_dir)
    if not request.dry_run:
        jobs.release(flow_dir)
    if hold is not None:
        run.change(
            "hold-released",
            f"{would}{'release' if would else 'released'} {request.flow}'s hold "
            f"({flow_dir / jobs.HOLD_FILE}, reason {hold!r})",
            undo={"flow_dir": str(flow_dir), "reason": hold},
        )
    if (flow_dir / jobs.PAUSED_FILE).exists():
        if not request.dry_run:
            jobs.set_paused(flow_dir, False)
        run.change(
            "unpaused",
            f"{would}{'remove' if would else 'removed'} {request.flow}'s paused file: its "
            "mirror job resumes it from its positions",
            undo={"flow_dir": str(flow_dir)},
        )
    verb = "would" if request.dry_run else ""
    for (topic, p), offset in sorted(moved.items()):
        log(
            f"{verb + ' move' if verb else 'moved'} {request.flow}'s position in "
            f"{topic}-{p} from {before.get((topic, p), 0)} to {offset} (past the records "
            "set aside and those copied back)"
        )
    record.details = {
        "positions_before": nested_offsets(before),
        "positions_moved": nested_offsets(moved),
        "released": not request.dry_run,
    }
    record.summary = (
        f"{'would release' if request.dry_run else 'released'} {request.flow}'s hold and "
        f"{'unpause' if request.dry_run else 'unpaused'} it: it resumes from its positions"
        + (f" ({len(moved)} moved past the failback's copies)" if moved else "")
    )
    log(record.summary)


report = WORKFLOW.report
STEP_FUNCTIONS: dict[str, Callable[..., dict]] = WORKFLOW.functions


def run_all(request: FailbackRequest, log: Log = print) -> FailbackRun:
    """Every step in order (``mirrorflow failback``): skipped steps pass, the first failure
    ends the run, the report is written however it ended."""
    # The workflow returns its run class's record (a FailbackRun), typed as any Run.
    return WORKFLOW.run_all(request, log)  # type: ignore[return-value]
