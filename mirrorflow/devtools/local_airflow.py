"""A local Airflow for development and the demo: SQLite, LocalExecutor, loopback only.

:class:`LocalAirflow` initialises an Airflow home, starts its api-server, scheduler,
dag-processor and triggerer, each in a session of its own and recorded in the home (so that
another shell can find and stop them later; nothing else is ever signalled), and waits for the
API. :class:`Api` is the handful of REST calls the demo makes as the UI's user.

What it exposes: the api-server on 127.0.0.1 only, with a login. The scheduler and triggerer
run without their log servers (``--skip-serve-logs``: Airflow 3.3 binds them to every interface,
with no setting for their address); the UI reads task logs from the files in the home instead,
on the same machine. The home is private (0700), and the UI user's password is made here, in a
0600 file, before the api-server starts, so Airflow never generates one (it would print it to
the api-server's log); its database and ``airflow.cfg`` (which hold Airflow's own keys) are 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from mirrorflow import paths
from mirrorflow.errors import MirrorflowError
from mirrorflow.runtime import guard, processes

SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")
DIE_WITH_CALLER = False
"""Services started (from the main thread) while this is true die with the process that started
them, even if it is killed: the test session sets it, as for the sandbox's brokers. The
api-server rewrites its own environment (its process title), so the run's check for leftovers
could not find one left behind."""

SERVICE_OPTIONS = {
    # Their log servers would listen on every interface (Airflow 3.3 has no setting for it).
    "scheduler": ("--skip-serve-logs",),
    "triggerer": ("--skip-serve-logs",),
}
DEFAULT_PORT = 8080
SERVICES_FILE = "demo-services.json"
UI_USER = "admin"


class LocalAirflow:
    """An Airflow home and the services running from it."""

    def __init__(
        self, home: Path, state: Path, say=print, settings: dict[str, str] | None = None
    ) -> None:
        self.home = home
        self.state = state  # MIRRORFLOW_STATE of the tasks
        self.port = DEFAULT_PORT
        self._say = say
        # Airflow settings over the defaults below (``AIRFLOW__SECTION__KEY``: value).
        self.settings = dict(settings or {})

    @property
    def password_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json.generated"

    def choose_port(self, wanted: int | None) -> int:
        """The port of running services, else ``wanted``, else the first free one from 8080."""
        recorded = self._recorded()
        if recorded.get("port") and self.running_services():
            self.port = int(recorded["port"])
            return self.port
        candidates = [wanted] if wanted else range(DEFAULT_PORT, DEFAULT_PORT + 20)
        for port in candidates:
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("127.0.0.1", port))
                    self.port = port
                    return port
                except OSError:
                    continue
        raise MirrorflowError(
            f"no free port for the Airflow UI ({', '.join(map(str, candidates))})",
            "choose one with --port",
        )

    def environment(self) -> dict[str, str]:
        """Airflow's configuration: SQLite, LocalExecutor, loopback only."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))
        }
        venv_bin = str(Path(sys.executable).parent)
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                # mirrorflow's UI page (plugins/mirrorflow_ui.py), at /mirrorflow/
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(paths.resource("plugins")),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{UI_USER}:admin",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.password_file),
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
                # The mirror DAGs' Spark connection: Spark in the task's own process.
                "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                    {"conn_type": "spark", "host": "local[*]"}
                ),
                "MIRRORFLOW_STATE": str(self.state),
                "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
                "PYTHONPATH": str(paths.PROJECT_ROOT),
            }
        )
        env.update(self.settings)
        return env

    @property
    def dags_folder(self) -> Path:
        return self.home / "dags"

    def _airflow(self) -> str:
        return str(Path(sys.executable).parent / "airflow")

    def migrate(self) -> None:
        """``airflow db migrate`` of the home's SQLite database (the home made private first)."""
        paths.private_dir(self.home)
        self._say(f"initialising Airflow (SQLite, LocalExecutor) in {self.home}")
        log = self.home / "db-migrate.log"
        with paths.open_private(log, "wb") as out:
            result = subprocess.run(
                [self._airflow(), "db", "migrate"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=paths.PROJECT_ROOT,
            )
        if result.returncode != 0:
            raise MirrorflowError("airflow db migrate failed", f"see {log}")
        for name in ("airflow.cfg", "airflow.db"):  # Airflow's keys, its connections
            with contextlib.suppress(FileNotFoundError):
                paths.make_private(self.home / name)

    def ensure_password(self) -> None:
        """The UI user's password, made once in a 0600 file (kept across restarts)."""
        with contextlib.suppress(OSError, ValueError):
            passwords = json.loads(self.password_file.read_text())
            if isinstance(passwords, dict) and passwords.get(UI_USER):
                paths.write_private(self.password_file, json.dumps(passwords) + "\n")
                return
        password = secrets.token_urlsafe(18)
        paths.write_private(self.password_file, json.dumps({UI_USER: password}) + "\n")

    def _recorded(self) -> dict:
        try:
            return json.loads((self.home / SERVICES_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def recorded_port(self) -> int | None:
        port = self._recorded().get("port")
        return int(port) if port else None

    def running_services(self) -> dict[str, int]:
        services = self._recorded().get("services", {})
        return {n: r["pid"] for n, r in services.items() if isinstance(r, dict) and _is_service(r)}

    def start_services(self, names: tuple[str, ...] = SERVICES) -> None:
        """Start whichever of the services (all by default) is not running yet."""
        running = self.running_services()
        env = self.environment()
        paths.private_dir(self.home)
        self.ensure_password()
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        # The kernel's parent-death signal follows the thread that starts the service.
        bound = DIE_WITH_CALLER and threading.current_thread() is threading.main_thread()
        for name in names:
            if name in running:
                continue
            with paths.open_private(logs / f"{name}.log", "ab") as out:
                process = subprocess.Popen(
                    [self._airflow(), name, *SERVICE_OPTIONS.get(name, ())],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=paths.PROJECT_ROOT,
                    start_new_session=True,
                    preexec_fn=guard.die_with_parent if bound else None,
                )
            running[name] = process.pid
            self._save_services(running)
        self._say(
            "Airflow is starting: "
            + ", ".join(f"{n} (pid {p})" for n, p in running.items())
            + f"; logs in {logs}"
        )

    def _save_services(self, running: dict[str, int]) -> None:
        services = {
            name: {"pid": pid, "created": processes.created(pid)} for name, pid in running.items()
        }
        record = {"port": self.port, "services": services}
        (self.home / SERVICES_FILE).write_text(json.dumps(record, indent=2) + "\n")

    def check_services(self) -> None:
        """Fail at once, naming the log, when a service it started has died."""
        running = self.running_services()
        for name in self._recorded().get("services", {}):
            if name not in running:
                raise MirrorflowError(
                    f"the Airflow {name} exited",
                    f"see {self.home / 'logs' / (name + '.log')}",
                )

    def wait_for_api(self, timeout: float = 240) -> None:
        url = f"http://127.0.0.1:{self.port}/api/v2/monitor/health"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_services()
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(url, timeout=5) as response,
            ):
                if response.status == 200:
                    self._check_is_ours()
                    self._say(f"Airflow's API answers on http://127.0.0.1:{self.port}")
                    return
            time.sleep(1)
        raise MirrorflowError(
            f"Airflow's api-server did not answer within {timeout:.0f}s",
            f"see {self.home / 'logs' / 'api-server.log'}",
        )

    def _check_is_ours(self) -> None:
        """Fail in one line when the Airflow answering on the port does not take this home's UI
        password: another one took the port before this api-server could bind it."""
        try:
            Api(self.port, self.ui_password())
        except ApiRefused as error:
            if error.status != 401:
                raise
            raise MirrorflowError(
                f"another Airflow answers on 127.0.0.1:{self.port}, not the one started from "
                f"{self.home} (it refuses its UI password)",
                "stop the other one or choose another port with --port",
            ) from None

    def ui_password(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                return json.loads(self.password_file.read_text())[UI_USER]
            time.sleep(0.5)
        raise MirrorflowError(f"Airflow wrote no UI password to {self.password_file}")

    def api(self) -> Api:
        return Api(self.port, self.ui_password())

    def wait_for_dags(self, api: Api, dag_ids: list[str], timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_services()
            if all(api.dag(dag_id) is not None for dag_id in dag_ids):
                self._say(f"the dag-processor has registered {', '.join(dag_ids)}")
                return
            time.sleep(2)
        raise MirrorflowError(
            f"the DAGs {', '.join(dag_ids)} did not appear in Airflow within {timeout:.0f}s",
            f"see {self.home / 'logs' / 'dag-processor.log'}",
        )

    def stop_services(self, names: tuple[str, ...] = SERVICES, say=print) -> None:
        """Stop the recorded services that still run (and forget them)."""
        running = self.running_services()
        for name in names:
            if name in running:
                _stop_session(running[name])
                say(f"stopped Airflow's {name}")
        if not self.running_services():
            (self.home / SERVICES_FILE).unlink(missing_ok=True)


class ApiRefused(MirrorflowError):
    """Airflow's API answered a call with an error status (``status``)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


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
            raise ApiRefused(
                f"Airflow's API refused {method} {path}: HTTP {exc.code} {exc.reason}", exc.code
            ) from None

    def dag(self, dag_id: str) -> dict | None:
        return self._call("GET", f"/api/v2/dags/{dag_id}")

    def unpause(self, dag_id: str) -> None:
        self._call("PATCH", f"/api/v2/dags/{dag_id}", json.dumps({"is_paused": False}).encode())

    def pause(self, dag_id: str) -> None:
        self._call("PATCH", f"/api/v2/dags/{dag_id}", json.dumps({"is_paused": True}).encode())


def _is_service(record: dict) -> bool:
    """Whether a recorded service still runs: same pid and the same start time, to the second
    (Airflow renames its processes, so the command line cannot tell)."""
    pid, started = record.get("pid"), record.get("created")
    if not isinstance(pid, int) or not isinstance(started, int | float):
        return False
    created = processes.created(pid)
    return processes.alive(pid) and created is not None and abs(created - started) < 1.0


def _stop_session(leader: int, grace: float = 30.0) -> None:
    """SIGTERM the service (it stops its own workers), then SIGKILL whatever is left of its
    session after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(leader, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(leader, os.WNOHANG)  # started by this process: collect its exit
        if not processes.session_members(leader):
            return
        time.sleep(0.3)
    for pid in processes.session_members(leader):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
