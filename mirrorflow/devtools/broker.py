"""One sandbox cluster: a single-node KRaft broker+controller on loopback (see
:mod:`mirrorflow.devtools.sandbox`, which keeps several): where it listens and keeps its data,
who may connect and how (:class:`Cluster`), its ``server.properties``, storage and process."""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mirrorflow.devtools import certificates
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import private_dir, write_private
from mirrorflow.runtime import guard, processes

USERS = ("admin", "alice", "bob")
TLS_DIR = "tls"
LISTENERS = ("SASL_PLAINTEXT", "SASL_SSL", "SSL")
LOG_DIR = "kraft-logs"  # in the cluster's directory: its log and metadata directory


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


def prepare(cluster: Cluster) -> None:
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
        "log.dirs": str(data / LOG_DIR),
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
        # The controller's no-op records tell other nodes it is alive (KIP-835): a single-node
        # cluster has none. Every 5 s instead of 0.5 s: an idle broker uses 1.6% of a core
        # instead of 2.25% (docs/development.md, *Tests*); its restarts take as long.
        "metadata.max.idle.interval.ms": "5000",
        **config_overrides(),
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


def storage_formatted(cluster: Cluster) -> bool:
    """Whether the cluster's log directory is formatted: ``kafka-storage format
    --ignore-formatted`` would leave it as it is (its ``meta.properties`` is written)."""
    return (Path(cluster.directory) / LOG_DIR / "meta.properties").is_file()


def format_storage(java: str, classpath: str, clusters: list[Cluster]) -> None:
    """Format the KRaft storage of each cluster not formatted yet (in parallel: each is a JVM
    start; a cluster restarted by ``up`` needs none)."""
    procs = []
    for cluster in clusters:
        if storage_formatted(cluster):
            continue
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


CONFIG_VARIABLE = "MIRRORFLOW_SANDBOX_BROKER_CONFIG"
"""Broker settings that replace or add to the sandbox's, ``key=value`` separated by whitespace:
the test suite sizes its brokers' thread pools with it (``tests/conftest.py``)."""


def config_overrides(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The broker settings ``$MIRRORFLOW_SANDBOX_BROKER_CONFIG`` sets (none when unset)."""
    value = (os.environ if environ is None else environ).get(CONFIG_VARIABLE, "")
    overrides = {}
    for item in value.split():
        key, sep, setting = item.partition("=")
        if not sep or not key:
            raise MirrorflowError(
                f"{CONFIG_VARIABLE}: {item!r} is not a broker setting (key=value)",
                "set it to settings such as 'num.io.threads=2 num.network.threads=1', or unset it",
            )
        overrides[key] = setting
    return overrides


PERFORMANCE_VARIABLE = "KAFKA_JVM_PERFORMANCE_OPTS"
DEFAULT_PERFORMANCE_OPTIONS = "-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true"
"""What ``kafka-server-start.sh`` gives a broker unless ``$KAFKA_JVM_PERFORMANCE_OPTS`` is set
(its ``-XX:InitiatingHeapOccupancyPercent`` and ``-XX:+ExplicitGCInvokesConcurrent`` left out)."""


def performance_options(environ: Mapping[str, str] | None = None) -> list[str]:
    """The broker JVM's collector and compiler options: ``$KAFKA_JVM_PERFORMANCE_OPTS``, as
    Kafka's own start scripts read it, else their defaults."""
    value = (os.environ if environ is None else environ).get(PERFORMANCE_VARIABLE, "").strip()
    return shlex.split(value or DEFAULT_PERFORMANCE_OPTIONS)


def launch(
    java: str, classpath: str, cluster: Cluster, heap: str, die_with_caller: bool = False
) -> subprocess.Popen:
    data = Path(cluster.directory)
    # A datacenter's broker runs inside its network namespace (``ip netns exec`` execs java,
    # so the process id stays the broker's).
    netns = ["ip", "netns", "exec", cluster.netns] if cluster.netns else []
    cmd = [
        *netns,
        java,
        f"-Xmx{heap}",
        f"-Xms{heap}",
        *performance_options(),
        f"-Dlog4j2.configurationFile={data / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={data}",
        "-cp",
        classpath,
        "kafka.Kafka",
        str(cluster.properties_file),
    ]
    # The kernel's parent-death signal follows the thread that starts the broker: only the
    # main thread's outlives what it starts.
    bound = die_with_caller and threading.current_thread() is threading.main_thread()
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


def wait_until_serving(
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


def create_scram_users(cluster: Cluster) -> None:
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


def terminate(cluster: Cluster, grace: float = 30.0) -> None:
    assert cluster.pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(cluster.pid, signal.SIGTERM)
    processes.wait_for_exit(cluster.pid, grace, interval=0.2, reap=True)
    if cluster.is_running():
        with contextlib.suppress(ProcessLookupError):
            os.kill(cluster.pid, signal.SIGKILL)
