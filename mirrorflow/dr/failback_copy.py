"""The failback's copies, its steps ``set-aside`` and ``reverse-copy``
(:data:`mirrorflow.dr.failback_run.WORKFLOW`): the records written on ``T`` during the failover
copied back to ``S``, and, with the identity policy, the records of ``S`` past the cut set aside;
the preflight finds both ranges here (:func:`copy_ranges`, :func:`diverged_ranges`).

The failback copies the reverse direction itself (confluent-kafka, no Spark job), from where the
failover left ``T`` to ``T``'s end, so it needs no reverse flow in the flow files: an identity
policy cannot have one (a cycle, a validation error). It writes that copy's end as the positions
of ``T->S`` (``mm2-offsets.<T>.internal`` on ``S``, :func:`reverse_positions`), so a reverse flow
enabled later, or the next failback, starts after it. In provenance mode the reverse flow
(:func:`reverse_spec`) copies ``T``'s records back itself: both steps are skipped.

``set-aside``
    Identity policy: the records of ``S`` past the cut are copied to
    ``<topic>.diverged.<run id>`` on ``S`` (same partition) and reported, never dropped. Skipped
    with the default policy: those records keep their place in ``orders`` and ``S->T`` copies
    them to ``S.orders`` on ``T`` when it resumes.
``reverse-copy``
    Copies each range found by the preflight (to its end now) to ``S``, keeping partition, key,
    value, headers and timestamp, records where each copy landed (the run record), and writes
    the positions of ``T->S``.
"""

from __future__ import annotations

from typing import Any

from mirrorflow import paths
from mirrorflow.dr import range_copy
from mirrorflow.dr.clusters import end_offsets, log_bounds, replicated_partitions
from mirrorflow.dr.failback_run import (
    DIVERGED_SUFFIX,
    WORKFLOW,
    FailbackRequest,
    FailbackRun,
    spec_and_policy,
)
from mirrorflow.dr.offsets import flat_offsets, nested_offsets, partition_key
from mirrorflow.dr.steps import Log, Partition, StepRecord, StepSkipped, safe_run_id
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin


def reverse_positions(spec: MirrorSpec) -> dict[Partition, int]:
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


def reverse_spec(request: FailbackRequest, spec: MirrorSpec) -> MirrorSpec:
    """The opposite flow's spec (``T->S``), from the same flow files."""
    from mirrorflow.replication.spec import spec_for_flow

    reverse = f"{spec.target}->{spec.source}"
    return spec_for_flow(request.flow_paths(), reverse, base_dir=paths.project_root())


def copy_ranges(
    spec: MirrorSpec, policy, target: ClusterAdmin, topics: list[str], identity: bool
) -> list[dict[str, Any]]:
    """What ``T`` holds that ``S`` does not, per partition of ``topics`` on ``T`` (the
    preflight's ``copies``): default policy, ``T``'s own topic of the same name (written there
    during the failover), to copy to its remote topic on ``S`` (``T.orders``); identity, the same
    topic past the forward flow's last copy, to copy to itself. A range starts no earlier than
    ``T->S``'s positions (:func:`reverse_positions`) and ends at ``T``'s end now."""
    from mirrorflow.replication.checkpoint_stores import read_offset_map

    forward_map = read_offset_map(spec)
    positions = reverse_positions(spec)
    copies: list[dict[str, Any]] = []
    for topic in topics:
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
            start = max(start, positions.get((topic, p), 0), bounds[(topic, p)][0])
            copies.append(
                {
                    "topic": topic,
                    "partition": p,
                    "to": topic if identity else policy.format_remote_topic(spec.target, topic),
                    "start": start,
                    "end": max(start, ends[(topic, p)]),
                }
            )
    return copies


def diverged_ranges(
    source: ClusterAdmin, cut: dict[Partition, int], topics: list[str], run_id: str
) -> list[dict[str, Any]]:
    """Identity policy: the records of ``S`` past the cut (never copied to ``T``), per
    partition of ``topics`` held at the cut, and their side topic on ``S`` (the preflight's
    ``diverged``, which ``set-aside`` copies)."""
    diverged: list[dict[str, Any]] = []
    held = {tp: position for tp, position in cut.items() if tp[0] in topics}
    ends = end_offsets(source, sorted(held))
    side = {t: f"{t}.{DIVERGED_SUFFIX}.{safe_run_id(run_id)}" for t, _ in held}
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
    return diverged


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
    spec, _t, _p = spec_and_policy(request)
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

    spec, _t, _p = spec_and_policy(request)
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
    reverse = reverse_spec(request, spec)
    target = ClusterAdmin(spec.target, spec.target_admin)
    partitions = [
        tp for tp in replicated_partitions(reverse, target) if not tp[0].endswith("heartbeats")
    ]
    ends = end_offsets(target, partitions)
    positions = reverse_positions(spec)
    behind = sum(max(0, ends[tp] - positions.get(tp, 0)) for tp in partitions)
    raise StepSkipped(
        f"provenance mode: the reverse flow {reverse.flow} copies what was written on "
        f"{spec.target} back to {spec.source} (its mirror job must run); it has "
        f"{behind} offset(s) of {spec.target} still to read"
    )
