"""``mirrorflow render``: Airflow DAG files from flow files, and a check that they are fresh."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mirrorflow.airflow import rendering

_EPILOG = """\
One DAG file per enabled flow and DAG kind, named <kind>__<source>__<target>.py. The output is
byte-identical for the same input; files in the folder that render did not generate are left
alone, generated ones that no flow renders any more are removed (or, with --check, reported).

exit codes: 0 up to date (or written), 1 --check found stale, missing or extra files,
2 errors (a flow file that cannot be read or does not validate)"""


def register(commands: argparse._SubParsersAction) -> None:
    defaults = rendering.RenderOptions()
    parser = commands.add_parser(
        "render",
        help="generate the Airflow DAGs of the enabled flows (or --check they are fresh)",
        description="Render Airflow DAG files for every enabled flow of the flow files.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", metavar="FILE", nargs="+", type=Path, help="flow files")
    parser.add_argument(
        "--out", type=Path, default=Path("dags"), help="output folder (default: dags)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 listing stale, missing and extra generated files",
    )
    parser.add_argument(
        "--spark-conn-id",
        default=defaults.spark_conn_id,
        help=f"Airflow connection of the Spark master (default {defaults.spark_conn_id})",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=defaults.retries,
        help=f"restarts of a failed job within one run (default {defaults.retries})",
    )
    parser.add_argument(
        "--retry-delay",
        type=int,
        default=defaults.retry_delay_seconds,
        metavar="SECONDS",
        help=f"first restart delay, doubled each time (default {defaults.retry_delay_seconds})",
    )
    parser.add_argument(
        "--max-retry-delay",
        type=int,
        default=defaults.max_retry_delay_seconds,
        metavar="SECONDS",
        help=f"longest restart delay (default {defaults.max_retry_delay_seconds})",
    )
    parser.add_argument(
        "--stop-grace",
        type=int,
        default=defaults.stop_grace_seconds,
        metavar="SECONDS",
        help="how long a stop waits for the batch in progress "
        f"(default {defaults.stop_grace_seconds})",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=defaults.metrics_port,
        metavar="PORT",
        help="the site jobs serve Prometheus metrics on 127.0.0.1: the first mirror DAG (in "
        "target order) on PORT, the next on PORT+1, ... (default 0: off)",
    )
    parser.add_argument(
        "--retry-timeout",
        type=int,
        default=defaults.retry_timeout_seconds,
        metavar="SECONDS",
        help="how long the mirror job retries a cluster that does not answer before it fails "
        f"the task; -1: forever (default {defaults.retry_timeout_seconds})",
    )
    parser.add_argument(
        "--drill-schedule",
        default=defaults.drill_schedule,
        metavar="CRON",
        help="run each flow's DR drill DAG, non-destructive, on this schedule (a cron expression "
        "or a preset such as @weekly; default: only when triggered)",
    )
    parser.set_defaults(handler=_render)


def _render(args: argparse.Namespace) -> int:
    options = rendering.RenderOptions(
        spark_conn_id=args.spark_conn_id,
        retries=args.retries,
        retry_delay_seconds=args.retry_delay,
        max_retry_delay_seconds=args.max_retry_delay,
        stop_grace_seconds=args.stop_grace,
        metrics_port=args.metrics_port,
        retry_timeout_seconds=args.retry_timeout,
        drill_schedule=args.drill_schedule,
    )
    result = rendering.render(args.files, options)
    for finding in result.warnings:
        print(finding, file=sys.stderr)
    out = args.out
    if args.check:
        drift = rendering.check(result, out)
        if drift:
            for line in drift.lines():
                print(line)
            command = ["mirrorflow render", *map(str, args.files), *options.cli_args()]
            print(f"{out} is out of date: run `{' '.join(command)} --out {out}`")
            return 1
        print(f"{out}: {len(result.dags)} DAG file(s) up to date")
        return 0
    drift = rendering.write(result, out)
    for dag in result.dags:
        state = "written" if dag.filename in drift.stale + drift.missing else "unchanged"
        print(f"{out / dag.filename}: {state} (flow {dag.flow}, DAG {dag.dag_id})")
    for name in drift.extra:
        print(f"{out / name}: removed (no enabled flow renders it)")
    return 0
