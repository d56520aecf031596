"""Datacenters for fault tests: sandbox clusters in their own network namespaces.

A datacenter is a network namespace (``ip netns``) joined to this one by an emulated link: two
TUN devices, one here and one moved into the namespace, with two addresses of a private /30 in
``10.231.0.0/16`` (this side ``.1``, the datacenter ``.2``), and a forwarder process
(:mod:`mirrorflow.devtools.linkemu`) that passes every packet from one device to the other
through the link's conditions. Its broker (a :mod:`mirrorflow.devtools.sandbox` cluster) runs
inside the namespace and listens only on the datacenter's address, so everything that reaches
it from here crosses the link, where the harness can:

- set delay (+ jitter), random loss and a rate, the same both ways (:meth:`Datacenter.shape`:
  what ``tc netem`` would do; this machine's kernel has no netem, so it is done in userspace);
- cut the link for a while (the forwarder drops everything);
- restart the broker.

The namespace has no route but its /30, and a ``blackhole`` route for the /30 here (added with
the link) keeps packets for the datacenter from falling through to the default route when the
link is gone, so no traffic ever goes anywhere but the harness's own namespaces and loopback.

Everything is made under names ``mfdc<pid>-<n>`` (namespaces) and ``mf<pid>{h,d}<n>`` (the TUN
devices), so :func:`cleanup_leftovers` can remove what a killed run left behind without touching
another live run's datacenters; the devices are not persistent and vanish with their forwarder,
which exits when its owner does. Needs root (CAP_NET_ADMIN) and ``/dev/net/tun``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from mirrorflow.devtools import linkemu
from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.errors import MirrorflowError

NETWORK = ipaddress.IPv4Network("10.231.0.0/16")
_INDEX = itertools.count()  # datacenters of this process are numbered across all their sets
_NS_NAME = re.compile(r"^mfdc(\d+)-(\d+)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise MirrorflowError(
            f"ip {' '.join(args)} failed: {result.stderr.strip()}",
            "the fault harness needs root (CAP_NET_ADMIN) and iproute2",
        )
    return result


def unavailable() -> str | None:
    """Why datacenters cannot be made here (None if they can): not root, no ``ip netns``, no
    TUN devices."""
    if os.geteuid() != 0:
        return "the fault harness needs root (network namespaces, TUN devices)"
    if not shutil.which("ip"):
        return "the fault harness needs iproute2 (ip)"
    if not _tun_works():
        return "the fault harness needs TUN devices (/dev/net/tun, CONFIG_TUN)"
    probe = f"mfdc{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def capabilities() -> dict[str, bool]:
    """What the harness can do to a link here: with TUN devices (``/dev/net/tun``) the userspace
    emulator (:mod:`mirrorflow.devtools.linkemu`) gives rate, delay, jitter, loss and cuts."""
    tun = _tun_works()
    return {kind: tun for kind in ("rate", "delay", "jitter", "loss", "cut")}


def _tun_works() -> bool:
    try:
        os.close(linkemu.open_tun(f"mf{os.getpid()}cap"))  # not persistent: gone once closed
    except OSError:
        return False
    return True


_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)?$", re.IGNORECASE)
_RATE_UNITS = {
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "bps": 1,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
}


def parse_rate(rate: str) -> float:
    """Bytes per second from a rate as ``tc`` writes it (``10mbit``, ``512kbit``, ``2mbps``:
    ``bit`` units are bits, ``bps`` units bytes, k/m/g powers of 1000)."""
    match = _RATE.match(rate.strip())
    if not match or float(match.group(1)) <= 0:
        raise MirrorflowError(
            f"link rate {rate!r} is not a rate", "write it as tc does, e.g. 10mbit or 512kbit"
        )
    return float(match.group(1)) * _RATE_UNITS[(match.group(2) or "bit").lower()]


@dataclass
class Datacenter:
    """One namespace, its emulated link to this namespace and (once started) its cluster."""

    name: str  # the namespace
    host_if: str  # this side's TUN device
    dc_if: str  # the datacenter's TUN device
    host_address: str
    address: str  # the datacenter's: its broker listens there
    directory: Path
    cluster: sandbox_mod.Cluster | None = None
    cuts: int = field(default=0)
    forwarder: subprocess.Popen | None = field(default=None, repr=False)
    conditions: dict[str, object] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- the link -------------------------------------------------------------------------
    def _command(self, **command: object) -> dict:
        """Send one command to the link's forwarder; its answer."""
        forwarder = self.forwarder
        if forwarder is None or forwarder.poll() is not None:
            raise MirrorflowError(f"the link of datacenter {self.name} is gone: its forwarder died")
        assert forwarder.stdin is not None and forwarder.stdout is not None
        with self._lock:
            forwarder.stdin.write(json.dumps(command).encode() + b"\n")
            forwarder.stdin.flush()
            line = _read_line(forwarder, 10.0)
        return json.loads(line)

    def shape(
        self,
        rate: str | None = "10mbit",
        delay_ms: float = 0.0,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
        queue_ms: float = 200.0,
        seed: int | None = None,
    ) -> None:
        """Set the link's conditions, the same both ways (as ``tc netem`` on both ends).

        ``rate`` as tc writes it (``10mbit``; None: unlimited), with a drop-tail queue of
        ``queue_ms`` of backlog; ``delay_ms`` one way (25 ms each way is a 50 ms round trip)
        plus a uniform ``±jitter_ms`` (packets may then be reordered; without jitter each
        direction keeps its order); ``loss`` the probability that a packet is dropped, from an
        RNG seeded with ``seed`` (default: this datacenter's name).
        """
        if not 0.0 <= loss < 1.0:
            raise MirrorflowError(f"link loss {loss} is not a probability", "give 0 <= loss < 1")
        if delay_ms < 0 or jitter_ms < 0 or queue_ms <= 0:
            raise MirrorflowError(
                f"link delay {delay_ms} ms, jitter {jitter_ms} ms, queue {queue_ms} ms",
                "delay and jitter are >= 0, the queue > 0",
            )
        self._command(
            rate=parse_rate(rate) if rate else None,
            delay=delay_ms / 1000,
            jitter=jitter_ms / 1000,
            loss=loss,
            queue=queue_ms / 1000,
            seed=self.name if seed is None else seed,
        )
        self.conditions = {
            "rate": rate,
            "delay_ms": delay_ms,
            "jitter_ms": jitter_ms,
            "loss": loss,
            "queue_ms": queue_ms,
        }

    def cut(self) -> None:
        """Cut the link: nothing passes either way (packets in flight are lost) until
        :meth:`heal`."""
        self._command(cut=True)
        self.cuts += 1

    def heal(self) -> None:
        self._command(cut=False)

    @contextlib.contextmanager
    def link_cut(self) -> Iterator[None]:
        self.cut()
        try:
            yield
        finally:
            self.heal()

    def link_stats(self, reset: bool = False) -> dict:
        """The forwarder's counters per direction (``to_dc``, ``to_host``: packets, bytes,
        lost, cut, queue_full, delivered) and its CPU seconds so far; ``reset`` zeroes the
        counters after reading them."""
        reply = self._command(stats=True, reset=reset)
        return {"cpu_seconds": reply["cpu_seconds"], **reply["stats"]}

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
        used.add(ipaddress.IPv4Network(match.group(1) + "/30", strict=False))
    for ns in _namespaces():  # the datacenter ends live in their namespaces
        out = _ip("netns", "exec", ns, "ip", "-o", "-4", "addr", "show", check=False).stdout
        for match in re.finditer(r"inet (10\.231\.\d+\.\d+)/", out):
            used.add(ipaddress.IPv4Network(match.group(1) + "/30", strict=False))
    return used


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _read_line(process: subprocess.Popen, timeout: float) -> bytes:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else b""
    if not line:
        raise MirrorflowError(
            f"the link emulator (pid {process.pid}) did not answer within {timeout:.0f}s",
            "see its error above; it needs /dev/net/tun and root",
        )
    return line


def _start_forwarder(host_if: str, dc_if: str) -> subprocess.Popen:
    """The link's forwarder (:mod:`mirrorflow.devtools.linkemu`), once both its devices exist.
    Its own session (Ctrl-C is for its owner); it exits when its standard input closes."""
    process = subprocess.Popen(
        [sys.executable, "-m", "mirrorflow.devtools.linkemu", host_if, dc_if],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _read_line(process, 30.0)
    except Exception:
        _stop_forwarder(process)
        raise
    return process


def _stop_forwarder(process: subprocess.Popen | None) -> None:
    if process is None:
        return
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()  # its signal to go; its devices go with it
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
    if process.stdout is not None:
        process.stdout.close()


def create(index: int, directory: Path, mtu: int = 1500) -> Datacenter:
    """Make datacenter ``index`` of this process: namespace, its link (two TUN devices and
    their forwarder, conditions unset: no delay, loss or rate limit), addresses, routes."""
    pid = os.getpid()
    name = f"mfdc{pid}-{index}"
    host_if, dc_if = f"mf{pid}h{index}", f"mf{pid}d{index}"
    used = _used_subnets()
    subnet = next(s for s in NETWORK.subnets(new_prefix=30) if s not in used)
    host_address, address = (str(a) for a in list(subnet.hosts())[:2])
    _ip("netns", "add", name)
    forwarder = None
    try:
        forwarder = _start_forwarder(host_if, dc_if)
        _ip("link", "set", dc_if, "netns", name)
        _ip("addr", "add", f"{host_address}/30", "dev", host_if)
        _ip("link", "set", host_if, "mtu", str(mtu), "up")
        # While the link is down (its forwarder gone), packets for the datacenter die here
        # instead of taking the default route out of the machine.
        _ip("route", "add", "blackhole", str(subnet), "metric", "4000")
        inside = ["netns", "exec", name, "ip"]
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "addr", "add", f"{address}/30", "dev", dc_if)
        _ip(*inside, "link", "set", dc_if, "mtu", str(mtu), "up")
    except Exception:
        _stop_forwarder(forwarder)
        _remove(name, host_if, subnet)
        raise
    directory.mkdir(parents=True, exist_ok=True)
    return Datacenter(name, host_if, dc_if, host_address, address, directory, forwarder=forwarder)


def delete(dc: Datacenter) -> None:
    """Stop the datacenter's broker and its link's forwarder, remove its namespace and route."""
    with contextlib.suppress(Exception):
        sandbox_mod.down(dc.directory)
    subnet = ipaddress.IPv4Network(dc.host_address + "/30", strict=False)
    _stop_forwarder(dc.forwarder)
    _remove(dc.name, dc.host_if, subnet)


def _remove(name: str, host_if: str, subnet: ipaddress.IPv4Network | None = None) -> None:
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:  # anything still running inside (a broker whose stop failed)
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    if subnet is None:
        out = _ip("-o", "-4", "addr", "show", "dev", host_if, check=False).stdout
        match = re.search(r"inet (10\.231\.\d+\.\d+)/", out)
        if match:
            subnet = ipaddress.IPv4Network(match.group(1) + "/30", strict=False)
    if subnet is not None:
        _ip("route", "del", "blackhole", str(subnet), "metric", "4000", check=False)
    _ip("link", "del", host_if, check=False)  # a forwarder's leftover device (or a veth)
    _ip("netns", "del", name, check=False)


def cleanup_leftovers() -> list[str]:
    """Remove datacenters left by runs whose process is gone; return their names."""
    removed = []
    for name in _namespaces():
        match = _NS_NAME.match(name)
        if not match:
            continue
        owner, index = int(match.group(1)), match.group(2)
        if owner != os.getpid() and psutil.pid_exists(owner):
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
            made.append(create(next(_INDEX), directory / f"dc{index}"))
        yield made
    finally:
        for dc in made:
            delete(dc)
