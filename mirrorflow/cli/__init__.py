"""The ``mirrorflow`` command line: one subcommand module per area, registered here.

Every :class:`~mirrorflow.errors.MirrorflowError` ends as one line on stderr and exit code 2,
never as a bare stack trace.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mirrorflow.errors import MirrorflowError


def build_parser() -> argparse.ArgumentParser:
    from mirrorflow.cli import (
        checkpoints_cmd,
        demo_cmd,
        dr_cmd,
        flows_cmd,
        mirror_cmd,
        render_cmd,
        sandbox_cmd,
        setup_cmd,
        sync_cmd,
    )

    parser = argparse.ArgumentParser(
        prog="mirrorflow",
        description="Kafka replication with MirrorMaker 2 semantics on Airflow and Spark.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (
        setup_cmd,
        sandbox_cmd,
        flows_cmd,
        mirror_cmd,
        sync_cmd,
        checkpoints_cmd,
        dr_cmd,
        render_cmd,
        demo_cmd,
    ):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except MirrorflowError as exc:
        print(f"mirrorflow: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"mirrorflow: what to do: {exc.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        return 0


if __name__ == "__main__":
    sys.exit(main())
