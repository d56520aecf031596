"""The RPO of a failover: at its cut, the records on the source its target does not have (exact
when planned; at least those the mirror job last saw, with bounds on the oldest's age, in an
emergency), and, once the source is back, those records counted on it (:func:`measure_missing`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from mirrorflow.dr.clusters import log_bounds, replicated_partitions
from mirrorflow.dr.offsets import flat_offsets, nested_offsets, partition_key
from mirrorflow.dr.records import positions_at_cut
from mirrorflow.dr.steps import Partition, iso, now, stamp_ms
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin, cluster_error
from mirrorflow.runtime import jobs


def records_behind(
    bounds: dict[Partition, tuple[int, int]], positions: dict[Partition, int]
) -> dict[Partition, int]:
    """Records per partition the flow has not copied: its end minus its position (from the log
    start when it has none)."""
    behind = {}
    for tp, (start, end) in bounds.items():
        gap = end - max(positions.get(tp, start), start)
        if gap > 0:
            behind[tp] = gap
    return behind


def oldest_uncopied_written(
    history: Sequence[Sequence[int]], position: int
) -> tuple[int | None, int | None]:
    """When the oldest record not copied of a partition at ``position`` (the record at offset
    ``position``) was written, from the job's history of the partition's end offsets
    (``[[epoch ms, end offset], …]``, ascending in time): after the last time its end was at
    or before ``position`` (None: no such observation) and no later than the first time it was
    past it (None: never seen past it). Epoch milliseconds."""
    after = max((int(t) for t, end in history if end <= position), default=None)
    by = min((int(t) for t, end in history if end > position), default=None)
    return after, by


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else round(ms / 1000, 3)


def rpo_at_cut(spec: MirrorSpec, mode: str, flow_dir: Path, cut_ms: int) -> dict:
    """Records on the source that the target does not have at the cut, per partition (see the
    failover's final-sync, :mod:`mirrorflow.dr.failover`). Emergency: at least those the job
    last saw (in ``flow_dir``'s ``progress.json``), with bounds on the age at the cut of the
    oldest of them per partition (from ``progress.json``'s ``source_end_history`` when the job
    writes it, else from when it last listed the ends)."""
    # The offsets topic keeps the positions of every flow from the source to the target, and
    # of topics a flow no longer replicates: the flow's own are those its filter takes.
    positions = {tp: o for tp, o in flow_positions(spec).items() if spec.should_replicate(tp[0])}
    history: dict = {}
    observed_ms: int | None = None
    observed_at: str | None
    if mode == "planned":
        source = ClusterAdmin(spec.source, spec.source_admin)
        bounds = log_bounds(source, list(replicated_partitions(spec, source)))
        observed_at = now()
        basis = f"{spec.source}'s end offsets at the cut"
    else:
        progress = jobs.read_progress(flow_dir)
        ends = progress.get("source_end_offsets") or {}
        bounds = {
            (topic, int(p)): (0, int(end))
            for topic, parts in ends.items()
            for p, end in parts.items()
        }
        history = progress.get("source_end_history") or {}
        observed_at = progress.get("source_end_offsets_at")
        stamp = stamp_ms(observed_at)
        # The listing happened within the stamp's precision after it (a truncated stamp).
        observed_ms = None if stamp is None else stamp[0] + (stamp[1] if stamp[1] > 1 else 0)
        basis = (
            f"the end offsets the mirror job last observed on {spec.source} ({observed_at})"
            if ends
            else f"nothing: the mirror job recorded no end offsets of {spec.source}"
        )
    behind = records_behind(bounds, positions)
    records = sum(behind.values())
    exact = mode == "planned"
    partitions = []
    for tp, n in sorted(behind.items()):
        row: dict = {"partition": partition_key(tp), "behind": n}
        if not exact:
            seen = (history.get(tp[0]) or {}).get(str(tp[1]))
            after, by = (
                oldest_uncopied_written(seen, positions.get(tp, 0)) if seen else (None, None)
            )
            by = by if by is not None else observed_ms
            row.update(
                written_after=None if after is None else iso(after / 1000),
                written_by=None if by is None else iso(by / 1000),
                age_at_least_s=None if by is None else _seconds(cut_ms - by),
                age_at_most_s=None if after is None else _seconds(cut_ms - after),
                basis="history" if seen else "last observation",
            )
        partitions.append(row)
    at_least = [r["age_at_least_s"] for r in partitions if r.get("age_at_least_s") is not None]
    at_most = [r["age_at_most_s"] for r in partitions if r.get("age_at_most_s") is not None]
    oldest = {
        "age_at_least_s": max(at_least) if at_least else None,
        # Known only when every partition has its bound.
        "age_at_most_s": max(at_most) if at_most and len(at_most) == len(partitions) else None,
    }
    short = f"{records} record(s)" if exact else f"at least {records} record(s)"
    summary = (
        f"RPO: {short} on {spec.source} not on {spec.target}, from {basis} minus the "
        "flow's positions" + ("" if exact else "; records written after that are not known")
    )
    if not exact and records and oldest["age_at_least_s"] is not None:
        summary += (
            f"; the oldest of them was {oldest['age_at_least_s']:.3f}s old at the cut or older"
            + (
                f" (at most {oldest['age_at_most_s']:.3f}s)"
                if oldest["age_at_most_s"] is not None
                else ""
            )
        )
    return {
        "records": records,
        "exact": exact,
        "at_least": not exact,
        "basis": basis,
        "observed_at": observed_at,
        "cut": iso(cut_ms / 1000),
        "per_partition": {partition_key(tp): n for tp, n in sorted(behind.items())},
        "partitions": partitions,
        "oldest": oldest,
        "history": bool(history),
        # Where the flow stopped (the failback resumes from here and sets aside what the
        # source holds beyond it): source partition -> position.
        "positions_at_cut": nested_offsets(positions),
        "summary_short": short,
        "summary": summary,
    }


def failover_cut_ms(data: dict) -> int | None:
    """The cut of a failover run (epoch ms): when its stop-mirror completed."""
    recorded = (data.get("cut") or {}).get("epoch_ms")
    if recorded is not None:
        return int(recorded)
    stop = [s for s in data.get("steps", []) if s.get("step") == "stop-mirror" and s.get("ended")]
    stamp = stamp_ms(stop[-1]["ended"]) if stop else None
    return None if stamp is None else stamp[0]


def measure_missing(spec: MirrorSpec, failover: dict, timeout_s: float = 120.0) -> dict:
    """The RPO of failover run ``failover`` measured on its source, once that is back: per
    partition, the records from the position at the cut to the end now whose timestamp is at
    or before the cut (the records the target did not get), with the oldest's and newest's
    timestamps and the oldest's age at the cut; those written after the cut are counted apart.
    Reads with a consumer that is assigned its partitions, never joins nor commits its group
    (READ on the topics is all it needs); ``read_committed`` when the flow reads so."""
    from confluent_kafka import KafkaError, TopicPartition

    from mirrorflow.replication import clients

    cut = failover_cut_ms(failover)
    positions = {
        tp: o
        for tp, o in flat_offsets(positions_at_cut(failover) or {}).items()
        if spec.should_replicate(tp[0])
    }
    if cut is None or not positions:
        raise MirrorflowError(
            f"failover {failover.get('run_id')} recorded no cut to measure from",
            "measure the RPO of a failover that got past its final-sync",
        )
    committed = spec.source_consumer.get("isolation.level") == "read_committed"
    admin = ClusterAdmin(spec.source, spec.source_admin)
    ends = {tp: end for tp, (_s, end) in log_bounds(admin, sorted(positions), committed).items()}
    consumer = clients.assigned_consumer(
        spec.source,
        spec.source_consumer_client,
        f"mirrorflow-rpo-{spec.flow}",
        {
            "auto.offset.reset": "earliest",  # a position retention removed: from the start
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        },
    )
    found: dict[Partition, dict] = {
        tp: {"missing": 0, "after_cut": 0, "oldest_ms": None, "newest_ms": None} for tp in positions
    }
    todo = {tp for tp, start in positions.items() if ends.get(tp, 0) > start}
    deadline = time.monotonic() + timeout_s
    try:
        if todo:
            consumer.assign([TopicPartition(t, p, positions[(t, p)]) for t, p in sorted(todo)])
        while todo:
            if time.monotonic() > deadline:
                raise MirrorflowError(
                    f"reading {spec.source} from the cut to its end took over {timeout_s:g}s "
                    f"({', '.join(partition_key(tp) for tp in sorted(todo))} not done)",
                    f"check that {spec.source} answers, then measure again",
                )
            for msg in consumer.consume(1000, 0.5):
                error = msg.error()
                if error is not None:
                    if error.code() in (
                        KafkaError._PARTITION_EOF,
                        KafkaError.GROUP_AUTHORIZATION_FAILED,  # the group is never used
                    ):
                        continue
                    raise cluster_error(
                        admin, f"reading {msg.topic()}", Exception(error), "READ on the topic"
                    )
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                assert topic is not None and partition is not None and offset is not None
                tp = (topic, partition)
                if offset >= ends[tp]:
                    continue
                stamp = msg.timestamp()[1]
                counted = found[tp]
                if stamp > cut:
                    counted["after_cut"] += 1
                    continue
                counted["missing"] += 1
                if counted["oldest_ms"] is None or stamp < counted["oldest_ms"]:
                    counted["oldest_ms"] = stamp
                if counted["newest_ms"] is None or stamp > counted["newest_ms"]:
                    counted["newest_ms"] = stamp
            # positions, not offsets read: transaction markers and aborted records count too
            for at in consumer.position([TopicPartition(t, p) for t, p in sorted(todo)]):
                if at.offset >= ends[(at.topic, at.partition)]:
                    todo.discard((at.topic, at.partition))
    finally:
        consumer.close()
    rows = []  # the partitions with records past the cut (the others: nothing to count)
    for tp, counted in sorted(found.items()):
        if ends.get(tp, 0) <= positions[tp]:
            continue
        oldest, newest = counted["oldest_ms"], counted["newest_ms"]
        rows.append(
            {
                "partition": partition_key(tp),
                "from": positions[tp],
                "to": ends.get(tp, positions[tp]),
                "missing": counted["missing"],
                "after_cut": counted["after_cut"],
                "oldest": None if oldest is None else iso(oldest / 1000),
                "newest": None if newest is None else iso(newest / 1000),
                "oldest_age_at_cut_s": _seconds(None if oldest is None else cut - oldest),
            }
        )
    missing = sum(r["missing"] for r in rows)
    stamps = [found[tp]["oldest_ms"] for tp in found if found[tp]["oldest_ms"] is not None]
    newest = [found[tp]["newest_ms"] for tp in found if found[tp]["newest_ms"] is not None]
    oldest_ms = min(stamps) if stamps else None
    return {
        "records": missing,
        "after_cut": sum(r["after_cut"] for r in rows),
        "cut": iso(cut / 1000),
        "measured_at": now(),
        "read_committed": committed,
        "oldest": None if oldest_ms is None else iso(oldest_ms / 1000),
        "newest": None if not newest else iso(max(newest) / 1000),
        "oldest_age_at_cut_s": _seconds(None if oldest_ms is None else cut - oldest_ms),
        "partitions": rows,
        "summary": (
            f"measured RPO: {missing} record(s) written on {spec.source} up to the cut "
            f"({iso(cut / 1000)}) never reached {spec.target}"
            + (
                f", the oldest {_seconds(cut - oldest_ms):.3f}s before the cut"
                if oldest_ms is not None
                else ""
            )
            + f"; {sum(r['after_cut'] for r in rows)} written after the cut"
        ),
    }
