"""Spark entry point of a mirror job: replicate flows (``A->B``) of a flow definition.

    spark-submit [--master local[*]|spark://host:7077] spark_jobs/mirror.py \\
        --config mm2.properties --flow primary->secondary [--flow ...] [--once] [--stop-file PATH]
        [--max-records-per-batch N] [--local-batch-max-records N] [--metrics-port PORT]
        [--retry-timeout SECONDS] [--no-continuous]

One application runs every flow it is given, as MirrorMaker 2 runs a site's flows in one process
(:mod:`mirrorflow.runtime.application`). Credentials stay in the flow definition (or the secret
references it names) and never appear on this command line. The logic lives in
:mod:`mirrorflow.runtime.driver`; the flows' positions live in ``mm2-offsets.<source>.internal``
on their targets, as MirrorMaker 2's do. The driver dies with the JVM that started it, and holds
each flow's lease while it runs (:func:`mirrorflow.runtime.jobs.hold_leases`): a second job of a
flow ends at start in one line naming the one running it.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
from pathlib import Path

from mirrorflow import paths
from mirrorflow.errors import MirrorflowError


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mirror", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        action="append",
        required=True,
        type=Path,
        help="flow definition (mm2.properties or YAML); repeatable",
    )
    parser.add_argument(
        "--flow",
        action="append",
        required=True,
        help="a flow to run, e.g. primary->secondary; repeatable: one application runs them all",
    )
    parser.add_argument(
        "--once", action="store_true", help="copy everything available now, then exit"
    )
    parser.add_argument(
        "--stop-file",
        type=Path,
        help="end every flow after its current batch once this file exists",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where the flows' local files live (default: $MIRRORFLOW_STATE/flows)",
    )
    parser.add_argument(
        "--starting-offsets",
        default=None,
        help="for a flow with no progress yet: earliest, latest, or epoch ms",
    )
    parser.add_argument(
        "--max-records-per-batch",
        type=int,
        default=None,
        help="upper bound of records per batch (default 500000)",
    )
    parser.add_argument(
        "--local-batch-max-records",
        type=int,
        default=None,
        help="a batch of at most this many records is copied in the driver (at least once: its "
        "JVM; exactly once: its Python, without record transforms), without a Spark job; 0: "
        "always a Spark job (default 1000, exactly once 50000)",
    )
    parser.add_argument(
        "--continuous",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="caught up, an at-least-once flow copies continuously in the driver's JVM "
        "(default); --no-continuous: batch after batch (docs/concepts.md, 'Continuous copying')",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve metrics for Prometheus at http://127.0.0.1:PORT/metrics; 0: none "
        "(default: $MIRRORFLOW_METRICS_PORT, else none)",
    )
    parser.add_argument(
        "--retry-timeout",
        type=float,
        default=None,
        help="how long a flow retries a cluster that does not answer before it fails, in "
        "seconds; -1: forever (default 600)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from mirrorflow.runtime import guard
    from mirrorflow.runtime.guard import die_with_parent

    die_with_parent()  # the JVM that runs this driver is its Spark: without it, nothing to do
    args = parse_args(sys.argv[1:] if argv is None else argv)
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # kill -USR2: where is it stuck?
    faulthandler.enable()  # a crash in a C library (librdkafka) says where, in the job's log
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        from mirrorflow.runtime import spark_session

        spark_session.prefer_installed_pyspark()
        from mirrorflow.config import providers
        from mirrorflow.replication.spec import spec_for_flow
        from mirrorflow.runtime import jobs
        from mirrorflow.runtime.application import Application
        from mirrorflow.runtime.metrics import port_from

        handed = providers.receive_handoff()  # what the launcher resolved (${airflow:…})
        if handed:
            logging.getLogger("mirrorflow").info(
                "%d config-provider value(s) handed over by the launcher", handed
            )
        state_dir = args.state_dir or paths.state_dir() / "flows"
        specs = []
        for flow in dict.fromkeys(args.flow):  # each flow once, in the order given
            spec = spec_for_flow(
                args.config, flow, state_dir=state_dir, starting_offsets=args.starting_offsets
            )
            if args.max_records_per_batch:
                spec.max_records_per_batch = args.max_records_per_batch
            if args.local_batch_max_records is not None:
                spec.local_batch_max_records = args.local_batch_max_records
            spec.continuous = args.continuous
            if args.retry_timeout is not None:
                spec.retry_timeout_s = args.retry_timeout
            specs.append(spec)
        _leases = jobs.hold_leases(state_dir, [s.flow for s in specs])  # held until exit
        spark = spark_session.JobSpark(f"mirrorflow {', '.join(s.flow for s in specs)}")
        spark.context.setLogLevel("WARN")
        application = Application(
            spark,
            specs,
            once=args.once,
            stop_file=args.stop_file,
            metrics_port=port_from(args.metrics_port),
        )
        guard.copying()  # from now on, a launcher that dies leaves the job its grace period
        code = application.run()
    except MirrorflowError as exc:
        print(f"mirrorflow: error: {exc}", file=sys.stderr)
        return 2
    for flow in application.flows:
        if flow.error is not None:
            print(f"mirrorflow: error: {flow.error}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
