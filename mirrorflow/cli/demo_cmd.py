"""``mirrorflow demo [up|down]``: the end-to-end demo (see :mod:`mirrorflow.devtools.demo`)."""

from __future__ import annotations

import argparse

from mirrorflow import paths
from mirrorflow.devtools import demo, sandbox
from mirrorflow.devtools.local_airflow import DEFAULT_PORT


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="run the end-to-end demo: two local clusters replicated by Airflow and Spark",
        description=(demo.__doc__ or "").split("\n\n", 1)[1].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", nargs="?", choices=("up", "down"), default="up")
    parser.add_argument(
        "--detach", action="store_true", help="return once records replicate; stop with down"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"Airflow UI port (default {DEFAULT_PORT}, else the next free one)",
    )
    parser.add_argument(
        "--records", type=int, default=100, help="sample records to produce (default 100)"
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=sandbox.DEFAULT_BASE_PORT,
        help=f"first port of the clusters (default {sandbox.DEFAULT_BASE_PORT})",
    )
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    session = demo.Demo(paths.state_dir())
    if args.action == "down":
        session.down()
        return 0
    try:
        session.up(port=args.port, records=args.records, base_port=args.base_port)
        if args.detach:
            print("everything keeps running; stop it with: mirrorflow demo down")
            return 0
        print("\nlive: a new order every 3 seconds (Ctrl-C stops everything the demo started)")
        session.live()
    except KeyboardInterrupt:
        print("\nCtrl-C: stopping everything the demo started")
        session.down()
        return 130
    return 0
