"""Local Kafka clusters for development, demos and tests: real brokers from Maven artifacts.

Each cluster is an independent single-node KRaft broker+controller on loopback with its own
ports, data directory and log. Clients connect over SASL_PLAINTEXT (PLAIN, with SCRAM-SHA-512
enabled too), over SASL_SSL (the same mechanisms, TLS) or over SSL with a client certificate
(mutual TLS, ``CN=<user>`` is ``User:<user>``); the certificates and stores, in JKS, PKCS#12 and
PEM, are those of :mod:`mirrorflow.devtools.certificates`. The StandardAuthorizer enforces ACLs:
``admin`` is the only super user, ``alice`` and ``bob`` are ordinary principals, each with a
PLAIN and a SCRAM-SHA-512 password. Connection settings, passwords included, go to
``clusters.json`` and ``clusters.properties`` (mode 0600) in the sandbox directory (mode 0700),
as do the brokers' ``server.properties``; nothing prints a password.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from mirrorflow.devtools import broker, certificates
from mirrorflow.devtools.broker import LISTENERS, TLS_DIR, USERS, Cluster
from mirrorflow.devtools.broker import last_error as last_error  # as callers name it
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import write_private
from mirrorflow.runtime import jvm, processes

DIE_WITH_CALLER = False
"""Brokers started (from the main thread) while this is true die with the process that started
them, even if it is killed or crashes: the test session sets it, so a crashed test run leaves
no broker behind. ``mirrorflow sandbox up`` leaves it false: its brokers outlive the command."""

DEFAULT_BASE_PORT = 19092
# The replication factors of what a flow creates, 1 on a sandbox cluster (one broker each).
SINGLE_BROKER_FACTORS = (
    "replication.factor",
    "heartbeats.topic.replication.factor",
    "offset.storage.replication.factor",
    "checkpoints.topic.replication.factor",
    "offset-syncs.topic.replication.factor",
)
PORTS_PER_CLUSTER = 10
# How long a block handed out by free_port_block is not handed out again, while its caller
# starts what binds it.
PORT_RESERVATION_S = 600.0
DEFAULT_HEAP = "512m"
STATE_FILE = "clusters.json"


@dataclass
class Sandbox:
    """The clusters recorded in one sandbox directory."""

    directory: Path
    clusters: dict[str, Cluster]

    def __getitem__(self, name: str) -> Cluster:
        try:
            return self.clusters[name]
        except KeyError:
            known = ", ".join(self.clusters) or "none"
            raise MirrorflowError(
                f"no sandbox cluster named {name!r} in {self.directory} (running: {known})",
                f"start it with: mirrorflow sandbox up --clusters {name}",
            ) from None

    def save(self) -> None:
        data = {"clusters": {n: asdict(c) for n, c in self.clusters.items()}}
        write_private(self.directory / STATE_FILE, json.dumps(data, indent=2, sort_keys=True))
        self._write_mm2_properties()

    def _write_mm2_properties(self) -> None:
        """Cluster settings as MirrorMaker 2 properties (``<alias>.bootstrap.servers`` …)."""
        lines = self.mm2_lines(single_broker=False)
        write_private(self.directory / "clusters.properties", "\n".join(lines) + "\n")

    def mm2_lines(
        self,
        aliases: Iterable[str] | None = None,
        clients: dict[str, dict[str, str]] | None = None,
        single_broker: bool = True,
    ) -> list[str]:
        """The first lines of a flow file (MirrorMaker 2 properties) for these clusters (all
        by default): ``clusters = …``, each one's connection settings (``clients[alias]``,
        else the admin's, over SASL_PLAINTEXT), and replication factors of 1 for everything a
        flow creates (each sandbox cluster has one broker)."""
        names = list(self.clusters if aliases is None else aliases)
        lines = [f"clusters = {', '.join(names)}"]
        for name in names:
            settings = (clients or {}).get(name) or self[name].java_client_config()
            lines += [f"{name}.{k} = {v}" for k, v in settings.items()]
        if single_broker:
            lines += [f"{setting} = 1" for setting in SINGLE_BROKER_FACTORS]
        return lines


def load(directory: Path) -> Sandbox:
    """The sandbox recorded in ``directory`` (empty if none was started there)."""
    path = directory / STATE_FILE
    if not path.exists():
        return Sandbox(directory, {})
    try:
        data = json.loads(path.read_text())
        clusters = {n: Cluster(**c) for n, c in data["clusters"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise MirrorflowError(
            f"{path} is not a sandbox state file ({exc})",
            "stop any brokers by hand, delete the directory, and run sandbox up again",
        ) from None
    return Sandbox(directory, clusters)


def up(
    names: Iterable[str],
    directory: Path,
    base_port: int = DEFAULT_BASE_PORT,
    heap: str = DEFAULT_HEAP,
    timeout: float = 90.0,
) -> Sandbox:
    """Start the named clusters and wait until each serves metadata requests.

    Running clusters are kept as they are; stopped ones restart with their data, ports and
    passwords; new ones get the next free block of ports from ``base_port``.
    """
    names = list(dict.fromkeys(names))
    for name in names:
        if not name or not all(ch.isalnum() or ch in "-_" for ch in name):
            raise MirrorflowError(
                f"invalid cluster name {name!r}",
                "use letters, digits, '-' and '_' (MirrorMaker 2 aliases must not contain '.')",
            )
    sandbox = load(directory)
    to_start = [n for n in names if not (n in sandbox.clusters and sandbox[n].is_running())]
    if not to_start:
        return sandbox
    classpath = jvm.classpath("kafka")
    java = jvm.require_tool("java", "to run the Kafka brokers")
    keytool = jvm.require_tool("keytool", "to make the sandbox's TLS stores")
    tls_password = next(
        (c.tls_password for c in sandbox.clusters.values() if c.tls_password), None
    ) or secrets.token_urlsafe(18)
    certificates.ensure(directory / TLS_DIR, list(USERS), tls_password, keytool)
    used = {c.broker_port for c in sandbox.clusters.values()}
    slots = (base_port + i * PORTS_PER_CLUSTER for i in range(1000))
    started: list[Cluster] = []
    for name in to_start:
        cluster = sandbox.clusters.get(name)
        if cluster is None:
            port = next(p for p in slots if p not in used)
            cluster = Cluster(
                name=name,
                broker_port=port,
                controller_port=port + 1,
                directory=str(directory / name),
                passwords={u: secrets.token_urlsafe(18) for u in USERS},
            )
        cluster.tls_password = tls_password
        for p in (cluster.controller_port, *map(cluster.listener_port, LISTENERS)):
            if not cluster.netns:  # a namespace's ports are its own
                _require_free_port(p, name)
        broker.prepare(cluster)
        started.append(cluster)
    broker.format_storage(java, classpath, started)
    processes = {}
    for cluster in started:
        processes[cluster.name] = broker.launch(
            java, classpath, cluster, heap, die_with_caller=DIE_WITH_CALLER
        )
        cluster.pid = processes[cluster.name].pid
        sandbox.clusters[cluster.name] = cluster
    sandbox.save()
    deadline = time.monotonic() + timeout
    for cluster in started:
        broker.wait_until_serving(cluster, processes[cluster.name], deadline, timeout)
        broker.create_scram_users(cluster)
    return sandbox


def down(directory: Path, names: Iterable[str] | None = None) -> list[str]:
    """Stop the sandbox's brokers (only processes ``up`` started); return the names stopped.

    Data stays in the sandbox directory, so a later ``up`` restarts the same clusters.
    """
    sandbox = load(directory)
    chosen = list(names) if names else list(sandbox.clusters)
    stopped = []
    for name in chosen:
        cluster = sandbox[name]
        if cluster.is_running():
            broker.terminate(cluster)
            stopped.append(name)
        cluster.pid = None
    if sandbox.clusters:
        sandbox.save()
    return stopped


def kill(directory: Path, names: Iterable[str]) -> dict[str, float]:
    """SIGKILL the named clusters' brokers (a crash, for DR drills: no clean shutdown); return
    the names killed, each with when its signal was sent (epoch seconds). A later ``up``
    restarts them with their data."""
    sandbox = load(directory)
    killed: dict[str, float] = {}
    for name in names:
        cluster = sandbox[name]
        if cluster.is_running():
            assert cluster.pid is not None
            killed[name] = time.time()
            with contextlib.suppress(ProcessLookupError):
                os.kill(cluster.pid, signal.SIGKILL)
            processes.wait_for_exit(cluster.pid, 30, interval=0.05, reap=True)
        cluster.pid = None
    sandbox.save()
    return killed


def free_port_block(count: int) -> int:
    """A base port such that ``count`` consecutive loopback ports from it are free.

    Only ports outside the kernel's ephemeral range are offered: a port inside it can be taken
    as the local end of any outgoing connection while its broker is stopped, and the broker
    could then not restart on it. The search starts where this process's id points, and a block
    handed out is reserved for :data:`PORT_RESERVATION_S` (in a file all of this user's
    processes share), so a caller that takes a while to bind its ports (Airflow migrates its
    database first) does not find a second caller on them: two test workers, a benchmark.
    """
    low, high = _ephemeral_ports()
    candidates = [
        base for base in range(10000, 65536 - count, 97) if base + count <= low or base > high
    ]
    if not candidates:
        raise MirrorflowError(f"no port outside the ephemeral range {low}-{high}")
    first = os.getpid() % len(candidates)
    with _port_reservations() as reserved:
        for base in candidates[first:] + candidates[:first]:
            if str(base) in reserved or not _ports_free(base, count):
                continue
            reserved[str(base)] = time.time()
            return base
    raise MirrorflowError(
        f"no block of {count} free ports on 127.0.0.1 outside the ephemeral range {low}-{high}"
    )


def _ports_free(base: int, count: int) -> bool:
    sockets = []
    try:
        for port in range(base, base + count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()


@contextlib.contextmanager
def _port_reservations() -> Iterator[dict[str, float]]:
    """The blocks handed out in the last :data:`PORT_RESERVATION_S` (base port: when), held
    under an exclusive lock and saved on exit; an empty dict that is not kept when the file
    cannot be used (the ports are then only checked free)."""
    path = Path(tempfile.gettempdir()) / f"mirrorflow-ports-{os.getuid()}.json"
    try:
        handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+")
    except OSError:
        yield {}
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            reserved = json.loads(handle.read() or "{}")
        except ValueError:
            reserved = {}
        now = time.time()
        reserved = {
            base: when
            for base, when in reserved.items()
            if isinstance(when, (int, float)) and now - PORT_RESERVATION_S < when <= now
        }
        yield reserved
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(reserved))


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default if unknown)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


def _require_free_port(port: int, cluster: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the broker binds: connections of a stopped broker in TIME_WAIT do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            raise MirrorflowError(
                f"port {port} on 127.0.0.1, needed by sandbox cluster {cluster}, is in use",
                "stop what holds it (mirrorflow sandbox down, if it is an earlier sandbox) "
                "or choose other ports with --base-port",
            ) from None
