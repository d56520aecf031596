"""``mirrorflow failback``: the failback DAG's steps from a shell, in order, with the same run
record and report (:mod:`mirrorflow.dr.failback`)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "failback",
        help="back to a flow's source after its failover (the failback DAG's steps)",
    )
    parser.add_argument("files", nargs="+", type=Path, help="flow files (mm2.properties, YAML)")
    parser.add_argument(
        "--flow", required=True, help="the flow failed over, e.g. primary->secondary"
    )
    parser.add_argument(
        "--groups", default=".*", help="a regex of the groups to move back (default: all)"
    )
    parser.add_argument(
        "--fence",
        action="append",
        default=[],
        metavar="PRINCIPAL",
        help="deny WRITE on the DR cluster's copied topics to this principal; repeatable",
    )
    parser.add_argument("--dry-run", action="store_true", help="compute and report; change nothing")
    parser.add_argument("--failover-run", default="", help="the failover to undo (default: latest)")
    parser.add_argument("--run-id", help="the run's name (default cli__<UTC time>)")
    parser.add_argument("--state-dir", help="the flows' state directory of the mirror job")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=_failback)


def _failback(args: argparse.Namespace) -> int:
    from mirrorflow.dr.failback import FailbackRequest, report_context, run_all

    run_id = args.run_id or "cli__" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    request = FailbackRequest(
        flow=args.flow,
        flow_files=tuple(str(p.resolve()) for p in args.files),
        run_id=run_id,
        group_pattern=args.groups,
        fence_principals=tuple(args.fence),
        dry_run=args.dry_run,
        failover_run_id=args.failover_run,
        state_dir=args.state_dir,
    )
    quiet = args.json
    run = run_all(request, log=(lambda line: None) if quiet else print)
    if quiet:
        print(json.dumps(report_context(run), indent=1, sort_keys=True))
    return 0
