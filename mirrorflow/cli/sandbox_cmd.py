"""``mirrorflow sandbox up|status|down|kill``: local Kafka clusters on loopback."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mirrorflow import paths
from mirrorflow.devtools import sandbox


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("sandbox", help="start, inspect and stop local Kafka clusters")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="sandbox directory (default: $MIRRORFLOW_STATE/sandbox, i.e. .mirrorflow/sandbox)",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start clusters and wait until each serves metadata")
    up.add_argument(
        "--clusters",
        default="primary,secondary",
        help="comma-separated cluster names (default: primary,secondary)",
    )
    up.add_argument("--base-port", type=int, default=sandbox.DEFAULT_BASE_PORT)
    up.add_argument("--heap", default=sandbox.DEFAULT_HEAP, help="broker heap (default 512m)")
    up.set_defaults(handler=_up)
    status = actions.add_parser("status", help="show each cluster and whether it runs")
    status.set_defaults(handler=_status)
    down = actions.add_parser("down", help="stop the clusters that 'up' started")
    down.add_argument(
        "--clusters", default="", help="comma-separated cluster names (default: all of them)"
    )
    down.set_defaults(handler=_down)
    kill = actions.add_parser("kill", help="SIGKILL clusters' brokers (a crash, for DR drills)")
    kill.add_argument("--clusters", required=True, help="comma-separated cluster names")
    kill.set_defaults(handler=_kill)


def _dir(args: argparse.Namespace) -> Path:
    return args.dir or paths.state_dir() / "sandbox"


def _up(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.clusters.split(",") if n.strip()]
    started = time.monotonic()
    box = sandbox.up(names, _dir(args), base_port=args.base_port, heap=args.heap)
    print(f"sandbox ready in {time.monotonic() - started:.1f}s")
    _print(box)
    return 0


def _status(args: argparse.Namespace) -> int:
    box = sandbox.load(_dir(args))
    if not box.clusters:
        print(f"no sandbox clusters in {_dir(args)}")
        return 0
    _print(box)
    return 0 if all(c.is_running() for c in box.clusters.values()) else 1


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _down(args: argparse.Namespace) -> int:
    stopped = sandbox.down(_dir(args), _names(args.clusters) or None)
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def _kill(args: argparse.Namespace) -> int:
    killed = sandbox.kill(_dir(args), _names(args.clusters))
    for name, at in killed.items():  # a drill times its RTO from this moment
        print(f"killed: {name} (SIGKILL at {at:.3f})")
    if not killed:
        print("killed: nothing was running")
    return 0


def _print(box: sandbox.Sandbox) -> None:
    for c in box.clusters.values():
        state = "running" if c.is_running() else "stopped"
        print(
            f"  {c.name:<12} {state:<8} bootstrap={c.bootstrap_servers} "
            "security=SASL_PLAINTEXT/PLAIN users=" + ",".join(c.passwords) + f" log={c.log_file}"
        )
    print(
        f"connection settings (passwords inside, mode 0600): {box.directory / sandbox.STATE_FILE}"
    )
    print(f"as MirrorMaker 2 properties: {box.directory / 'clusters.properties'}")
