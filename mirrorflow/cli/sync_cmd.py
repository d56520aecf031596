"""``mirrorflow sync FILE… [--flow S->T …] [--dry-run] [--json]``: bring the remote topics'
configs, partition counts and ACLs in line with their sources, by MirrorMaker 2's rules (plus the
prefixed and group ACLs a failover needs), diff first."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mirrorflow.config.topology import load_topology
from mirrorflow.errors import MirrorflowError


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "sync",
        help="sync remote topics' configs, partitions and ACLs with their sources (diff first)",
    )
    parser.add_argument("files", nargs="+", type=Path, help="flow files (mm2.properties, YAML)")
    parser.add_argument(
        "--flow",
        action="append",
        help="a flow to sync, e.g. primary->secondary; repeatable (default: every enabled flow)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would change, change nothing"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_sync)


def _sync(args: argparse.Namespace) -> int:
    from mirrorflow.replication.config_sync import run_syncs
    from mirrorflow.replication.spec import spec_for_flow

    topology = load_topology(args.files)
    names = list(dict.fromkeys(args.flow or [f.name for f in topology.flows]))
    if not names:
        raise MirrorflowError(
            "no flow is enabled", "enable one with `SOURCE->TARGET.enabled = true`"
        )
    reports = []
    for name in names:
        done, off = run_syncs(spec_for_flow(args.files, name), args.dry_run)
        reports += done
        if not args.json:
            for key in off:
                print(f"{name}: {key} = false: not synced")
    if args.json:
        json.dump([r.as_dict() for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for report in reports:
            print("\n".join(report.lines()))
    failures = [f"{r.flow}: {f}" for r in reports for f in r.failures]
    for failure in failures:
        print(f"mirrorflow: error: {failure}", file=sys.stderr)
    return 2 if failures else 0
