"""``mirrorflow sandbox``: start, inspect and stop local clusters; one clear error per failure."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mirrorflow.devtools.sandbox import free_port_block

MIRRORFLOW = [sys.executable, "-m", "mirrorflow.cli"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*MIRRORFLOW, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env or dict(os.environ),
    )


def _alive(pid: int) -> bool:
    """True while the process runs (a zombie waiting for its parent to reap it is not running)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _assert_one_clear_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("mirrorflow: error: ")
    for fragment in fragments:
        assert fragment in result.stderr


@pytest.mark.kafka
def test_sandbox_up_status_down_manage_a_cluster_without_printing_passwords(tmp_path):
    base = free_port_block(10)
    up = _run(
        "sandbox", "--dir", str(tmp_path), "up", "--clusters", "solo", "--base-port", str(base)
    )
    assert up.returncode == 0, up.stderr
    state = json.loads((tmp_path / "clusters.json").read_text())
    cluster = state["clusters"]["solo"]
    assert stat.S_IMODE((tmp_path / "clusters.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "clusters.properties").stat().st_mode) == 0o600
    assert f"bootstrap=127.0.0.1:{base}" in up.stdout
    try:
        status = _run("sandbox", "--dir", str(tmp_path), "status")
        assert status.returncode == 0
        assert "solo" in status.stdout and "running" in status.stdout
        for password in cluster["passwords"].values():
            assert password not in up.stdout + up.stderr + status.stdout + status.stderr
    finally:
        down = _run("sandbox", "--dir", str(tmp_path), "down")
    assert down.returncode == 0 and "solo" in down.stdout
    assert not _alive(cluster["pid"])
    after = _run("sandbox", "--dir", str(tmp_path), "status")
    assert after.returncode == 1 and "stopped" in after.stdout


@pytest.mark.kafka  # starts brokers (which cannot serve)
def test_sandbox_up_names_the_port_in_use_and_the_cluster_that_needs_it(tmp_path):
    base = free_port_block(10)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base))
        holder.listen()
        result = _run(
            "sandbox", "--dir", str(tmp_path), "up", "--clusters", "east", "--base-port", str(base)
        )
    _assert_one_clear_error(result, f"port {base}", "east", "--base-port")


def test_sandbox_up_without_java_says_java_is_missing(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    result = _run("sandbox", "--dir", str(tmp_path), "up", "--clusters", "east", env=env)
    _assert_one_clear_error(result, "java was not found")


@pytest.mark.kafka  # starts brokers (which cannot serve)
def test_sandbox_up_reports_a_broker_that_cannot_start_with_its_log(tmp_path):
    base = free_port_block(10)
    result = _run(
        "sandbox",
        "--dir",
        str(tmp_path),
        "up",
        "--clusters",
        "east",
        "--base-port",
        str(base),
        "--heap",
        "1k",
    )
    _assert_one_clear_error(result, "east", "broker.log")


def test_sandbox_rejects_cluster_names_mirrormaker_could_not_use(tmp_path):
    result = _run("sandbox", "--dir", str(tmp_path), "up", "--clusters", "us.east")
    _assert_one_clear_error(result, "us.east")


def test_sandbox_ports_lie_outside_the_ephemeral_range_so_a_stopped_broker_can_restart():
    # A port in the kernel's ephemeral range can become the local end of some client's
    # connection while its broker is down, and the broker could not bind it again.
    low, high = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for count in (4, 30):
        base = free_port_block(count)
        assert base + count <= low or base > high, (base, count, low, high)


def test_a_port_block_is_not_handed_out_again_while_its_caller_starts_what_binds_it():
    # Airflow binds its port only after migrating its database: a second caller (another test
    # worker, a benchmark) asking meanwhile, from the same starting point, gets another block.
    blocks = [free_port_block(4) for _ in range(3)]
    assert len(set(blocks)) == 3, blocks
    assert all(abs(a - b) >= 4 for a in blocks for b in blocks if a != b), blocks
