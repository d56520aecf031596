"""``mirrorflow jars``: resolve the JVM artifacts (Kafka, Spark's connector, MirrorMaker 2),
compile mirrorflow's copier and make the driver's class archive."""

from __future__ import annotations

import argparse

from mirrorflow.runtime import driver_archive, jvm


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "jars",
        help="fetch Kafka, Spark's Kafka connector and MirrorMaker 2 from Maven Central; "
        "compile the copier; make the driver's class archive",
    )
    parser.set_defaults(handler=_jars)


def _jars(args: argparse.Namespace) -> int:
    print(jvm.resolve())
    jvm.copier_jar()
    driver_archive.ensure()
    return 0
