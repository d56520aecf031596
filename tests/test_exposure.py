"""Nothing a mirror job runs answers beyond loopback, its Spark UI cannot stop it, and no secret
leaks into a file, a log, a command line or an environment.

Listeners are judged by the address they are bound to (from /proc); requests go to loopback only.
"""

from __future__ import annotations

import http.client
import http.server
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mirrorflow.devtools.local_airflow import SERVICES, LocalAirflow
from mirrorflow.devtools.sandbox import free_port_block
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import private_dir, write_private
from mirrorflow.runtime import spark_security
from tests import exposure
from tests.conftest import create_topics
from tests.mirror_harness import (
    flow_file,
    produce,
    progress,
    read_topic,
    start_mirror,
    stop_job,
    wait_for,
)

FLOW = "primary->secondary"


def test_secret_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        target = tmp_path / "open" / "secret.properties"
        target.parent.mkdir(mode=0o777)
        target.write_text("old")
        target.chmod(0o666)
        write_private(target, "password=x\n")
        fresh = write_private(tmp_path / "new" / "deeper" / "secret.json", "{}")
    finally:
        os.umask(old)
    assert target.read_text() == "password=x\n"
    for path in (target, fresh):
        assert exposure.mode(path) == 0o600, path
        assert exposure.mode(path.parent) == 0o700, path.parent
    assert exposure.mode(private_dir(tmp_path / "open")) == 0o700


def test_the_ui_opens_only_where_and_how_it_is_asked_to(monkeypatch):
    monkeypatch.delenv(spark_security.PROPERTIES_SWITCH, raising=False)
    monkeypatch.delenv(spark_security.UI_SWITCH, raising=False)
    local = spark_security.for_master("local[*]")
    assert local.conf["spark.ui.enabled"] == "false"
    assert local.conf["spark.driver.bindAddress"] == local.conf["spark.driver.host"] == "127.0.0.1"
    monkeypatch.setenv(spark_security.UI_SWITCH, "127.0.0.1:4999")
    opened = spark_security.for_master("local[2]")
    assert opened.conf["spark.ui.enabled"] == "true"
    assert opened.conf["spark.ui.killEnabled"] == "false"
    assert spark_security.environment() == {"SPARK_LOCAL_IP": "127.0.0.1"}
    for wide in ("0.0.0.0:4999", "[::]:4999", "10.1.2.3:4999"):
        monkeypatch.setenv(spark_security.UI_SWITCH, wide)
        with pytest.raises(spark_security.MirrorflowError, match="without authentication"):
            spark_security.for_master("local[*]")
    with pytest.raises(spark_security.MirrorflowError, match="secret on spark-submit"):
        spark_security.check_no_secret({"spark.authenticate.secret": "x"})


def test_a_ui_beyond_loopback_needs_a_filter_that_authenticates(monkeypatch, tmp_path):
    properties = tmp_path / "spark.properties"
    monkeypatch.setenv(spark_security.PROPERTIES_SWITCH, str(properties))
    monkeypatch.setenv(spark_security.UI_SWITCH, "0.0.0.0:4999")
    monkeypatch.delenv(spark_security.AUTH_FILTERS_SWITCH, raising=False)
    jws = "org.apache.spark.ui.JWSFilter"
    refused = {
        "spark.ui.filters=\n": "is empty",
        "spark.ui.filters= , \n": "is empty",
        "spark.ui.filters=com.example.LoggingFilter\n": "does not know to authenticate",
        f"spark.ui.filters={jws}\n": "without spark.org.apache.spark.ui.JWSFilter.param.secretKey",
    }
    for text, why in refused.items():
        write_private(properties, text)
        with pytest.raises(spark_security.MirrorflowError, match=why) as error:
            spark_security.for_master("local[*]")
        assert "\n" not in str(error.value)
    write_private(
        properties, f"spark.ui.filters={jws}\n{jws.join(['spark.', '.param.secretKey'])}=k\n"
    )
    opened = spark_security.for_master("local[*]")
    assert f"authentication filter {jws}" in opened.exposes[-1]
    assert "=k" not in " ".join(opened.exposes)
    # A filter of the user's own, vouched for where the job starts.
    write_private(properties, "spark.ui.filters=com.example.SsoFilter\n")
    monkeypatch.setenv(spark_security.AUTH_FILTERS_SWITCH, "com.example.SsoFilter")
    assert "com.example.SsoFilter" in spark_security.for_master("local[*]").exposes[-1]


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("ui", ["off", "on-loopback"])
def test_a_mirror_job_answers_on_loopback_only_and_its_ui_cannot_stop_it(
    sandbox, topic_name, tmp_path, monkeypatch, ui
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    ui_port = None
    if ui == "on-loopback":
        ui_port = free_port_block(1)
        monkeypatch.setenv(spark_security.UI_SWITCH, f"127.0.0.1:{ui_port}")
    else:
        monkeypatch.delenv(spark_security.UI_SWITCH, raising=False)
    t = topic_name("exposed")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 40)
    config = flow_file(tmp_path, sandbox, t)
    state = tmp_path / "state"
    log = tmp_path / "job.log"
    job = start_mirror(config, FLOW, state, log)
    try:
        wait_for(lambda: progress(state).get("records", 0) >= 40, 180, "the first records")
        members = exposure.session_members(job.pid)
        found = exposure.listeners(members)
        # The driver's RPC endpoint at least: a test that sees no listener sees nothing.
        assert found, f"no listening socket in the job's processes {members}"
        wide = [str(listener) for listener in found if not listener.loopback]
        assert not wide, "listening beyond loopback:\n" + "\n".join(wide)

        answering = [lst.port for lst in found if _http_status(lst.port, "/jobs/") is not None]
        if ui_port is None:
            assert answering == [], f"an HTTP server (the Spark UI?) answers on {answering}"
        else:
            assert answering == [ui_port]
            assert _http_status(ui_port, "/jobs/") == 200
            # The kill links of every job and stage (as the report did), sent while a
            # large batch is copied: the flow keeps running and copies everything.
            produce(primary, t, 2, 20000, start=40)
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                for n in range(40):
                    _http_status(ui_port, f"/jobs/job/kill/?id={n}")
                    _http_status(ui_port, f"/stages/stage/kill/?id={n}&terminate=true")
            wait_for(lambda: _copied_while_alive(job, state, 20040), 180, "all the records")
            assert job.poll() is None, log.read_text()[-3000:]

        passwords = [p for c in sandbox.clusters.values() for p in c.passwords.values()]
        for pid in exposure.session_members(job.pid):
            line, env = exposure.command_line(pid), exposure.environment(pid)
            assert not [p for p in passwords if p in line or p in env], f"pid {pid} ({line[:80]})"
    finally:
        stop_job(job)
    assert sum(map(len, read_topic(secondary, f"primary.{t}").values())) >= 40

    # Files: the ones that hold secrets are private; nothing else holds a password.
    box = sandbox.directory
    private = [box / "clusters.json", box / "clusters.properties", config]
    private += [Path(c.properties_file) for c in sandbox.clusters.values()]
    for path in private:
        assert exposure.mode(path) == 0o600, path
        assert exposure.mode(path.parent) == 0o700, path.parent
    logs = [log, state, *box.glob("*/*.log")]
    assert exposure.files_holding(passwords, logs) == []


def _copied_while_alive(job, state: Path, records: int) -> bool:
    """Whether the flow has copied ``records``; fails at once if its job ended or it failed."""
    assert job.poll() is None, f"the job ended (exit {job.returncode})"
    assert progress(state).get("state") in ("RUNNING", "IDLE"), progress(state)
    return progress(state).get("records", 0) >= records


def _http_status(port: int, path: str) -> int | None:
    """The HTTP status a loopback port answers ``path`` with; ``None``: it does not speak HTTP."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, ValueError, http.client.HTTPException):
        return None


@pytest.mark.airflow
def test_the_local_airflow_answers_on_loopback_only_and_keeps_its_password_private(tmp_path):
    """The demo's Airflow (api-server, scheduler, dag-processor, triggerer), started with a
    umask that would leave every file open to all."""
    airflow = LocalAirflow(tmp_path / "airflow", tmp_path / "state", say=lambda _text: None)
    airflow.choose_port(free_port_block(1))
    old = os.umask(0)
    try:
        airflow.migrate()
        airflow.start_services()
    finally:
        os.umask(old)
    try:
        airflow.wait_for_api()
        password = airflow.ui_password()
        airflow.api()  # the password made before the api-server started is the UI's
        # Give the scheduler and triggerer the time to start whatever they listen on.
        wait_for(lambda: _airflow_started(airflow.home), 120, "the scheduler and triggerer")
        time.sleep(5)
        sessions = airflow.running_services()
        assert set(sessions) == set(SERVICES)
        members = [pid for leader in sessions.values() for pid in exposure.session_members(leader)]
        found = exposure.listeners(members)
        assert airflow.port in {listener.port for listener in found}
        wide = [str(listener) for listener in found if not listener.loopback]
        assert not wide, "listening beyond loopback:\n" + "\n".join(wide)
    finally:
        airflow.stop_services(say=lambda _text: None)
    assert exposure.mode(airflow.home) == 0o700
    for name in (airflow.password_file.name, "airflow.cfg", "airflow.db"):
        assert exposure.mode(airflow.home / name) == 0o600, name
    everything_else = [p for p in airflow.home.rglob("*") if p != airflow.password_file]
    assert exposure.files_holding([password], everything_else) == []


def test_another_airflow_on_the_port_is_named_not_taken_for_the_one_started(tmp_path):
    """An api-server that cannot bind its port (another Airflow took it first) must not leave
    the caller talking to the other one: it answers health checks, but not this home's user."""

    class OtherAirflow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/api/v2/monitor/health" else 404)
            self.end_headers()

        def do_POST(self):
            self.send_response(401)
            self.end_headers()

        def log_message(self, *_args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", free_port_block(1)), OtherAirflow)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        airflow = LocalAirflow(tmp_path / "airflow", tmp_path / "state", say=lambda _text: None)
        airflow.port = other.server_address[1]
        airflow.ensure_password()
        with pytest.raises(MirrorflowError, match="another Airflow answers on") as error:
            airflow.wait_for_api(timeout=10)
    finally:
        other.shutdown()
        other.server_close()
    assert f"127.0.0.1:{airflow.port}" in str(error.value)
    assert "--port" in str(error.value)
    assert airflow.ui_password() not in str(error.value)


def _airflow_started(home: Path) -> bool:
    logs = {name: (home / "logs" / f"{name}.log").read_text(errors="replace") for name in SERVICES}
    return "Starting the scheduler" in logs["scheduler"] and "Starting" in logs["triggerer"]
