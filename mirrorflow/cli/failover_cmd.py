"""``mirrorflow failover``: the failover DAG's steps from a shell, in order, with the same run
record and report (:mod:`mirrorflow.dr.failover`)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "failover",
        help="fail a flow's consumer groups over to its target (the failover DAG's steps)",
    )
    parser.add_argument("files", nargs="+", type=Path, help="flow files (mm2.properties, YAML)")
    parser.add_argument("--flow", required=True, help="the flow, e.g. primary->secondary")
    parser.add_argument(
        "--mode",
        choices=("planned", "emergency", "auto"),
        default="planned",
        help="planned (the source is up; default), emergency (it is not), auto (decide)",
    )
    parser.add_argument(
        "--groups", default=".*", help="a regex of the groups to fail over (default: all)"
    )
    parser.add_argument(
        "--fence",
        action="append",
        default=[],
        metavar="PRINCIPAL",
        help="deny WRITE on the source topics to this principal (planned); repeatable",
    )
    parser.add_argument("--dry-run", action="store_true", help="compute and report; change nothing")
    parser.add_argument(
        "--catch-up-timeout", type=float, default=300.0, help="seconds (default 300)"
    )
    parser.add_argument("--run-id", help="the run's name (default cli__<UTC time>)")
    parser.add_argument("--state-dir", help="the flows' state directory of the mirror job")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=_failover)


def _failover(args: argparse.Namespace) -> int:
    from mirrorflow.dr.failover import FailoverRequest, run_all
    from mirrorflow.dr.report import report_context

    run_id = args.run_id or "cli__" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    request = FailoverRequest(
        flow=args.flow,
        flow_files=tuple(str(p.resolve()) for p in args.files),
        run_id=run_id,
        mode=args.mode,
        group_pattern=args.groups,
        fence_principals=tuple(args.fence),
        dry_run=args.dry_run,
        catch_up_timeout_s=args.catch_up_timeout,
        state_dir=args.state_dir,
    )
    quiet = args.json
    run = run_all(request, log=(lambda line: None) if quiet else print)
    if quiet:
        print(json.dumps(report_context(run), indent=1, sort_keys=True))
    return 0
