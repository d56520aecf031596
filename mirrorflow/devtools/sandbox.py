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

import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mirrorflow.devtools import certificates
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import private_dir, write_private
from mirrorflow.runtime import guard, jvm, processes

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
DEFAULT_HEAP = "512m"
USERS = ("admin", "alice", "bob")
STATE_FILE = "clusters.json"
TLS_DIR = "tls"
LISTENERS = ("SASL_PLAINTEXT", "SASL_SSL", "SSL")


@dataclass
class Cluster:
    """One sandbox cluster: where it listens, where it keeps data and logs, who may connect."""

    name: str
    broker_port: int
    controller_port: int
    directory: str
    passwords: dict[str, str] = field(repr=False)
    cluster_id: str = field(default_factory=lambda: _new_cluster_id())
    pid: int | None = None
    tls_password: str = field(default="", repr=False)  # the sandbox's TLS stores' password
    host: str = "127.0.0.1"  # the address it listens on (a datacenter's, see datacenters.py)
    netns: str = ""  # the network namespace its broker runs in ("": this one)

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.broker_port}"

    def listener_port(self, listener: str) -> int:
        """The broker's port for a listener of :data:`LISTENERS`."""
        return self.broker_port + {"SASL_PLAINTEXT": 0, "SASL_SSL": 2, "SSL": 3}[listener]

    @property
    def tls_dir(self) -> Path:
        """Where the sandbox's CA and stores are (shared by its clusters)."""
        return Path(self.directory).parent / TLS_DIR

    @property
    def log_file(self) -> Path:
        return Path(self.directory) / "broker.log"

    @property
    def properties_file(self) -> Path:
        return Path(self.directory) / "server.properties"

    def client_config(self, user: str = "admin") -> dict[str, str]:
        """confluent-kafka (librdkafka) settings for connecting as ``user``."""
        if user not in self.passwords:
            raise MirrorflowError(f"sandbox cluster {self.name} has no user {user!r}")
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": self.passwords[user],
        }

    def java_client_config(
        self, user: str = "admin", listener: str = "SASL_PLAINTEXT", store_type: str = "JKS"
    ) -> dict[str, str]:
        """Java client settings (MirrorMaker 2, Spark's Kafka connector) for ``user``: over
        SASL_PLAINTEXT (PLAIN), SASL_SSL (SCRAM-SHA-512, trusting the sandbox's CA) or SSL (the
        user's client certificate), with stores of ``store_type`` (JKS, PKCS12 or PEM) written
        as seed 003 writes them."""
        port = self.listener_port(listener)
        if listener == "SASL_PLAINTEXT":
            return {
                "bootstrap.servers": f"{self.host}:{port}",
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.jaas.config": _plain_login(user, self.passwords[user]),
            }
        settings = {
            "bootstrap.servers": f"{self.host}:{port}",
            "security.protocol": listener,
            "ssl.truststore.location": str(certificates.truststore(self.tls_dir, store_type)),
        }
        if store_type != "PEM":
            settings["ssl.truststore.password"] = self.tls_password
        if store_type != "JKS":
            settings["ssl.truststore.type"] = store_type
        if listener == "SASL_SSL":
            return {
                **settings,
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.jaas.config": _scram_login(user, self.passwords[user]),
            }
        settings["ssl.keystore.location"] = str(
            certificates.keystore(self.tls_dir, user, store_type)
        )
        if store_type != "PEM":
            settings["ssl.keystore.password"] = self.tls_password
        if store_type != "JKS":
            settings["ssl.keystore.type"] = store_type
        if store_type == "PEM":
            settings["ssl.key.password"] = self.tls_password  # the PEM key is encrypted
        return settings

    def is_running(self) -> bool:
        return self.pid is not None and _is_our_broker(self.pid, self.properties_file)


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
        _prepare(cluster)
        started.append(cluster)
    _format_storage(java, classpath, started)
    processes = {}
    for cluster in started:
        processes[cluster.name] = _launch(java, classpath, cluster, heap)
        cluster.pid = processes[cluster.name].pid
        sandbox.clusters[cluster.name] = cluster
    sandbox.save()
    deadline = time.monotonic() + timeout
    for cluster in started:
        _wait_until_serving(cluster, processes[cluster.name], deadline, timeout)
        _scram_users(cluster)
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
            _terminate(cluster)
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


def _new_cluster_id() -> str:
    """A KRaft cluster id like Kafka's ``Uuid.randomUuid()``: never starting with '-', which
    the storage tool would read as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _scram_login(user: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )


def _plain_login(user: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{user}" password="{password}";'
    )


def free_port_block(count: int) -> int:
    """A base port such that ``count`` consecutive loopback ports from it are free.

    Only ports outside the kernel's ephemeral range are offered: a port inside it can be taken
    as the local end of any outgoing connection while its broker is stopped, and the broker
    could then not restart on it. The search starts where this process's id points, so
    concurrent callers (two test sessions, a benchmark) rarely pick the same block.
    """
    low, high = _ephemeral_ports()
    candidates = [
        base for base in range(10000, 65536 - count, 97) if base + count <= low or base > high
    ]
    if not candidates:
        raise MirrorflowError(f"no port outside the ephemeral range {low}-{high}")
    first = os.getpid() % len(candidates)
    for base in candidates[first:] + candidates[:first]:
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise MirrorflowError(
        f"no block of {count} free ports on 127.0.0.1 outside the ephemeral range {low}-{high}"
    )


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


def _prepare(cluster: Cluster) -> None:
    data = private_dir(Path(cluster.directory))
    host = cluster.host
    admin = cluster.passwords["admin"]
    users = " ".join(f'user_{u}="{p}"' for u, p in cluster.passwords.items())
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule required"
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{cluster.controller_port}",
        "listeners": ",".join(
            [f"{name}://{host}:{cluster.listener_port(name)}" for name in LISTENERS]
            + [f"CONTROLLER://{host}:{cluster.controller_port}"]
        ),
        "advertised.listeners": ",".join(
            f"{name}://{host}:{cluster.listener_port(name)}" for name in LISTENERS
        ),
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,"
        + ",".join(f"{name}:{name}" for name in LISTENERS),
        # TLS: the broker's key in PKCS#12, the sandbox's CA as a PEM truststore; on the SSL
        # listener a client certificate is required and CN=<user> is User:<user>.
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(cluster.tls_dir / "broker.p12"),
        "ssl.keystore.password": cluster.tls_password,
        "ssl.key.password": cluster.tls_password,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certificates.truststore(cluster.tls_dir, "PEM")),
        "listener.name.ssl.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": (
            f'{plain} username="admin" password="{admin}" {users};'
        ),
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
            f'{plain} username="admin" password="{admin}" {users};'
        ),
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": (
            f'{plain} username="admin" password="{admin}" user_admin="{admin}";'
        ),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "allow.everyone.if.no.acl.found": "false",
        "log.dirs": str(data / "kraft-logs"),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "5",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    write_private(cluster.properties_file, "".join(f"{k}={v}\n" for k, v in props.items()))
    (data / "log4j2.properties").write_text(
        "status = warn\n"
        "appender.out.type = Console\n"
        "appender.out.name = out\n"
        "appender.out.layout.type = PatternLayout\n"
        "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = INFO\n"
        "rootLogger.appenderRef.out.ref = out\n"
        "logger.kafka.name = kafka\n"
        "logger.kafka.level = INFO\n"
        "logger.request.name = kafka.request.logger\n"
        "logger.request.level = WARN\n"
    )


def _format_storage(java: str, classpath: str, clusters: list[Cluster]) -> None:
    """Format each cluster's KRaft storage (in parallel: each is a JVM start)."""
    procs = []
    for cluster in clusters:
        cmd = [java, "-Xmx256m", "-cp", classpath, "kafka.tools.StorageTool", "format"]
        cmd += ["-t", cluster.cluster_id, "-c", str(cluster.properties_file), "--ignore-formatted"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append((cluster, proc))
    for cluster, proc in procs:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
            cause = next((ln for ln in lines if "Exception" in ln or "rror" in ln), None)
            raise MirrorflowError(
                f"formatting the storage of sandbox cluster {cluster.name} failed: "
                f"{(cause or (lines[-1] if lines else 'no output')).split(': ', 1)[-1]}",
                f"delete {cluster.directory} (its data is lost) and run sandbox up again",
            )


def _launch(java: str, classpath: str, cluster: Cluster, heap: str) -> subprocess.Popen:
    data = Path(cluster.directory)
    # A datacenter's broker runs inside its network namespace (``ip netns exec`` execs java,
    # so the process id stays the broker's).
    netns = ["ip", "netns", "exec", cluster.netns] if cluster.netns else []
    cmd = [
        *netns,
        java,
        f"-Xmx{heap}",
        f"-Xms{heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={data / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={data}",
        "-cp",
        classpath,
        "kafka.Kafka",
        str(cluster.properties_file),
    ]
    # The kernel's parent-death signal follows the thread that starts the broker: only the
    # main thread's outlives what it starts.
    bound = DIE_WITH_CALLER and threading.current_thread() is threading.main_thread()
    with open(cluster.log_file, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=guard.die_with_parent if bound else None,
        )
    return proc


def _wait_until_serving(
    cluster: Cluster, process: subprocess.Popen, deadline: float, timeout: float
) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**cluster.client_config(), "log_level": 0})
    while True:
        if process.poll() is not None:  # the handle, not /proc: right after fork it is not java yet
            raise MirrorflowError(
                f"the broker of sandbox cluster {cluster.name} exited during start-up: "
                f"{last_error(cluster.log_file)}",
                f"see its log: {cluster.log_file}",
            )
        try:
            admin.list_topics(timeout=2)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise MirrorflowError(
                    f"the broker of sandbox cluster {cluster.name} did not answer metadata "
                    f"requests on {cluster.bootstrap_servers} within {timeout:.0f}s",
                    f"see its log: {cluster.log_file}",
                ) from None
            time.sleep(0.5)


def _scram_users(cluster: Cluster) -> None:
    """Give every sandbox user a SCRAM-SHA-512 credential with its password (idempotent)."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialAlteration,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({**cluster.client_config(), "log_level": 0})
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
        )
        for user, password in cluster.passwords.items()
    ]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(timeout=30)


def last_error(log_file: Path) -> str:
    """The last ERROR or exception line of a broker log (else its last line), shortened."""
    with contextlib.suppress(OSError):
        lines = log_file.read_text(errors="replace").splitlines()
        errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln]
        if errors:
            return errors[-1].strip()[:300]
        if lines:
            return lines[-1].strip()[:300]
    return "no log output"


def _is_our_broker(pid: int, properties_file: Path) -> bool:
    """True if ``pid`` is alive and is the broker started with this properties file."""
    return processes.alive(pid) and str(properties_file) in processes.command_line(pid)


def _terminate(cluster: Cluster, grace: float = 30.0) -> None:
    assert cluster.pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(cluster.pid, signal.SIGTERM)
    processes.wait_for_exit(cluster.pid, grace, interval=0.2, reap=True)
    if cluster.is_running():
        with contextlib.suppress(ProcessLookupError):
            os.kill(cluster.pid, signal.SIGKILL)
