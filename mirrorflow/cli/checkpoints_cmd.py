"""Consumer failover from a shell: ``mirrorflow translate``, ``mirrorflow checkpoints`` and
``mirrorflow sync-groups`` (checkpoint and sync the groups now)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(commands: argparse._SubParsersAction) -> None:
    translate = commands.add_parser(
        "translate",
        help="where a consumer group resumes on the target: each partition, translated exactly",
    )
    _common(translate)
    translate.add_argument("--group", required=True, help="the consumer group (on the source)")
    translate.set_defaults(handler=_translate)

    checkpoints = commands.add_parser(
        "checkpoints", help="the latest checkpoint of each group and partition on the target"
    )
    _common(checkpoints)
    checkpoints.add_argument("--group", help="only this group")
    checkpoints.set_defaults(handler=_checkpoints)

    sync = commands.add_parser(
        "sync-groups",
        help="checkpoint the flow's groups now and commit them into the target's idle groups",
    )
    _common(sync)
    sync.add_argument("--group", action="append", help="only this group; repeatable")
    sync.add_argument(
        "--checkpoints-only", action="store_true", help="write checkpoints, commit no offsets"
    )
    sync.set_defaults(handler=_sync_groups)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=Path, help="flow files (mm2.properties, YAML)")
    parser.add_argument("--flow", required=True, help="the flow, e.g. primary->secondary")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _translate(args: argparse.Namespace) -> int:
    from mirrorflow.replication.remote_cluster import translate_group
    from mirrorflow.replication.spec import spec_for_flow

    rows = translate_group(spec_for_flow(args.files, args.flow), args.group)
    if args.json:
        _dump([r.as_dict() for r in rows])
        return 0
    if not rows:
        print(f"group {args.group} has no committed offsets on replicated topics of {args.flow}")
        return 0
    print(
        f"{'source partition':<32} {'committed':>10}  {'target partition':<40} {'resume at':>10}  "
        f"{'exactness':<17} {'checkpoint':>10} {'age':>7}"
    )
    for r in rows:
        age = f"{r.checkpoint_age_s:.0f}s" if r.checkpoint_age_s is not None else "-"
        print(
            f"{r.source_topic}-{r.partition:<{31 - len(r.source_topic)}} {r.committed:>10}  "
            f"{r.target_topic}-{r.partition:<{39 - len(r.target_topic)}} "
            f"{'-' if r.translated is None else r.translated:>10}  {r.exactness:<17} "
            f"{'-' if r.checkpoint is None else r.checkpoint:>10} {age:>7}"
        )
    return 0


def _checkpoints(args: argparse.Namespace) -> int:
    from mirrorflow.replication.remote_cluster import latest_checkpoints
    from mirrorflow.replication.spec import spec_for_flow

    rows = latest_checkpoints(spec_for_flow(args.files, args.flow), args.group)
    if args.json:
        _dump(rows)
        return 0
    for r in rows:
        print(
            f"{r['group']}  {r['topic']}-{r['partition']}  offset {r['offset']} "
            f"(source {r['upstream_offset']})  {r['age_s']:.0f}s ago"
        )
    if not rows:
        print("no checkpoints")
    return 0


def _sync_groups(args: argparse.Namespace) -> int:
    from mirrorflow.replication.group_offset_sync import sync_now
    from mirrorflow.replication.spec import spec_for_flow

    groups = set(args.group) if args.group else None
    written, report = sync_now(
        spec_for_flow(args.files, args.flow), groups, sync_offsets=not args.checkpoints_only
    )
    result: dict[str, Any] = {
        "checkpoints_written": written,
        "offsets_written": {
            g: {f"{t}-{p}": o for (t, p), o in tps.items()}
            for g, tps in (report.written if report else {}).items()
        },
        "active_groups_skipped": report.active if report else [],
    }
    if args.json:
        _dump(result)
    else:
        print(f"{written} checkpoints written")
        for group, offsets in result["offsets_written"].items():
            print(f"group {group}: committed {len(offsets)} offsets on the target")
        for group in result["active_groups_skipped"]:
            print(f"group {group}: has members on the target, left untouched")
    return 0


def _dump(value: object) -> None:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")
