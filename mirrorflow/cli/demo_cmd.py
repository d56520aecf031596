"""``mirrorflow demo``: the README's main command, on the embedded defaults.

For now it starts the two sandbox clusters of the active/passive example (``primary`` and
``secondary``), puts sample records on ``primary`` and prints how to reach everything;
``mirrorflow demo down`` stops what it started.
"""

from __future__ import annotations

import argparse
import time

from mirrorflow import paths, sandbox

DEMO_CLUSTERS = ("primary", "secondary")
DEMO_TOPIC = "orders"


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("demo", help="run the end-to-end demo on local clusters")
    parser.add_argument("action", nargs="?", choices=("up", "down"), default="up")
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    directory = paths.state_dir() / "sandbox"
    if args.action == "down":
        stopped = sandbox.down(directory)
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        return 0
    started = time.monotonic()
    box = sandbox.up(DEMO_CLUSTERS, directory)
    print(f"clusters ready in {time.monotonic() - started:.1f}s:")
    for cluster in box.clusters.values():
        print(f"  {cluster.name:<10} {cluster.bootstrap_servers}  log: {cluster.log_file}")
    count = _produce_samples(box["primary"])
    print(f"produced {count} sample records to '{DEMO_TOPIC}' on primary")
    print(f"client settings (passwords inside): {box.directory / sandbox.STATE_FILE}")
    print("stop everything with: mirrorflow demo down")
    return 0


def _produce_samples(cluster: sandbox.Cluster, count: int = 100) -> int:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(cluster.client_config())
    if DEMO_TOPIC not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(DEMO_TOPIC, 3, 1)])[DEMO_TOPIC].result(timeout=30)
    producer = Producer(cluster.client_config())
    for i in range(count):
        producer.produce(DEMO_TOPIC, key=f"order-{i}".encode(), value=f'{{"id": {i}}}'.encode())
    producer.flush(30)
    return count
