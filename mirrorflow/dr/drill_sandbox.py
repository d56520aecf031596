"""The sandbox cluster a destructive drill crashes (:mod:`mirrorflow.dr.drill`): the sandbox
directory it looks the flow's source up in, which sandbox cluster the source's bootstrap servers
point at, and that cluster's broker killed or restarted with ``mirrorflow sandbox``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from mirrorflow import paths
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.spec import MirrorSpec


def sandbox_dir(configured: str | None) -> Path:
    """The sandbox directory a destructive drill looks its source cluster up in: the drill's
    own (``configured``), else ``$MIRRORFLOW_SANDBOX``, else ``$MIRRORFLOW_STATE/sandbox``."""
    if configured:
        return Path(configured)
    if os.environ.get("MIRRORFLOW_SANDBOX"):
        return Path(os.environ["MIRRORFLOW_SANDBOX"])
    return paths.state_dir() / "sandbox"


PORTS_PER_SANDBOX_CLUSTER = 10  # as mirrorflow.devtools.sandbox lays out its listeners


def sandbox_cluster(bootstrap_servers: str, directory: Path) -> str | None:
    """The name of the sandbox cluster (recorded in ``directory/clusters.json``) that
    ``bootstrap_servers`` point at, None when they are not all loopback ports of one."""
    try:
        clusters = json.loads((directory / "clusters.json").read_text())["clusters"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    found = set()
    for server in filter(None, (s.strip() for s in bootstrap_servers.split(","))):
        address = urlsplit("//" + server.split("://")[-1])
        if address.hostname not in ("127.0.0.1", "localhost", "::1") or address.port is None:
            return None
        names = [
            name
            for name, c in clusters.items()
            if int(c["broker_port"]) <= address.port < int(c["broker_port"]) + 10
        ]
        if len(names) != 1:
            return None
        found.add(names[0])
    return found.pop() if len(found) == 1 else None


def source_sandbox(spec: MirrorSpec, configured: str | None) -> dict[str, str]:
    """The sandbox cluster the flow's source is, as a destructive drill records it
    (``directory``, ``cluster``), looked up in :func:`sandbox_dir` (``configured``: the drill's
    own); refused in one line when the source is none."""
    directory = sandbox_dir(configured)
    name = sandbox_cluster(spec.source_admin.get("bootstrap.servers", ""), directory)
    if name is None:
        raise MirrorflowError(
            f"a destructive drill kills {spec.source}'s broker, and {spec.source} is not "
            f"a mirrorflow sandbox cluster (none in {directory} listens at its "
            "bootstrap servers)",
            "run the non-destructive drill on this flow, or point MIRRORFLOW_SANDBOX "
            "at the sandbox that runs it",
        )
    return {"directory": str(directory), "cluster": name}


def run_sandbox(action: str, sandbox: dict) -> float:
    """Kill (``kill``) or restart (``up``) the sandbox cluster with ``mirrorflow sandbox``;
    returns when it was done (epoch seconds; for a kill the moment its signal was sent, as the
    command prints it)."""
    command = [
        sys.executable,
        "-m",
        "mirrorflow.cli",
        "sandbox",
        "--dir",
        sandbox["directory"],
        action,
        "--clusters",
        sandbox["cluster"],
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    if result.returncode != 0:
        raise MirrorflowError(
            f"mirrorflow sandbox {action} {sandbox['cluster']} failed: "
            + (result.stderr.strip().splitlines() or ["no output"])[-1]
        )
    if action == "kill":
        sent = re.search(r"SIGKILL at ([0-9.]+)", result.stdout)
        if sent is None:
            raise MirrorflowError(
                f"mirrorflow sandbox kill {sandbox['cluster']}: its broker was not running",
                "start it with mirrorflow sandbox up, then run the drill again",
            )
        return float(sent.group(1))
    return time.time()
