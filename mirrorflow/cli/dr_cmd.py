"""``mirrorflow failover`` and ``mirrorflow failback``: a DR workflow's DAG steps from a shell, in
order, with the same run record and report (:mod:`mirrorflow.dr.failover`,
:mod:`mirrorflow.dr.failback`, run by :meth:`mirrorflow.dr.steps.Workflow.run_all`).

Both commands take the flow files, ``--flow``, ``--groups``, ``--fence``, ``--dry-run``,
``--failover-run``, ``--run-id``, ``--state-dir`` and ``--json``; the failover adds ``--mode``
(with ``rollback`` and ``measure-rpo``, which act on the failover run ``--failover-run``),
``--catch-up-timeout`` and ``--stop-timeout``. Each option's ``dest`` is the request's field it
sets, so one runner builds either request.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def register(commands: argparse._SubParsersAction) -> None:
    failover = _command(
        commands,
        "failover",
        help="fail a flow's consumer groups over to its target (the failover DAG's steps)",
        flow_help="the flow, e.g. primary->secondary",
        groups_help="a regex of the groups to fail over (default: all)",
        fence_help="deny WRITE on the source topics to this principal (planned); repeatable",
        after_flow=lambda parser: parser.add_argument(
            "--mode",
            choices=("planned", "emergency", "auto", "rollback", "measure-rpo"),
            default="planned",
            help="planned (the source is up; default), emergency (it is not), auto (decide); "
            "rollback (release what the failover run --failover-run held), measure-rpo (count "
            "on the source, once back, the records that run's cut left behind)",
        ),
        failover_run_help="modes rollback and measure-rpo: the failover run (default: "
        "rollback, the one whose hold the flow has; measure-rpo, the latest)",
    )
    failover.add_argument(
        "--catch-up-timeout",
        dest="catch_up_timeout_s",
        metavar="CATCH_UP_TIMEOUT",
        type=float,
        default=300.0,
        help="seconds (default 300)",
    )
    failover.add_argument(
        "--stop-timeout",
        dest="stop_timeout_s",
        metavar="STOP_TIMEOUT",
        type=float,
        default=30.0,
        help="seconds stop-mirror waits for the mirror job to stop the flow (default 30)",
    )
    _common_tail(failover)
    failback = _command(
        commands,
        "failback",
        help="back to a flow's source after its failover (the failback DAG's steps)",
        flow_help="the flow failed over, e.g. primary->secondary",
        groups_help="a regex of the groups to move back (default: all)",
        fence_help="deny WRITE on the DR cluster's copied topics to this principal; repeatable",
        failover_run_help="the failover to undo (default: latest)",
    )
    _common_tail(failback)


def _command(
    commands: argparse._SubParsersAction,
    kind: str,
    *,
    help: str,
    flow_help: str,
    groups_help: str,
    fence_help: str,
    failover_run_help: str,
    after_flow=None,
) -> argparse.ArgumentParser:
    parser = commands.add_parser(kind, help=help)
    parser.add_argument("files", nargs="+", type=Path, help="flow files (mm2.properties, YAML)")
    parser.add_argument("--flow", required=True, help=flow_help)
    if after_flow is not None:
        after_flow(parser)
    parser.add_argument(
        "--groups", dest="group_pattern", metavar="GROUPS", default=".*", help=groups_help
    )
    parser.add_argument(
        "--fence",
        dest="fence_principals",
        action="append",
        default=[],
        metavar="PRINCIPAL",
        help=fence_help,
    )
    parser.add_argument("--dry-run", action="store_true", help="compute and report; change nothing")
    parser.add_argument(
        "--failover-run",
        dest="failover_run_id",
        metavar="FAILOVER_RUN",
        default="",
        help=failover_run_help,
    )
    parser.set_defaults(handler=run, kind=kind)
    return parser


def _common_tail(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-id", help="the run's name (default cli__<UTC time>)")
    parser.add_argument("--state-dir", help="the flows' state directory of the mirror job")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Run the workflow ``args.kind`` with the request the options make; with ``--json``, print
    the report's context instead of the steps' lines."""
    from mirrorflow.dr.steps import workflow

    dr = workflow(args.kind)
    options = vars(args)
    fields = {f.name for f in dataclasses.fields(dr.request_class)} - {"flow_files", "run_id"}
    chosen: dict[str, Any] = {
        name: tuple(value) if isinstance(value, list) else value
        for name, value in options.items()
        if name in fields
    }
    request = dr.request_class(
        flow_files=tuple(str(p.resolve()) for p in args.files),
        run_id=args.run_id or "cli__" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        **chosen,
    )
    quiet = args.json
    record = dr.run_all(request, log=(lambda line: None) if quiet else print)
    if quiet:
        print(json.dumps(record.report_context(), indent=1, sort_keys=True))
    return 0
