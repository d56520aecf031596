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

# The metavar and help of each RenderOptions field's option (rendering.OPTION_FLAGS), {default}
# its default.
_OPTION_HELP = {
    "spark_conn_id": (None, "Airflow connection of the Spark master (default {default})"),
    "retries": (None, "restarts of a failed job within one run (default {default})"),
    "retry_delay_seconds": (
        "SECONDS",
        "first restart delay, doubled each time (default {default})",
    ),
    "max_retry_delay_seconds": ("SECONDS", "longest restart delay (default {default})"),
    "stop_grace_seconds": (
        "SECONDS",
        "how long a stop waits for the batch in progress (default {default})",
    ),
    "metrics_port": (
        "PORT",
        "the site jobs serve Prometheus metrics on 127.0.0.1: the first mirror DAG (in target "
        "order) on PORT, the next on PORT+1, ... (default 0: off)",
    ),
    "retry_timeout_seconds": (
        "SECONDS",
        "how long the mirror job retries a cluster that does not answer before it fails the "
        "task; -1: forever (default {default})",
    ),
    "drill_schedule": (
        "CRON",
        "run each flow's DR drill DAG, non-destructive, on this schedule (a cron expression or "
        "a preset such as @weekly; default: only when triggered)",
    ),
}


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
    for name, flag in rendering.OPTION_FLAGS.items():
        metavar, text = _OPTION_HELP[name]
        default = getattr(defaults, name)
        parser.add_argument(
            flag,
            dest=name,
            type=type(default),
            default=default,
            metavar=metavar,
            help=text.format(default=default),
        )
    parser.set_defaults(handler=_render)


def _render(args: argparse.Namespace) -> int:
    options = rendering.RenderOptions(
        **{name: getattr(args, name) for name in rendering.OPTION_FLAGS}
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
