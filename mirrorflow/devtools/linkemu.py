"""A userspace link emulator between two TUN devices: delay, jitter, random loss, rate, cuts.

What ``tc netem`` does, for kernels without it. :func:`main` (``python -m
mirrorflow.devtools.linkemu HOST_IF DC_IF``) makes two TUN devices (``IFF_TUN | IFF_NO_PI``:
raw IP packets, no link layer) and forwards every IPv4 packet read from one to the other, per
direction through the same emulated link:

- **cut**: every packet is dropped (and those in flight with it);
- **loss**: each packet is dropped with probability ``loss`` (a seeded RNG: a run is repeatable
  given the same packets);
- **rate**: packets leave one after another at ``rate`` bytes/s (serialisation, as a real link
  of that speed), behind a drop-tail queue of at most ``queue`` seconds;
- **delay** (+ **jitter**): each packet arrives ``delay`` seconds after it left, plus a uniform
  ``±jitter``; without jitter each direction stays in FIFO order, with jitter packets may be
  reordered (as netem does).

The devices are not persistent: they exist while the process holds them, so a forwarder that
dies (SIGKILL included) takes them with it. The process is driven through its standard input,
one JSON object a line (``{"cut": true}``, ``{"delay": 0.025, "loss": 0.01, "rate": 1250000}``,
``{"stats": true}``), and answers each with one JSON line; it exits when its standard input
closes (its owner, :class:`mirrorflow.devtools.datacenters.Datacenter`, is gone). It prints
``{"ready": true}`` once both devices exist; the owner then moves one into a namespace and
gives both their addresses.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import json
import os
import random
import selectors
import signal
import struct
import sys
import time
from collections import Counter

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65_536
BATCH = 64  # packets read from one device before the queues are served again


def open_tun(name: str) -> int:
    """A new, non-persistent TUN device ``name`` (raw IP packets); its non-blocking fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class Direction:
    """One way of the link: its queue of packets in flight, its rate's clock, its counters."""

    def __init__(self, name: str, out_fd: int) -> None:
        self.name = name
        self.out_fd = out_fd
        self.in_flight: list[tuple[float, int, bytes]] = []  # (due, sequence, packet)
        self.free_at = 0.0  # when the link has sent what it was given
        self.last_due = 0.0
        self.counts: Counter[str] = Counter()


class Link:
    """The emulated link's conditions and both directions' packets in flight."""

    def __init__(self, host_fd: int, dc_fd: int) -> None:
        self.directions = {
            host_fd: Direction("to_dc", dc_fd),
            dc_fd: Direction("to_host", host_fd),
        }
        self.rate: float | None = None  # bytes/s
        self.delay = 0.0
        self.jitter = 0.0
        self.loss = 0.0
        self.queue = 0.2  # seconds of backlog before drop-tail
        self.cut = False
        self.rng = random.Random(0)
        self._sequence = 0

    def configure(self, command: dict) -> dict:
        if "seed" in command:
            self.rng = random.Random(command["seed"])
        for key in ("rate", "delay", "jitter", "loss", "queue"):
            if key in command:
                setattr(self, key, command[key])
        if "cut" in command:
            self.cut = bool(command["cut"])
            if self.cut:  # what was on the wire is lost with the link
                for direction in self.directions.values():
                    direction.counts["cut"] += len(direction.in_flight)
                    direction.in_flight.clear()
        reply: dict = {"ok": True}
        if command.get("stats"):
            reply["stats"] = {d.name: dict(d.counts) for d in self.directions.values()}
            times = os.times()
            reply["cpu_seconds"] = round(times.user + times.system, 3)
        if command.get("reset"):
            for direction in self.directions.values():
                direction.counts.clear()
        return reply

    def arrive(self, fd: int, packet: bytes, now: float) -> None:
        """A packet read from ``fd``'s device: drop it or put it in flight."""
        direction = self.directions[fd]
        counts = direction.counts
        counts["packets"] += 1
        counts["bytes"] += len(packet)
        if not packet or packet[0] >> 4 != 4:
            counts["not_ipv4"] += 1
            return
        if self.cut:
            counts["cut"] += 1
            return
        if self.loss and self.rng.random() < self.loss:
            counts["lost"] += 1
            return
        leaves = now
        if self.rate:
            start = max(now, direction.free_at)
            if start - now > self.queue:
                counts["queue_full"] += 1
                return
            leaves = direction.free_at = start + len(packet) / self.rate
        due = leaves + self.delay
        if self.jitter:
            due = max(leaves, due + self.rng.uniform(-self.jitter, self.jitter))
        else:
            due = max(due, direction.last_due)  # FIFO, even after the delay was lowered
            direction.last_due = due
        self._sequence += 1
        heapq.heappush(direction.in_flight, (due, self._sequence, packet))

    def deliver(self, now: float) -> float | None:
        """Write every packet that is due; seconds until the next one (None: none in flight)."""
        wait = None
        for direction in self.directions.values():
            queue = direction.in_flight
            while queue and queue[0][0] <= now:
                packet = heapq.heappop(queue)[2]
                try:
                    os.write(direction.out_fd, packet)
                    direction.counts["delivered"] += 1
                except OSError as exc:  # the receiving side is full or gone: a loss
                    if exc.errno not in (errno.EAGAIN, errno.ENOBUFS, errno.EIO, errno.EINVAL):
                        raise
                    direction.counts["write_failed"] += 1
            if queue:
                next_in = queue[0][0] - now
                wait = next_in if wait is None else min(wait, next_in)
        return wait


def run(host_if: str, dc_if: str, control=None, out=None) -> None:
    """Make both devices, announce them, forward until ``control`` (stdin) closes."""
    control = control or sys.stdin.buffer
    out = out or sys.stdout
    host_fd, dc_fd = open_tun(host_if), open_tun(dc_if)
    link = Link(host_fd, dc_fd)
    selector = selectors.DefaultSelector()
    selector.register(host_fd, selectors.EVENT_READ)
    selector.register(dc_fd, selectors.EVENT_READ)
    control_fd = control.fileno()
    os.set_blocking(control_fd, False)
    selector.register(control_fd, selectors.EVENT_READ)
    print(json.dumps({"ready": True}), file=out, flush=True)
    pending = b""
    wait: float | None = None
    while True:
        for key, _ in selector.select(wait):
            fd = key.fd
            if fd == control_fd:
                try:
                    data = os.read(control_fd, 65_536)
                except BlockingIOError:
                    continue
                if not data:
                    return  # the owner is gone: the devices go with this process
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        reply = link.configure(json.loads(line))
                        print(json.dumps(reply), file=out, flush=True)
                continue
            now = time.monotonic()
            for _ in range(BATCH):
                try:
                    packet = os.read(fd, MAX_PACKET)
                except BlockingIOError:
                    break
                link.arrive(fd, packet, now)
        wait = link.deliver(time.monotonic())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m mirrorflow.devtools.linkemu HOST_IF DC_IF", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the owner, who closes us
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(OSError):  # the link keeps its timing on a busy machine (as root)
        os.nice(-10)
    try:
        run(*args)
    except OSError as exc:
        print(f"linkemu: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
