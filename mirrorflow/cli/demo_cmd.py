"""``mirrorflow demo``: the README's main command, end to end on the embedded defaults.

``mirrorflow demo`` (``demo up``) starts the two sandbox clusters of the active/passive example
(``primary``, ``secondary``), initialises Airflow (SQLite, LocalExecutor) in
``.mirrorflow/airflow``, renders the DAG of ``examples/active-passive.properties``, starts
Airflow's api-server, scheduler, dag-processor and triggerer, unpauses the mirror DAG, produces
sample records on ``primary`` and shows them arriving on ``secondary`` as ``primary.orders``.
It then keeps a record flowing every few seconds until Ctrl-C, which stops everything it
started; ``--detach`` returns instead, and ``mirrorflow demo down`` stops everything later.

Everything it starts runs in its own session and is recorded in ``.mirrorflow/airflow``, so
``demo down`` finds it from any shell; nothing else is ever signalled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from mirrorflow import dag_render, paths, sandbox
from mirrorflow.airflow import jobs
from mirrorflow.errors import MirrorflowError

DEMO_CLUSTERS = ("primary", "secondary")
DEMO_TOPIC = "orders"
EXAMPLE = paths.PROJECT_ROOT / "examples" / "active-passive.properties"
FLOW = "primary->secondary"
SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")
DEFAULT_PORT = 8080
SERVICES_FILE = "demo-services.json"
STOPPING_FILE = "demo-stopping"
"""Present while ``demo down`` runs, so a demo in another terminal ends quietly instead of
reporting the services it stops as failures."""
UI_USER = "admin"


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="run the end-to-end demo: two local clusters replicated by Airflow and Spark",
        description=(__doc__ or "").split("\n\n", 1)[1].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", nargs="?", choices=("up", "down"), default="up")
    parser.add_argument(
        "--detach", action="store_true", help="return once records replicate; stop with down"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"Airflow UI port (default {DEFAULT_PORT}, else the next free one)",
    )
    parser.add_argument(
        "--records", type=int, default=100, help="sample records to produce (default 100)"
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=sandbox.DEFAULT_BASE_PORT,
        help=f"first port of the clusters (default {sandbox.DEFAULT_BASE_PORT})",
    )
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    demo = Demo(paths.state_dir())
    if args.action == "down":
        demo.down()
        return 0
    try:
        demo.up(port=args.port, records=args.records, base_port=args.base_port)
        if args.detach:
            print("everything keeps running; stop it with: mirrorflow demo down")
            return 0
        print("\nlive: a new order every 3 seconds (Ctrl-C stops everything the demo started)")
        demo.live()
    except KeyboardInterrupt:
        print("\nCtrl-C: stopping everything the demo started")
        demo.down()
        return 130
    return 0


class Demo:
    """The demo's clusters, Airflow services and mirror job, found through its state files."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.home = state / "airflow"
        self.sandbox_dir = state / "sandbox"
        self.flows_dir = state / "flows"  # the mirror jobs' state (MIRRORFLOW_STATE below)
        self.started = time.monotonic()
        self.box: sandbox.Sandbox | None = None
        self.port = DEFAULT_PORT
        self.dag_id = ""

    # -- up ----------------------------------------------------------------------------------
    def up(self, port: int | None, records: int, base_port: int) -> None:
        self._require_project_state()
        (self.home / STOPPING_FILE).unlink(missing_ok=True)
        self.box = sandbox.up(DEMO_CLUSTERS, self.sandbox_dir, base_port=base_port)
        self._say(f"clusters ready: {self._clusters()}")
        self._check_example_resolves()
        self.port = self._choose_port(port)
        self._migrate()
        self.dag_id = self._render()
        self._start_services()
        self._wait_for_api()
        api = Api(self.port, self._ui_password())
        self._wait_for_dag(api)
        count = produce_samples(self.box["primary"], records)
        self._say(f"produced {count} sample records to '{DEMO_TOPIC}' on primary")
        api.unpause(self.dag_id)
        unpaused = time.monotonic()
        self._say(f"unpaused the DAG {self.dag_id}: Airflow starts the Spark mirror job")
        remote = f"primary.{DEMO_TOPIC}"
        first = wait_for_records(self.box["secondary"], remote, 1, timeout=600, service=self)
        now = time.monotonic()
        self._say(
            f"first replicated record on secondary after {now - unpaused:.0f}s "
            f"({now - self.started:.0f}s since the demo started)"
        )
        for partition, offset, key, value in first[:1]:
            print(f"  {remote} [partition {partition}, offset {offset}] {key} = {value}")
        arrived = wait_for_records(self.box["secondary"], remote, count, timeout=300, service=self)
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
        from mirrorflow.flowconfig import load_topology

        assert self.box is not None
        here = Path.cwd()
        os.chdir(paths.PROJECT_ROOT)
        try:
            flow = load_topology([EXAMPLE]).flow(FLOW)
            for role, cluster in (("source.admin", "primary"), ("target.admin", "secondary")):
                client = flow.client_config(role, librdkafka=True)
                if client.get("bootstrap.servers") != self.box[cluster].bootstrap_servers:
                    raise MirrorflowError(
                        f"{EXAMPLE.name} resolves {cluster}'s bootstrap.servers to "
                        f"{client.get('bootstrap.servers')}, not the sandbox's "
                        f"{self.box[cluster].bootstrap_servers}",
                        "check .mirrorflow/sandbox/clusters.properties",
                    )
        finally:
            os.chdir(here)
        self._say(f"{EXAMPLE.relative_to(paths.PROJECT_ROOT)}: its secret references resolve")

    def _choose_port(self, wanted: int | None) -> int:
        recorded = self._recorded()
        if recorded.get("port") and self._running_services(recorded):
            return int(recorded["port"])
        candidates = [wanted] if wanted else range(DEFAULT_PORT, DEFAULT_PORT + 20)
        for port in candidates:
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("127.0.0.1", port))
                    return port
                except OSError:
                    continue
        raise MirrorflowError(
            f"no free port for the Airflow UI ({', '.join(map(str, candidates))})",
            "choose one with --port",
        )

    def environment(self) -> dict[str, str]:
        """Airflow's configuration for the demo: SQLite, LocalExecutor, loopback only."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))
        }
        venv_bin = str(Path(sys.executable).parent)
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.home / "dags"),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{UI_USER}:admin",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": (
                    f"http://127.0.0.1:{self.port}/execution/"
                ),
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{self.port}",
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
                # The mirror DAG's Spark connection: Spark in the task's own process.
                "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                    {"conn_type": "spark", "host": "local[*]"}
                ),
                "MIRRORFLOW_STATE": str(self.state),
                "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
                "PYTHONPATH": str(paths.PROJECT_ROOT),
            }
        )
        return env

    def _airflow(self) -> str:
        return str(Path(sys.executable).parent / "airflow")

    def _migrate(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self._say(f"initialising Airflow (SQLite, LocalExecutor) in {self.home}")
        log = self.home / "db-migrate.log"
        with open(log, "wb") as out:
            result = subprocess.run(
                [self._airflow(), "db", "migrate"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=paths.PROJECT_ROOT,
            )
        if result.returncode != 0:
            raise MirrorflowError("airflow db migrate failed", f"see {log}")

    def _render(self) -> str:
        rendering = dag_render.render([EXAMPLE])
        dag_render.write(rendering, self.home / "dags")
        (dag,) = rendering.dags
        self._say(f"rendered the DAG {dag.dag_id} of {EXAMPLE.name} into {self.home / 'dags'}")
        return dag.dag_id

    def _recorded(self) -> dict:
        try:
            return json.loads((self.home / SERVICES_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def _running_services(self, recorded: dict) -> dict[str, int]:
        services = recorded.get("services", {})
        return {n: r["pid"] for n, r in services.items() if isinstance(r, dict) and _is_service(r)}

    def _start_services(self) -> None:
        running = self._running_services(self._recorded())
        env = self.environment()
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for name in SERVICES:
            if name in running:
                continue
            with open(logs / f"{name}.log", "ab") as out:
                process = subprocess.Popen(
                    [self._airflow(), name],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=paths.PROJECT_ROOT,
                    start_new_session=True,
                )
            running[name] = process.pid
            self._save_services(running)
        self._say(
            "Airflow is starting: "
            + ", ".join(f"{n} (pid {p})" for n, p in running.items())
            + f"; logs in {logs}"
        )

    def _save_services(self, running: dict[str, int]) -> None:
        services = {name: {"pid": pid, "start": _start_time(pid)} for name, pid in running.items()}
        record = {"port": self.port, "services": services}
        (self.home / SERVICES_FILE).write_text(json.dumps(record, indent=2) + "\n")

    def check_services(self) -> None:
        """Fail at once, naming the log, when an Airflow service has died."""
        recorded = self._recorded()
        running = self._running_services(recorded)
        for name in SERVICES:
            if name not in running:
                raise MirrorflowError(
                    f"the Airflow {name} exited",
                    f"see {self.home / 'logs' / (name + '.log')}",
                )

    def _wait_for_api(self) -> None:
        url = f"http://127.0.0.1:{self.port}/api/v2/monitor/health"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            self.check_services()
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(url, timeout=5) as response,
            ):
                if response.status == 200:
                    self._say(f"Airflow's API answers on http://127.0.0.1:{self.port}")
                    return
            time.sleep(1)
        raise MirrorflowError(
            "Airflow's api-server did not answer within 240s",
            f"see {self.home / 'logs' / 'api-server.log'}",
        )

    def _ui_password(self) -> str:
        path = self.home / "simple_auth_manager_passwords.json.generated"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                return json.loads(path.read_text())[UI_USER]
            time.sleep(0.5)
        raise MirrorflowError(f"Airflow wrote no UI password to {path}")

    def _wait_for_dag(self, api: Api) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            self.check_services()
            if api.dag(self.dag_id) is not None:
                self._say(f"the dag-processor has registered {self.dag_id}")
                return
            time.sleep(2)
        raise MirrorflowError(
            f"the DAG {self.dag_id} did not appear in Airflow within 240s",
            f"see {self.home / 'logs' / 'dag-processor.log'}",
        )

    def _print_access(self) -> None:
        password_file = self.home / "simple_auth_manager_passwords.json.generated"
        print(
            f"\nAirflow UI:  http://127.0.0.1:{self.port}/dags/{self.dag_id}\n"
            f"  login:     user '{UI_USER}', password in {password_file}\n"
            f"  the job:   DAG {self.dag_id} > task 'mirror' > Logs (Spark's output)\n"
            f"clusters:    {self._clusters()} (settings: {self.sandbox_dir / 'clusters.json'})"
        )

    # -- live --------------------------------------------------------------------------------
    def live(self) -> None:
        """Produce a record every few seconds and show when it arrives, until Ctrl-C."""
        from confluent_kafka import Consumer, Producer

        assert self.box is not None
        primary, secondary = self.box["primary"], self.box["secondary"]
        producer = Producer(primary.client_config())
        consumer = Consumer(
            {
                **secondary.client_config(),
                "group.id": "mirrorflow-demo-live",
                "auto.offset.reset": "latest",
                "enable.auto.commit": False,
            }
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
                self.check_services()
                key = f"live-{number}".encode()
                producer.produce(DEMO_TOPIC, key=key, value=b'{"live": true}')
                producer.flush(10)
                sent[key] = time.monotonic()
                number += 1
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    message = consumer.poll(0.5)
                    if message is None or message.error() or message.key() not in sent:
                        continue
                    latency = time.monotonic() - sent.pop(message.key())
                    print(
                        f"  {message.key().decode()}: produced on primary, on secondary as "
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
        recorded = self._recorded()
        running = self._running_services(recorded)
        if recorded.get("port"):
            self.port = int(recorded["port"])
        if "api-server" in running:
            with contextlib.suppress(MirrorflowError, OSError):
                api = Api(self.port, self._ui_password())
                for dag in dag_render.render([EXAMPLE]).dags:
                    api.pause(dag.dag_id)  # no new run starts once the job stops
        stopped = jobs.stop_all(self.flows_dir, grace=60)
        for flow in stopped:
            print(f"stopped the mirror job of {flow}")
        for name in ("scheduler", "triggerer", "dag-processor", "api-server"):
            if name in running:
                _stop_session(running[name])
                print(f"stopped Airflow's {name}")
        for flow in jobs.stop_all(self.flows_dir, grace=60):  # one started meanwhile, if any
            print(f"stopped the mirror job of {flow}")
        (self.home / SERVICES_FILE).unlink(missing_ok=True)
        known = sandbox.load(self.sandbox_dir).clusters
        clusters = sandbox.down(self.sandbox_dir, [c for c in DEMO_CLUSTERS if c in known])
        print("stopped clusters: " + (", ".join(clusters) if clusters else "none was running"))


class Api:
    """The few calls of Airflow's REST API the demo makes, as the UI's user."""

    def __init__(self, port: int, password: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        body = json.dumps({"username": UI_USER, "password": password}).encode()
        reply = self._call("POST", "/auth/token", body, token=None)
        self.token = reply["access_token"]

    def _call(self, method: str, path: str, body: bytes | None = None, token: str | None = ""):
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token or self.token}"
        request = urllib.request.Request(self.base + path, body, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise MirrorflowError(
                f"Airflow's API refused {method} {path}: HTTP {exc.code} {exc.reason}"
            ) from None

    def dag(self, dag_id: str) -> dict | None:
        return self._call("GET", f"/api/v2/dags/{dag_id}")

    def unpause(self, dag_id: str) -> None:
        self._call("PATCH", f"/api/v2/dags/{dag_id}", json.dumps({"is_paused": False}).encode())

    def pause(self, dag_id: str) -> None:
        self._call("PATCH", f"/api/v2/dags/{dag_id}", json.dumps({"is_paused": True}).encode())


def produce_samples(cluster: sandbox.Cluster, count: int = 100) -> int:
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


def wait_for_records(
    cluster: sandbox.Cluster, topic: str, count: int, timeout: float, service: Demo
) -> list[tuple[int, int, str, str]]:
    """Read ``topic`` from the start until ``count`` records arrived: (partition, offset,
    key, value) each. Fails early when an Airflow service dies."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": f"mirrorflow-demo-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 2000,
        }
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
                    "see the task's log in the Airflow UI (DAG mirror__primary__secondary)",
                )
            if time.monotonic() - checked > 5:
                service.check_services()
                checked = time.monotonic()
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            key = (message.key() or b"").decode(errors="replace")
            value = (message.value() or b"").decode(errors="replace")
            seen.append((message.partition(), message.offset(), key, value))
    finally:
        consumer.close()
    return sorted(seen)


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, its identity."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _is_service(record: dict) -> bool:
    """Whether a recorded service still runs: same pid and same start time (Airflow renames
    its processes, so the command line cannot tell)."""
    pid = record.get("pid")
    return (
        isinstance(pid, int) and jobs.process_alive(pid) and _start_time(pid) == record.get("start")
    )


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:  # after ")": state, ppid, pgrp, session
                members.append(int(entry.name))
    return members


def _stop_session(leader: int, grace: float = 30.0) -> None:
    """SIGTERM the service (it stops its own workers), then SIGKILL whatever is left of its
    session after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(leader, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(leader, os.WNOHANG)  # started by this process: collect its exit
        if not any(jobs.process_alive(p) for p in _session_members(leader)):
            return
        time.sleep(0.3)
    for pid in _session_members(leader):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
