"""One flow in detail, for the UI's flow page: its lag per partition, its topics, and its
consumer groups with their last checkpoints.

The partitions come from the job's ``progress.json`` (the source's end offsets at its last plan,
``source_end_offsets``, or at a later measurement of a paused flow's lag,
``source_end_offsets_measured``, and the flow's positions, ``source_positions``): no cluster is
asked.
The checkpoints are read from the checkpoints topic on the target
(:class:`mirrorflow.replication.checkpoint_stores.CheckpointReader`), bounded in time: a cluster
that does not answer within ``timeout_s`` gives a one-line note, not an error, and the page shows
the rest.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.checkpoint_stores import CheckpointReader
from mirrorflow.replication.spec import MirrorSpec, spec_for_flow
from mirrorflow.runtime import jobs

CHECKPOINTS_TIMEOUT_S = 8.0


def partitions(progress: dict, spec: MirrorSpec | None = None) -> list[dict[str, Any]]:
    """Per source partition: the source's end offset at the job's last plan, the flow's
    position, the lag between them (None where one is unknown), from ``progress.json``.

    The partitions are those the job planned last (the flow's topics now); before its first
    plan, those it has positions of. With ``spec``, only topics the flow replicates: positions
    of a topic its filter no longer takes (or that another flow of the same name copied) stay
    in the offsets topic, but are no part of the flow now."""
    ends = progress.get("source_end_offsets") or {}
    measured = progress.get("source_end_offsets_measured")
    if measured and _newer(progress.get("lag_measured_at"), progress.get("source_end_offsets_at")):
        ends = measured  # measured since the last plan (a paused flow's, by its application)
    positions = progress.get("source_positions") or {}
    rows = []
    keys = {(t, p) for t, parts in (ends or positions).items() for p in parts}
    if spec is not None:
        keys = {(t, p) for t, p in keys if spec.should_replicate(t)}
    for topic, partition in sorted(keys, key=lambda k: (k[0], int(k[1]))):
        end = (ends.get(topic) or {}).get(partition)
        position = (positions.get(topic) or {}).get(partition)
        lag = max(0, end - position) if end is not None and position is not None else None
        rows.append(
            {
                "topic": topic,
                "partition": int(partition),
                "end": end,
                "position": position,
                "lag": lag,
            }
        )
    return rows


def _newer(measured_at: object, planned_at: object) -> bool:
    """Whether a measurement (Unix time) is newer than a plan (ISO 8601; none: older)."""
    from datetime import datetime

    if not isinstance(measured_at, int | float):
        return False
    try:
        return measured_at > datetime.fromisoformat(str(planned_at)).timestamp()
    except ValueError:
        return True


def _read_checkpoints(spec: MirrorSpec, timeout_s: float) -> list[dict[str, object]]:
    quiet = {"log_level": "2"}  # the page says when the cluster does not answer: no log noise
    reader = CheckpointReader(
        {**spec.target_consumer, **quiet},
        {**spec.target_admin, **quiet},
        spec.checkpoints_topic,
        spec.target,
    )
    try:
        reader.read_to_end(timeout_s)
    finally:
        reader.close()
    return reader.rows(metadata=False)


def checkpoints(
    spec: MirrorSpec, timeout_s: float = CHECKPOINTS_TIMEOUT_S
) -> tuple[dict[str, list[dict[str, object]]], str | None]:
    """Each group's latest checkpoints on the target (``{group: rows}``), and a note (one line)
    when they could not be read within ``timeout_s`` (the reader runs on in the background
    until its own timeouts end it)."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ui-checkpoints")
    future = pool.submit(_read_checkpoints, spec, timeout_s)
    pool.shutdown(wait=False)
    try:
        rows = future.result(timeout=timeout_s + 2)
    except concurrent.futures.TimeoutError:
        return {}, (
            f"{spec.target} did not answer within {timeout_s:.0f}s: its checkpoints "
            f"({spec.checkpoints_topic}) are not shown"
        )
    except MirrorflowError as exc:
        return {}, f"{spec.target}: {exc.message}"
    except Exception as exc:  # a client error of any kind: the page shows the rest
        return {}, f"{spec.target}: {exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}"
    groups: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        groups.setdefault(str(row["group"]), []).append(row)
    return groups, None


def flow_detail(
    flow_files: list[Path],
    flow: str,
    state_dir: Path,
    timeout_s: float = CHECKPOINTS_TIMEOUT_S,
) -> dict[str, object]:
    """The flow's partitions (lag), topics, and groups with their last checkpoints."""
    progress = jobs.read_progress(state_dir / "-".join(jobs.split_flow(flow)))
    try:
        spec: MirrorSpec | None = spec_for_flow(flow_files, flow)
        problem = None
    except MirrorflowError as exc:
        spec, problem = None, str(exc).splitlines()[0]
    rows = partitions(progress, spec)
    detail: dict[str, object] = {
        "partitions": rows,
        "observed_at": progress.get("source_end_offsets_at"),
        "topics": [],
        "groups": {},
        "checkpoints_topic": None,
        "note": None,
    }
    if spec is None:
        detail["note"] = problem
        return detail
    topics = sorted({str(r["topic"]) for r in rows})
    detail["topics"] = [
        {
            "topic": t,
            "remote": spec.remote_topic(t),
            "partitions": sum(1 for r in rows if r["topic"] == t),
            "lag": sum(int(r["lag"] or 0) for r in rows if r["topic"] == t),
        }
        for t in topics
    ]
    detail["checkpoints_topic"] = spec.checkpoints_topic
    detail["groups"], detail["note"] = checkpoints(spec, timeout_s)
    return detail
