"""Test harness: real Kafka clusters started once per session, an initialised Airflow home.

Clusters come from :mod:`mirrorflow.devtools.sandbox` (the same code as ``mirrorflow sandbox up``),
on free loopback ports in a temporary directory, so a developer's own sandbox keeps running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

# Airflow reads its configuration when first imported: point it at a private home first.
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="mirrorflow-tests-"))
os.environ["AIRFLOW_HOME"] = str(_SESSION_DIR / "airflow")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_SESSION_DIR / "airflow" / "dags")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
os.environ["MIRRORFLOW_STATE"] = str(_SESSION_DIR / "state")
# Every process the session starts inherits this: those still running once pytest has exited
# are named and ended, and fail ``make test`` (tests/leftovers.py).
os.environ.setdefault("MIRRORFLOW_TEST_RUN", f"mirrorflow-test-run-{uuid.uuid4().hex}")
# The processes of this pytest process (one of several with pytest-xdist, each with its own
# clusters, Airflow home and state): what a module leaves running is this session's to stop.
SESSION_VARIABLE = "MIRRORFLOW_TEST_SESSION"
os.environ[SESSION_VARIABLE] = str(_SESSION_DIR)
# Connections stored in the metadata DB are encrypted, as in any real deployment (Airflow would
# keep their passwords in clear text without a key; tests scan the Airflow home for secrets).
os.environ.setdefault("AIRFLOW__CORE__FERNET_KEY", Fernet.generate_key().decode())
# As with an activated virtualenv: its tools (spark-submit, airflow) first on PATH, and Spark's
# Python workers run the same interpreter as the tests.
_VENV_BIN = str(Path(sys.executable).parent)
os.environ["PATH"] = _VENV_BIN + os.pathsep + os.environ.get("PATH", "")
os.environ["PYSPARK_PYTHON"] = sys.executable
# The suite's JVMs start often and live briefly: each Spark driver (SPARK_SUBMIT_OPTS, read by
# spark-submit) and each sandbox broker (KAFKA_JVM_PERFORMANCE_OPTS, read as Kafka's start scripts
# read it) compiles with C1 only, and brokers collect with SerialGC on their small heaps. A mirror
# job's start costs 4.8 CPU-s instead of 7.7, an idle broker 2.0% of a core instead of 2.7%
# (docs/development.md, *Tests*). Set either variable to run the suite with other options.
# The drivers' temporary files (lz4's native library) and Spark's scratch space (blockmgr-*,
# spark-*) go to the session's directory, which a passing session removes: a job a test
# SIGKILLs cannot remove its own, and they piled up in /tmp (1.3 GB after a day of runs).
(_SESSION_DIR / "jvm-tmp").mkdir()
os.environ.setdefault(
    "SPARK_SUBMIT_OPTS", f"-XX:TieredStopAtLevel=1 -Djava.io.tmpdir={_SESSION_DIR / 'jvm-tmp'}"
)
os.environ.setdefault("SPARK_LOCAL_DIRS", str(_SESSION_DIR / "spark-local"))
os.environ.setdefault(
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData -Djava.awt.headless=true",
)
# And the brokers' thread pools sized for a few clients on 2 cores rather than a production
# server's (8 request handlers, 3 network threads per listener, 10 background threads...): an
# idle broker then uses 1.0% of a core instead of 1.6% (docs/development.md, *Tests*).
os.environ.setdefault(
    "MIRRORFLOW_SANDBOX_BROKER_CONFIG",
    "num.io.threads=2 num.network.threads=1 background.threads=2 "
    "group.coordinator.threads=1 share.coordinator.threads=1",
)
# py4j logs at INFO when its connections are garbage-collected at exit, after pytest has
# closed the streams its handlers write to ("--- Logging error ---" after the summary).
logging.getLogger("py4j").setLevel(logging.WARNING)

from confluent_kafka.admin import (  # noqa: E402
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from mirrorflow.devtools import local_airflow  # noqa: E402
from mirrorflow.devtools import sandbox as sandbox_mod  # noqa: E402
from tests import schedule  # noqa: E402

sandbox_mod.DIE_WITH_CALLER = True  # a crashed test run leaves no broker behind
local_airflow.DIE_WITH_CALLER = True  # nor an Airflow service

SANDBOX_CLUSTERS = ("primary", "secondary", "tertiary")

# Long variants of a claim the default suite already proves in another mode (docs/development.md,
# *Tests*): marked ``slow``, run with MIRRORFLOW_SLOW_TESTS=1, ``-m slow`` or by naming the test.
SLOW_SWITCH = "MIRRORFLOW_SLOW_TESTS"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write each test file's seconds to PATH as JSON (tests/durations.json orders the "
        "files: tests/schedule.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"slow: a long variant left out of the default suite; {SLOW_SWITCH}=1 or -m slow runs it",
    )
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):  # xdist's controller gets every report
        config.pluginmanager.register(schedule.DurationRecorder(Path(path)), "record-durations")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A passing session removes its directory (its clusters' data, Airflow home and state:
    up to some hundred MB each, per pytest process); a failing one keeps it for its logs."""
    if exitstatus == 0:
        shutil.rmtree(_SESSION_DIR, ignore_errors=True)
    else:
        print(f"\nthis session's clusters, Airflow home and state are kept in {_SESSION_DIR}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave ``slow`` tests out unless asked for: the switch, a ``-m`` naming them, or their
    node id on the command line."""
    if os.environ.get(SLOW_SWITCH) == "1" or "slow" in (config.option.markexpr or ""):
        return
    named = [arg.split("tests/", 1)[-1] for arg in config.args if "::" in arg]

    def asked_for(item: pytest.Item) -> bool:
        test = item.nodeid.split("tests/", 1)[-1]
        return any(test == arg or test.startswith(arg + "[") for arg in named)

    slow = [i for i in items if i.get_closest_marker("slow") and not asked_for(i)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]
    items[:] = schedule.longest_files_first(items)


def _mirror_jobs() -> dict[int, str]:
    """The mirror jobs' drivers this session (this pytest worker) started that still run:
    pid -> command line."""
    import psutil

    from mirrorflow.runtime import launch
    from tests import leftovers

    run = os.environ[leftovers.VARIABLE]
    found = {}
    for process in psutil.process_iter(["cmdline", "environ"]):
        argv = process.info["cmdline"] or []
        environment = process.info["environ"] or {}
        if environment.get(leftovers.VARIABLE) != run or not argv:
            continue
        if environment.get(SESSION_VARIABLE, str(_SESSION_DIR)) != str(_SESSION_DIR):
            continue
        if "java" not in Path(argv[0]).name and any(
            a.endswith(launch.MIRROR_JOB.name) for a in argv[1:3]
        ):
            found[process.pid] = " ".join(argv)[:200]
    return found


@pytest.fixture(scope="module", autouse=True)
def _no_mirror_job_outlives_its_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """A mirror job a module started (a DAG's, left in the grace period its Airflow task's end
    gives it) is stopped when the module ends: it would hold its flow's lease on the shared
    sandbox's target, and the next module's job of that flow would wait, then fail, naming it."""
    import psutil

    before = set(_mirror_jobs())
    yield
    left = {pid: line for pid, line in _mirror_jobs().items() if pid not in before}
    if not left:
        return
    processes = []
    for pid in left:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            process.terminate()  # the job stops after its batch and releases the lease
            processes.append(process)
    _gone, alive = psutil.wait_procs(processes, timeout=60)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()  # a dead holder of this host frees the lease at once
    warnings.warn(
        f"{request.module.__name__} left {len(left)} mirror job(s) running, stopped now: "
        + "; ".join(f"pid {pid}: {line}" for pid, line in left.items()),
        stacklevel=1,
    )


@pytest.fixture(scope="session")
def _session_sandbox() -> Iterator[sandbox_mod.Sandbox]:
    directory = _SESSION_DIR / "sandbox"
    base = sandbox_mod.free_port_block(len(SANDBOX_CLUSTERS) * sandbox_mod.PORTS_PER_CLUSTER)
    try:
        yield sandbox_mod.up(SANDBOX_CLUSTERS, directory, base_port=base)
    finally:
        sandbox_mod.down(directory)


@pytest.fixture
def sandbox(_session_sandbox: sandbox_mod.Sandbox) -> sandbox_mod.Sandbox:
    """Three independent Kafka clusters (primary, secondary, tertiary), shared by the session.

    Each test gets them running: a broker that an earlier test left stopped or that died is
    restarted (with a warning naming its last log error), so one failure does not fail every
    test after it.
    """
    directory = _session_sandbox.directory
    current = sandbox_mod.load(directory)
    dead = [n for n in SANDBOX_CLUSTERS if not current[n].is_running()]
    for name in dead:
        warnings.warn(
            f"sandbox cluster {name} was not running at the start of this test; restarting it. "
            f"Its log's last error: {sandbox_mod.last_error(current[name].log_file)}",
            stacklevel=1,
        )
    return sandbox_mod.up(SANDBOX_CLUSTERS, directory) if dead else current


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Unique topic names per test: ``topic_name("orders")`` -> ``orders-<test>-<random>``."""
    stem = request.node.name.replace("[", "-").replace("]", "")[-30:].strip("-_")

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{stem}-{uuid.uuid4().hex[:6]}"

    return make


def create_topics(cluster: sandbox_mod.Cluster, *names: str, partitions: int = 1) -> None:
    """Create topics on a sandbox cluster and wait for the creation to finish."""
    admin = AdminClient(cluster.client_config())
    futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    for future in futures.values():
        future.result(timeout=30)


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """An Airflow home with an initialised SQLite metadata DB (``airflow db migrate``)."""
    home = Path(os.environ["AIRFLOW_HOME"])
    Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run(
        [str(airflow), "db", "migrate"], capture_output=True, text=True, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return home


def allow(
    cluster: sandbox_mod.Cluster,
    user: str,
    resource: ResourceType,
    name: str,
    *operations: AclOperation,
) -> None:
    """Grant ``user`` the ``operations`` on one literal resource of a sandbox cluster."""
    admin = AdminClient(cluster.client_config())
    bindings = [
        AclBinding(
            resource,
            name,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in operations
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


def topic_acls(
    cluster: sandbox_mod.Cluster, topic: str, permission: AclPermissionType = AclPermissionType.ANY
) -> list[AclBinding]:
    """The ACLs of one literal topic of a sandbox cluster, every operation, of ``permission``."""
    admin = AdminClient(cluster.client_config())
    return admin.describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            None,
            None,
            AclOperation.ANY,
            permission,
        ),
        request_timeout=30,
    ).result(timeout=60)
