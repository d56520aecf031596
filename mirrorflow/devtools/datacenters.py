"""Datacenters for fault tests: sandbox clusters in their own network namespaces.

A datacenter is a network namespace (``ip netns``) joined to this one by a veth pair with two
addresses of a private /30 in ``10.231.0.0/16`` (this side ``.1``, the datacenter ``.2``). Its
broker (a :mod:`mirrorflow.devtools.sandbox` cluster) runs inside the namespace and listens only
on the datacenter's address, so everything that reaches it from here crosses the link, where the
harness can:

- limit the rate (``tc tbf`` on both ends of the veth: the shaping this kernel offers);
- cut the link for a while (this end set down; a ``blackhole`` route for the /30, added with
  the link, keeps packets for the datacenter from falling through to the default route, so no
  traffic ever goes anywhere but the harness's own namespaces and loopback);
- restart the broker.

Delay and random loss need ``tc netem`` (or a ``tc``/``iptables`` action module); when the kernel
lacks it, :func:`capabilities` says so and the harness does without.

Everything is made under names ``mfdc<pid>-<n>`` (namespaces) and ``mf<pid>{h,d}<n>`` (veth
ends), so :func:`cleanup_leftovers` can remove what a killed run left behind without touching
another live run's datacenters. Needs root (CAP_NET_ADMIN).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.errors import MirrorflowError

NETWORK = ipaddress.ip_network("10.231.0.0/16")
_NS_NAME = re.compile(r"^mfdc(\d+)-(\d+)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise MirrorflowError(
            f"ip {' '.join(args)} failed: {result.stderr.strip()}",
            "the fault harness needs root (CAP_NET_ADMIN) and iproute2",
        )
    return result


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["tc", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise MirrorflowError(f"tc {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def unavailable() -> str | None:
    """Why datacenters cannot be made here (None if they can): not root, no ``ip netns``."""
    if os.geteuid() != 0:
        return "the fault harness needs root (network namespaces, veth pairs, tc)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "the fault harness needs iproute2 (ip, tc)"
    probe = f"mfdc{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def capabilities() -> dict[str, bool]:
    """What this kernel lets the harness do to a link: rate (tbf), delay/loss (netem)."""
    name = f"mf{os.getpid()}cap"
    _ip("link", "add", name, "type", "veth", "peer", "name", name + "p")
    try:
        found = {}
        for kind, args in (
            ("rate", ["tbf", "rate", "10mbit", "burst", "32kbit", "latency", "400ms"]),
            ("delay_loss", ["netem", "delay", "25ms", "loss", "1%"]),
        ):
            found[kind] = (
                _tc("qdisc", "add", "dev", name, "root", *args, check=False).returncode == 0
            )
            _tc("qdisc", "del", "dev", name, "root", check=False)
        return found
    finally:
        _ip("link", "del", name, check=False)


@dataclass
class Datacenter:
    """One namespace, its link to this namespace and (once started) its sandbox cluster."""

    name: str  # the namespace
    host_if: str  # this side's veth end
    dc_if: str  # the datacenter's veth end
    host_address: str
    address: str  # the datacenter's: its broker listens there
    directory: Path
    cluster: sandbox_mod.Cluster | None = None
    cuts: int = field(default=0)

    # -- the link -------------------------------------------------------------------------
    def shape(self, rate: str = "10mbit", burst: str = "64kbit", latency: str = "400ms") -> None:
        """Limit the link's rate both ways (a token bucket on each veth end)."""
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        _tc("qdisc", "replace", "dev", self.host_if, *tbf)
        _ip("netns", "exec", self.name, "tc", "qdisc", "replace", "dev", self.dc_if, *tbf)

    def cut(self) -> None:
        """Cut the link: nothing passes either way until :meth:`heal`."""
        _ip("link", "set", self.host_if, "down")
        self.cuts += 1

    def heal(self) -> None:
        _ip("link", "set", self.host_if, "up")

    @contextlib.contextmanager
    def link_cut(self) -> Iterator[None]:
        self.cut()
        try:
            yield
        finally:
            self.heal()

    # -- the cluster ----------------------------------------------------------------------
    def start_cluster(self, alias: str, timeout: float = 120.0) -> sandbox_mod.Cluster:
        """Start a sandbox cluster named ``alias`` inside the datacenter (its own sandbox
        directory), listening on the datacenter's address only."""
        box = sandbox_mod.load(self.directory)
        if alias not in box.clusters:
            box.clusters[alias] = sandbox_mod.Cluster(
                name=alias,
                broker_port=sandbox_mod.DEFAULT_BASE_PORT,
                controller_port=sandbox_mod.DEFAULT_BASE_PORT + 1,
                directory=str(self.directory / alias),
                passwords={u: secrets.token_urlsafe(18) for u in sandbox_mod.USERS},
                host=self.address,
                netns=self.name,
            )
            box.save()
        self.cluster = sandbox_mod.up([alias], self.directory, timeout=timeout)[alias]
        return self.cluster

    def restart_cluster(self, down_seconds: float = 0.0) -> None:
        """Stop the datacenter's broker (SIGTERM), wait, start it again."""
        assert self.cluster is not None
        sandbox_mod.down(self.directory, [self.cluster.name])
        time.sleep(down_seconds)
        self.cluster = sandbox_mod.up([self.cluster.name], self.directory, timeout=180)[
            self.cluster.name
        ]


def _used_subnets() -> set[ipaddress.IPv4Network]:
    out = _ip("-o", "-4", "addr", "show").stdout
    used = set()
    for match in re.finditer(r"inet (10\.231\.\d+\.\d+)/", out):
        used.add(ipaddress.ip_network(match.group(1) + "/30", strict=False))
    for ns in _namespaces():  # the datacenter ends live in their namespaces
        out = _ip("netns", "exec", ns, "ip", "-o", "-4", "addr", "show", check=False).stdout
        for match in re.finditer(r"inet (10\.231\.\d+\.\d+)/", out):
            used.add(ipaddress.ip_network(match.group(1) + "/30", strict=False))
    return used


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def create(index: int, directory: Path) -> Datacenter:
    """Make datacenter ``index`` of this process: namespace, veth pair, addresses, routes."""
    pid = os.getpid()
    name = f"mfdc{pid}-{index}"
    host_if, dc_if = f"mf{pid}h{index}", f"mf{pid}d{index}"
    used = _used_subnets()
    subnet = next(s for s in NETWORK.subnets(new_prefix=30) if s not in used)
    host_address, address = (str(a) for a in list(subnet.hosts())[:2])
    _ip("netns", "add", name)
    _ip("link", "add", host_if, "type", "veth", "peer", "name", dc_if, "netns", name)
    _ip("addr", "add", f"{host_address}/30", "dev", host_if)
    _ip("link", "set", host_if, "up")
    # While the link is cut, packets for the datacenter die here instead of taking the
    # default route out of the machine.
    _ip("route", "add", "blackhole", str(subnet), "metric", "4000")
    inside = ["netns", "exec", name, "ip"]
    _ip(*inside, "link", "set", "lo", "up")
    _ip(*inside, "addr", "add", f"{address}/30", "dev", dc_if)
    _ip(*inside, "link", "set", dc_if, "up")
    directory.mkdir(parents=True, exist_ok=True)
    return Datacenter(name, host_if, dc_if, host_address, address, directory)


def delete(dc: Datacenter) -> None:
    """Stop the datacenter's broker and remove its namespace, link and route."""
    with contextlib.suppress(Exception):
        sandbox_mod.down(dc.directory)
    _remove(dc.name, dc.host_if)


def _remove(name: str, host_if: str) -> None:
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:  # anything still running inside (a broker whose stop failed)
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    out = _ip("-o", "-4", "addr", "show", "dev", host_if, check=False).stdout
    match = re.search(r"inet (10\.231\.\d+\.\d+)/", out)
    if match:
        subnet = ipaddress.ip_network(match.group(1) + "/30", strict=False)
        _ip("route", "del", "blackhole", str(subnet), "metric", "4000", check=False)
    _ip("link", "del", host_if, check=False)  # deletes both ends
    _ip("netns", "del", name, check=False)


def cleanup_leftovers() -> list[str]:
    """Remove datacenters left by runs whose process is gone; return their names."""
    removed = []
    for name in _namespaces():
        match = _NS_NAME.match(name)
        if not match:
            continue
        owner, index = int(match.group(1)), match.group(2)
        if owner != os.getpid() and Path(f"/proc/{owner}").exists():
            continue  # a live run's
        _remove(name, f"mf{owner}h{index}")
        removed.append(name)
    # blackhole routes whose link is gone
    for line in _ip("route", "show", "type", "blackhole", check=False).stdout.splitlines():
        match = re.match(r"blackhole (10\.231\.\d+\.\d+/30) .*metric 4000", line)
        if match and not _ip("route", "show", "root", match.group(1), check=False).stdout.count(
            "dev"
        ):
            _ip("route", "del", "blackhole", match.group(1), "metric", "4000", check=False)
    return removed


@contextlib.contextmanager
def datacenters(count: int, directory: Path) -> Iterator[list[Datacenter]]:
    """``count`` datacenters under ``directory``, always removed afterwards (failures too)."""
    cleanup_leftovers()
    made: list[Datacenter] = []
    try:
        for index in range(count):
            made.append(create(index, directory / f"dc{index}"))
        yield made
    finally:
        for dc in made:
            delete(dc)
