"""What a process tree exposes, read from /proc: its listening TCP sockets (judged by the address
they are bound to), its command lines and environments, and files that hold secrets."""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


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


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def session_members(session: int) -> list[int]:
    """Every live process of the session ``session`` (a job started with start_new_session)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat_fields(int(entry.name))
            except (OSError, IndexError):
                continue
            if int(fields[3]) == session and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def _proc_text(pid: int, name: str, separator: bytes) -> str:
    try:
        raw = Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", separator).decode(errors="replace")


def command_line(pid: int) -> str:
    return _proc_text(pid, "cmdline", b" ")


def environment(pid: int) -> str:
    return _proc_text(pid, "environ", b"\n")


def _decode(hex_address: str) -> tuple[str, int]:
    address, port = hex_address.split(":")
    raw = bytes.fromhex(address)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    text = socket.inet_ntop(family, words)
    mapped = ipaddress.ip_address(text)
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped:
        text = str(mapped.ipv4_mapped)
    return text, int(port, 16)


def listeners(pids: Iterable[int]) -> list[Listener]:
    """The listening TCP sockets the processes ``pids`` hold, with their bound addresses."""
    found = []
    for pid in pids:
        try:
            inodes = {
                os.readlink(f"/proc/{pid}/fd/{fd}")[len("socket:[") : -1]
                for fd in os.listdir(f"/proc/{pid}/fd")
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
            }
        except OSError:
            continue
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if fields[3] == LISTEN and fields[9] in inodes:
                    address, port = _decode(fields[1])
                    found.append(Listener(pid, command_line(pid), address, port))
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
