"""The failback's step ``group-sync`` (:data:`mirrorflow.dr.failback_run.WORKFLOW`): the
consumer groups' offsets on ``T`` translated back and committed on ``S``.

``group-sync``
    Each group's committed offsets on ``T`` translated back: on the forward flow's remote topics
    with its offset map (the first source record whose copy the group had not read), on the
    copied topics with the copy's record of where each record landed (:func:`via_runs`);
    committed on ``S`` (a group with members there is left alone, reported). Default policy: a
    group that read a topic's records on ``T`` but has no offset on a partition of ``T``'s own
    topic that was copied back starts that partition of ``T.orders`` at its first record copied
    back. Provenance mode: a group resumes at the first record of either side it has not read
    (both flows' offset maps).
"""

from __future__ import annotations

from mirrorflow.dr import failback_copy
from mirrorflow.dr.failback_run import WORKFLOW, FailbackRequest, FailbackRun, spec_and_policy
from mirrorflow.dr.offsets import flat_offsets
from mirrorflow.dr.steps import Log, Partition, StepRecord
from mirrorflow.replication.group_offsets_client import GroupOffsetsClient
from mirrorflow.replication.topics import ClusterAdmin


def via_runs(runs: list[list[int]], offset: int, end: int, after: int | None) -> int | None:
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

    spec, _t, _p = spec_and_policy(request)
    pre = run.details("preflight")
    copy = run.details("reverse-copy")
    identity = pre.get("identity")
    target = ClusterAdmin(spec.target, spec.target_admin)
    source = ClusterAdmin(spec.source, spec.source_admin)
    forward = read_offset_map(spec)
    # Provenance mode: T's topics also hold T's own records, which the reverse flow copied to
    # S; a group resumes at the earlier of the first record of either side it has not read.
    reverse = (
        read_offset_map(failback_copy.reverse_spec(request, spec))
        if pre.get("provenance")
        else None
    )
    reverse_positions = failback_copy.reverse_positions(spec) if reverse is not None else {}
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
                    at = via_runs(c["runs"], offset, c["end"], resumes.get((topic, p)))
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
