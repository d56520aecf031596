"""``mirrorflow mirror FILE… --flow S->T [--flow …]``: run flows' Spark mirror job in the
foreground (several flows: one Spark application runs them all)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mirrorflow import paths
from mirrorflow.config import validation
from mirrorflow.config.topology import load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.runtime import jobs, launch


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "mirror",
        help="run flows' mirror job (SIGTERM/Ctrl-C: stop after the current batch)",
    )
    parser.add_argument("files", nargs="+", type=Path, help="flow files (mm2.properties, YAML)")
    parser.add_argument(
        "--flow",
        action="append",
        required=True,
        help="a flow to run, e.g. primary->secondary; repeatable (one Spark application)",
    )
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--once", action="store_true", help="copy what is there now, then exit")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the flows' local files: progress, stop and restart requests "
        "(default: $MIRRORFLOW_STATE/flows)",
    )
    parser.add_argument("--starting-offsets", help="new flows: earliest, latest or epoch ms")
    parser.add_argument("--max-records-per-batch", type=int, default=None)
    parser.add_argument(
        "--local-batch-max-records",
        type=int,
        default=None,
        help="copy a batch of at most this many records in the driver, without a Spark "
        "job (exactly once: not with record transforms); 0: never (default 1000, exactly "
        "once 50000)",
    )
    parser.add_argument(
        "--continuous",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="caught up, an at-least-once flow copies continuously in the driver's JVM "
        "(default); --no-continuous: batch after batch (docs/concepts.md, 'Continuous copying')",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the job's metrics for Prometheus at http://127.0.0.1:PORT/metrics; 0: none "
        "(default: $MIRRORFLOW_METRICS_PORT, else none)",
    )
    parser.add_argument(
        "--retry-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a flow retries a cluster that does not answer (backoff 2 s doubling to "
        "2 min) before it fails and the job exits; -1: forever (default 600)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=120.0,
        help="seconds a stop request waits for the current batch (default 120)",
    )
    parser.set_defaults(handler=_mirror)


def _mirror(args: argparse.Namespace) -> int:
    topology = load_topology(args.files)
    flows = list(dict.fromkeys(args.flow))
    for name in flows:
        flow = topology.flow(name)  # unknown clusters and flows end here
        if not flow.enabled:
            raise MirrorflowError(f"flow {name} is not enabled", f"set {name}.enabled = true")
    validation.require_valid(topology, "so no mirror job starts")
    state_dir = args.state_dir or paths.state_dir() / "flows"
    jobs.check_leases(state_dir, flows)  # another job runs one of them: say so before Spark
    stop_file = launch.stop_file_for(state_dir, flows)
    command = launch.mirror_command(
        args.files,
        flows,
        master=args.master,
        state_dir=state_dir,
        once=args.once,
        stop_file=stop_file,
        starting_offsets=args.starting_offsets,
        max_records_per_batch=args.max_records_per_batch,
        local_batch_max_records=args.local_batch_max_records,
        continuous=args.continuous,
        metrics_port=args.metrics_port,
        retry_timeout=args.retry_timeout,
    )
    handoff = launch.handed_over(args.files, flows)  # ${airflow:…} values, for the job alone
    try:
        return launch.supervise(command, stop_file, grace_s=args.grace, handoff=handoff)
    finally:
        launch.discard(handoff)
