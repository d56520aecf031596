"""``mirrorflow jars``: resolve the JVM artifacts (Kafka, Spark's connector, MirrorMaker 2)."""

from __future__ import annotations

import argparse

from mirrorflow import jvm


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "jars", help="fetch Kafka, Spark's Kafka connector and MirrorMaker 2 from Maven Central"
    )
    parser.set_defaults(handler=_jars)


def _jars(args: argparse.Namespace) -> int:
    print(jvm.resolve())
    jvm.copier_jar()
    return 0
