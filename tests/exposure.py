"""What a process tree exposes, read through psutil: its listening TCP sockets (judged by the
address they are bound to), its command lines and environments, and files that hold secrets."""

from __future__ import annotations

import ipaddress
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from mirrorflow.runtime import processes


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback

    def __str__(self) -> str:
        return f"{self.address}:{self.port} (pid {self.pid}, {self.command[:80]})"


def session_members(session: int) -> list[int]:
    """Every live process of the session ``session`` (a job started with start_new_session)."""
    return processes.session_members(session)


def command_line(pid: int) -> str:
    return " ".join(processes.command_line(pid))


def environment(pid: int) -> str:
    try:
        variables = psutil.Process(pid).environ()
    except psutil.Error:
        return ""
    return "\n".join(f"{name}={value}" for name, value in variables.items())


def _address(ip: str) -> str:
    """``ip`` as bound: an IPv4-mapped IPv6 address (a Java socket's) as its IPv4 address."""
    mapped = ipaddress.ip_address(ip)
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped:
        return str(mapped.ipv4_mapped)
    return ip


def listeners(pids: Iterable[int]) -> list[Listener]:
    """The listening TCP sockets the processes ``pids`` hold, with their bound addresses."""
    found = []
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        for connection in connections:
            if connection.status == psutil.CONN_LISTEN:
                address = _address(connection.laddr.ip)
                found.append(Listener(pid, command_line(pid), address, connection.laddr.port))
    return sorted(set(found), key=lambda listener: (listener.port, listener.pid))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def files_holding(secrets: Iterable[str], roots: Iterable[Path]) -> list[str]:
    """Every regular file under ``roots`` (kept under 20 MB) that holds one of ``secrets``."""
    secrets = [s.encode() for s in secrets if s]
    holding = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if not path.is_file() or path.is_symlink() or path.stat().st_size > 20 << 20:
                continue
            data = path.read_bytes()
            holding += [str(path) for s in secrets if s in data][:1]
    return holding
