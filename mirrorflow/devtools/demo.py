"""The demo (``mirrorflow demo``, README's main command): end to end on the embedded defaults.

``up`` starts the two sandbox clusters of the active/passive example (``primary``,
``secondary``), initialises a local Airflow (SQLite, LocalExecutor) in ``.mirrorflow/airflow``,
renders the DAGs of ``examples/active-passive.properties``, starts Airflow's services, unpauses
the mirror DAG of ``secondary``, produces sample records on ``primary`` and shows them arriving
on ``secondary`` as ``primary.orders``. ``live`` then keeps a record flowing every few seconds;
``down`` stops everything the demo started, from any shell.
"""

from __future__ import annotations

import time
from pathlib import Path

from mirrorflow import paths
from mirrorflow.airflow import rendering
from mirrorflow.devtools import sandbox
from mirrorflow.devtools.local_airflow import UI_USER, LocalAirflow
from mirrorflow.errors import MirrorflowError
from mirrorflow.runtime import jobs

DEMO_CLUSTERS = ("primary", "secondary")
DEMO_TOPIC = "orders"
EXAMPLE = paths.PROJECT_ROOT / "examples" / "active-passive.properties"
FLOW = "primary->secondary"
STOPPING_FILE = "demo-stopping"
"""Present while ``demo down`` runs, so a demo in another terminal ends quietly instead of
reporting the services it stops as failures."""


class Demo:
    """The demo's clusters, Airflow services and mirror job, found through its state files."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.home = state / "airflow"
        self.sandbox_dir = state / "sandbox"
        self.flows_dir = state / "flows"  # the mirror jobs' state (MIRRORFLOW_STATE below)
        self.started = time.monotonic()
        self.box: sandbox.Sandbox | None = None
        self.airflow = LocalAirflow(self.home, state, say=self._say)
        self.dag_id = ""

    # -- up ----------------------------------------------------------------------------------
    def up(self, port: int | None, records: int, base_port: int) -> None:
        self._require_project_state()
        paths.private_dir(self.state)  # the sandbox's and Airflow's secrets live below
        (self.home / STOPPING_FILE).unlink(missing_ok=True)
        self.box = sandbox.up(DEMO_CLUSTERS, self.sandbox_dir, base_port=base_port)
        self._say(f"clusters ready: {self._clusters()}")
        self._check_example_resolves()
        self.airflow.choose_port(port)
        self.airflow.migrate()
        dag_ids = self._render()
        self.airflow.start_services()
        self.airflow.wait_for_api()
        api = self.airflow.api()
        self.airflow.wait_for_dags(api, dag_ids)
        count = produce_samples(self.box["primary"], records)
        self._say(f"produced {count} sample records to '{DEMO_TOPIC}' on primary")
        api.unpause(self.dag_id)
        unpaused = time.monotonic()
        self._say(f"unpaused the DAG {self.dag_id}: Airflow starts the Spark mirror job")
        remote = f"primary.{DEMO_TOPIC}"
        first = wait_for_records(
            self.box["secondary"], remote, 1, timeout=600, service=self.airflow
        )
        now = time.monotonic()
        self._say(
            f"first replicated record on secondary after {now - unpaused:.0f}s "
            f"({now - self.started:.0f}s since the demo started)"
        )
        for partition, offset, key, value in first[:1]:
            print(f"  {remote} [partition {partition}, offset {offset}] {key} = {value}")
        arrived = wait_for_records(
            self.box["secondary"], remote, count, timeout=300, service=self.airflow
        )
        self._say(f"{len(arrived)} records on secondary as '{remote}', for example:")
        for partition, offset, key, value in arrived[:5]:
            print(f"  {remote} [partition {partition}, offset {offset}] {key} = {value}")
        self._print_access()

    def _say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f}s] {text}", flush=True)

    def _clusters(self) -> str:
        assert self.box is not None
        return ", ".join(f"{c.name} {c.bootstrap_servers}" for c in self.box.clusters.values())

    def _require_project_state(self) -> None:
        expected = paths.PROJECT_ROOT / ".mirrorflow"
        if self.state.resolve() != expected.resolve():
            raise MirrorflowError(
                f"the demo's example reads the sandbox's settings from {expected}/sandbox, "
                f"but MIRRORFLOW_STATE puts state in {self.state}",
                "unset MIRRORFLOW_STATE to run the demo",
            )

    def _check_example_resolves(self) -> None:
        """The example's ${file:…} references must reach this sandbox, from the project root
        (where the mirror job runs), before Airflow is involved."""
        from mirrorflow.config.topology import Role, load_topology

        assert self.box is not None
        flow = load_topology([EXAMPLE], base_dir=paths.PROJECT_ROOT).flow(FLOW)
        sides: tuple[tuple[Role, str], ...] = (
            ("source.admin", "primary"),
            ("target.admin", "secondary"),
        )
        for role, cluster in sides:
            client = flow.client_config(role, librdkafka=True)
            if client.get("bootstrap.servers") != self.box[cluster].bootstrap_servers:
                raise MirrorflowError(
                    f"{EXAMPLE.name} resolves {cluster}'s bootstrap.servers to "
                    f"{client.get('bootstrap.servers')}, not the sandbox's "
                    f"{self.box[cluster].bootstrap_servers}",
                    "check .mirrorflow/sandbox/clusters.properties",
                )
        self._say(f"{EXAMPLE.relative_to(paths.PROJECT_ROOT)}: its secret references resolve")

    def _render(self) -> list[str]:
        """Render the example's DAGs; the mirror DAG (the one to unpause) becomes ``dag_id``."""
        result = rendering.render([EXAMPLE])
        rendering.write(result, self.airflow.dags_folder)
        (self.dag_id,) = [d.dag_id for d in result.dags if d.kind == "mirror"]
        dag_ids = [d.dag_id for d in result.dags]
        self._say(f"rendered the DAGs {', '.join(dag_ids)} into {self.airflow.dags_folder}")
        return dag_ids

    def _print_access(self) -> None:
        password_file = self.airflow.password_file
        print(
            f"\nAirflow UI:  http://127.0.0.1:{self.airflow.port}/dags/{self.dag_id}\n"
            f"  login:     user '{UI_USER}', password in {password_file}\n"
            f"  the job:   DAG {self.dag_id} > task 'mirror' > Logs (Spark's output)\n"
            f"health:      http://127.0.0.1:{self.airflow.port}/plugin/mirrorflow "
            "(Browse > Replication: each flow's state, lag, heartbeat)\n"
            f"clusters:    {self._clusters()} (settings: {self.sandbox_dir / 'clusters.json'})"
        )

    # -- live --------------------------------------------------------------------------------
    def live(self) -> None:
        """Produce a record every few seconds and show when it arrives, until Ctrl-C."""
        from mirrorflow.replication import clients

        assert self.box is not None
        primary, secondary = self.box["primary"], self.box["secondary"]
        producer = clients.producer(primary.name, primary.client_config())
        consumer = clients.consumer(
            secondary.name,
            {
                **secondary.client_config(),
                "group.id": "mirrorflow-demo-live",
                "auto.offset.reset": "latest",
                "enable.auto.commit": False,
            },
        )
        consumer.subscribe([f"primary.{DEMO_TOPIC}"])
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.5)  # join the group first: records sent before would be missed
        sent: dict[bytes, float] = {}
        number = 0
        try:
            while True:
                if (self.home / STOPPING_FILE).exists():
                    print("`mirrorflow demo down` is stopping the demo")
                    return
                self.airflow.check_services()
                key = f"live-{number}".encode()
                producer.produce(DEMO_TOPIC, key=key, value=b'{"live": true}')
                producer.flush(10)
                sent[key] = time.monotonic()
                number += 1
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    message = consumer.poll(0.5)
                    if message is None or message.error():
                        continue
                    arrived = message.key()
                    if arrived is None or arrived not in sent:
                        continue
                    latency = time.monotonic() - sent.pop(arrived)
                    print(
                        f"  {arrived.decode()}: produced on primary, on secondary as "
                        f"primary.{DEMO_TOPIC} {latency:.1f}s later"
                    )
        finally:
            consumer.close()
            producer.flush(5)
            del producer  # before the clusters stop, or it logs their disconnection

    # -- down --------------------------------------------------------------------------------
    def down(self) -> None:
        if self.home.is_dir():
            (self.home / STOPPING_FILE).touch()
        try:
            self._down()
        finally:
            (self.home / STOPPING_FILE).unlink(missing_ok=True)

    def _down(self) -> None:
        running = self.airflow.running_services()
        self.airflow.port = self.airflow.recorded_port() or self.airflow.port
        if "api-server" in running:
            try:
                api = self.airflow.api()
                for dag in rendering.render([EXAMPLE]).dags:
                    api.pause(dag.dag_id)  # no new run starts once the job stops
            except (MirrorflowError, OSError):
                pass
        for job in jobs.stop_all(self.flows_dir, grace=60):
            print(f"stopped the mirror job of {job}")
        self.airflow.stop_services(("scheduler", "triggerer", "dag-processor", "api-server"))
        for job in jobs.stop_all(self.flows_dir, grace=60):  # one started meanwhile, if any
            print(f"stopped the mirror job of {job}")
        known = sandbox.load(self.sandbox_dir).clusters
        clusters = sandbox.down(self.sandbox_dir, [c for c in DEMO_CLUSTERS if c in known])
        print("stopped clusters: " + (", ".join(clusters) if clusters else "none was running"))


def produce_samples(cluster: sandbox.Cluster, count: int = 100) -> int:
    from confluent_kafka.admin import NewTopic

    from mirrorflow.replication import clients

    admin = clients.admin(cluster.name, cluster.client_config())
    if DEMO_TOPIC not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(DEMO_TOPIC, 3, 1)])[DEMO_TOPIC].result(timeout=30)
    producer = clients.producer(cluster.name, cluster.client_config())
    for i in range(count):
        producer.produce(DEMO_TOPIC, key=f"order-{i}".encode(), value=f'{{"id": {i}}}'.encode())
    producer.flush(30)
    return count


def wait_for_records(
    cluster: sandbox.Cluster, topic: str, count: int, timeout: float, service: LocalAirflow
) -> list[tuple[int, int, str, str]]:
    """Read ``topic`` from the start until ``count`` records arrived: (partition, offset,
    key, value) each. Fails early when an Airflow service dies."""
    from mirrorflow.replication import clients

    consumer = clients.consumer(
        cluster.name,
        {
            **cluster.client_config(),
            "group.id": f"mirrorflow-demo-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 2000,
        },
    )
    consumer.subscribe([topic])
    seen: list[tuple[int, int, str, str]] = []
    deadline = time.monotonic() + timeout
    checked = 0.0
    try:
        while len(seen) < count:
            if time.monotonic() > deadline:
                raise MirrorflowError(
                    f"{len(seen)} of {count} records arrived on {cluster.name} as {topic} "
                    f"within {timeout:.0f}s",
                    "see the task's log of the mirror DAG in the Airflow UI",
                )
            if time.monotonic() - checked > 5:
                service.check_services()
                checked = time.monotonic()
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            key = (message.key() or b"").decode(errors="replace")
            value = (message.value() or b"").decode(errors="replace")
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None  # set on a consumed record
            seen.append((partition, offset, key, value))
    finally:
        consumer.close()
    return sorted(seen)
