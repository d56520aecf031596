"""The emulated link between datacenters, measured through real namespaces: round-trip time,
jitter, random loss, rate, cuts (``mirrorflow/devtools/linkemu.py`` behind
``mirrorflow/devtools/datacenters.py``). An echo server runs inside the datacenter's namespace;
probes go from here over the link. Bounds are statistical (several standard deviations) but
fail for a link that does not delay, drops at the wrong rate or does not limit its rate.
Needs root and ``/dev/net/tun`` (skipped otherwise); see docs/development.md, *Faults and soak*.
"""

from __future__ import annotations

import math
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mirrorflow.devtools import datacenters
from mirrorflow.errors import MirrorflowError

_WHY = datacenters.unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"fault harness unavailable: {_WHY}")

PORT = 7007
SO_RCVBUFFORCE = 33  # Linux's: a receive buffer over net.core.rmem_max (root); not in socket
# Inside the namespace: UDP echo, and a TCP sink that answers with the byte count it read.
ECHO = f"""
import socket, sys, threading
address = sys.argv[1]
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# A buffer for a few seconds of probes: on a busy machine this thread may wait that long for a
# core, and datagrams the kernel drops here would count as the link's loss (root: FORCE).
udp.setsockopt(socket.SOL_SOCKET, {SO_RCVBUFFORCE}, 1 << 23)
udp.bind((address, {PORT}))
def echo():
    while True:
        data, peer = udp.recvfrom(65536)
        udp.sendto(data, peer)
threading.Thread(target=echo, daemon=True).start()
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind((address, {PORT}))
tcp.listen(8)
print("ready", flush=True)
while True:
    conn, _ = tcp.accept()
    total = 0
    while True:
        data = conn.recv(1 << 16)
        if not data or data.endswith(b"!"):
            total += len(data)
            break
        total += len(data)
    conn.sendall(str(total).encode())
    conn.close()
"""


@pytest.fixture(scope="module")
def dc(tmp_path_factory: pytest.TempPathFactory):
    with datacenters.datacenters(1, tmp_path_factory.mktemp("link")) as (made,):
        server = subprocess.Popen(
            ["ip", "netns", "exec", made.name, sys.executable, "-c", ECHO, made.address],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            yield made
        finally:
            server.kill()
            server.wait()


def udp_probes(dc: datacenters.Datacenter, count: int, gap: float = 0.0) -> list[float | None]:
    """Send ``count`` numbered datagrams one at a time; each one's round trip (None: lost)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 23)  # as the echo's
    sock.connect((dc.address, PORT))
    rtts: list[float | None] = [None] * count
    sent: dict[int, float] = {}
    try:
        sock.settimeout(0.0)
        for i in range(count):
            sent[i] = time.monotonic()
            sock.send(b"%08d" % i)
            deadline = time.monotonic() + max(gap, 0.0)
            while True:  # collect answers until this probe's slot ends
                try:
                    data = sock.recv(64)
                    rtts[int(data)] = time.monotonic() - sent[int(data)]
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.0005)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # stragglers: until none came for a second
            try:
                data = sock.recv(64)
                rtts[int(data)] = time.monotonic() - sent[int(data)]
                end = time.monotonic() + 1.0
            except BlockingIOError:
                time.sleep(0.002)
    finally:
        sock.close()
    return rtts


def tcp_send(dc: datacenters.Datacenter, size: int) -> tuple[float, float]:
    """Seconds to connect, and seconds to send ``size`` bytes and hear that all arrived."""
    began = time.monotonic()
    sock = socket.create_connection((dc.address, PORT), timeout=60)
    connected = time.monotonic() - began
    try:
        began = time.monotonic()
        sock.sendall(b"x" * (size - 1) + b"!")
        assert int(sock.recv(64)) == size
        return connected, time.monotonic() - began
    finally:
        sock.close()


def test_delay_gives_the_round_trip_asked_for_and_order_is_kept(dc) -> None:
    dc.shape(rate=None, delay_ms=25)  # 50 ms round trip
    rtts = [r for r in udp_probes(dc, 40, gap=0.06) if r is not None]
    assert len(rtts) == 40
    ms = sorted(r * 1000 for r in rtts)
    print(f"UDP RTT ms: min {ms[0]:.1f} median {statistics.median(ms):.1f} max {ms[-1]:.1f}")
    assert ms[0] >= 49.5, ms[:5]  # never earlier than the delay
    # Later only by the emulator's scheduling: at most half the delay again, which tells the
    # round trip asked for from one delayed one way only (25 ms) or twice each way (100 ms).
    # (Under 56 ms failed a suite run on 2 loaded cores: median 59.8 ms, every probe >= 50.8.)
    assert statistics.median(ms) < 75, ms
    connects = sorted(tcp_send(dc, 10)[0] * 1000 for _ in range(5))  # SYN, SYN-ACK: one RTT
    print(f"TCP connect ms: {[round(c, 1) for c in connects]}")
    assert 49.5 <= connects[2] < 75, connects
    # a burst of back-to-back datagrams comes back in the order sent (FIFO without jitter)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 23)  # as the echo's
    sock.connect((dc.address, PORT))
    sock.settimeout(2)
    for i in range(200):
        sock.send(b"%08d" % i)
    order = [int(sock.recv(64)) for _ in range(200)]
    sock.close()
    assert order == list(range(200))


def test_jitter_spreads_the_round_trips(dc) -> None:
    dc.shape(rate=None, delay_ms=25, jitter_ms=10)
    ms = sorted(r * 1000 for r in udp_probes(dc, 100, gap=0.08) if r is not None)
    assert len(ms) == 100
    quartiles = statistics.quantiles(ms, n=4)
    print(f"RTT ms with ±10 ms jitter each way: min {ms[0]:.1f} quartiles {quartiles}")
    # Each way uniform in 15..35 ms: the sum spans 30..70 ms (triangular), its quartiles are
    # 44.1 and 55.9 ms, and half of it lies below 50 ms, where no round trip without jitter
    # ends. A busy machine only adds to a round trip (the probe and the echo wait for a core):
    # the bounds below it are exact, and those above it loose (a loaded run: min 38.1 ms,
    # quartiles 47.7 and 57.6, 2% under 40 ms; 10% under 50 ms holds up to ~9 ms added).
    assert ms[0] >= 29.5, ms[:5]
    below_50 = sum(m < 50 for m in ms) / len(ms)
    assert below_50 >= 0.10, (below_50, quartiles)
    assert quartiles[0] > 40 and quartiles[2] > 52, quartiles
    assert quartiles[2] - quartiles[0] > 6, quartiles


def test_loss_drops_the_share_of_packets_asked_for(dc) -> None:
    loss, count = 0.01, 4000
    dc.shape(rate=None, delay_ms=1, loss=loss, seed=7)
    dc.link_stats(reset=True)
    answered = sum(r is not None for r in udp_probes(dc, count, gap=0.0005))
    stats = dc.link_stats()
    # each probe crosses twice: P(answer) = (1 - loss)^2
    p = (1 - loss) ** 2
    sigma = math.sqrt(count * p * (1 - p))
    lost_round_trips = count - answered
    print(
        f"loss {loss:.0%}: {lost_round_trips} of {count} round trips lost "
        f"(expected {count * (1 - p):.0f} ± {sigma:.0f}); forwarder: {stats}"
    )
    assert abs(answered - count * p) < 4.5 * sigma
    sent = stats["to_dc"]["packets"] + stats["to_host"]["packets"]
    dropped = stats["to_dc"].get("lost", 0) + stats["to_host"].get("lost", 0)
    assert sent >= count + answered - 5
    assert abs(dropped - sent * loss) < 4.5 * math.sqrt(sent * loss * (1 - loss)), (dropped, sent)


def test_the_rate_is_held_and_the_forwarder_keeps_up(dc) -> None:
    dc.shape(rate="10mbit", delay_ms=1)
    size = 4_000_000
    tcp_send(dc, 1000)  # warm up
    before = dc.link_stats(reset=True)["cpu_seconds"]
    _, seconds = tcp_send(dc, size)
    stats = dc.link_stats()
    mbit = size * 8 / seconds / 1e6
    cpu = stats["cpu_seconds"] - before
    wire = stats["to_dc"]["bytes"] * 8 / seconds / 1e6
    print(
        f"10mbit link: {mbit:.2f} Mbit/s of payload ({wire:.2f} on the wire), "
        f"forwarder CPU {cpu:.2f}s for {seconds:.1f}s ({cpu / seconds:.0%})"
    )
    assert 8.5 < mbit <= 10.05, mbit
    assert cpu / seconds < 0.5, cpu


def test_a_cut_link_passes_nothing_until_healed(dc) -> None:
    dc.shape(rate=None, delay_ms=5)
    with dc.link_cut():
        assert udp_probes(dc, 20, gap=0.01) == [None] * 20
        with pytest.raises(OSError):
            socket.create_connection((dc.address, PORT), timeout=1.5)
    assert all(r is not None for r in udp_probes(dc, 20, gap=0.02))
    assert dc.cuts == 1


def test_bad_conditions_are_one_clear_line(dc, tmp_path: Path) -> None:
    with pytest.raises(MirrorflowError, match="10 mbps"):
        dc.shape(rate="10 mbps/s")
    with pytest.raises(MirrorflowError, match=r"loss 1\.5 is not a probability"):
        dc.shape(loss=1.5)
    assert datacenters.parse_rate("10mbit") == 1_250_000
    assert datacenters.parse_rate("512kbit") == 64_000
    assert datacenters.parse_rate("2mbps") == 2_000_000


def test_a_killed_forwarder_takes_its_devices_and_nothing_is_left(tmp_path: Path) -> None:
    with datacenters.datacenters(2, tmp_path) as made:
        victim = made[1]
        assert victim.forwarder is not None
        assert subprocess.run(["ip", "link", "show", victim.host_if]).returncode == 0
        victim.forwarder.kill()  # SIGKILL: its non-persistent devices go with it
        victim.forwarder.wait(10)
        time.sleep(0.2)
        gone = subprocess.run(["ip", "link", "show", victim.host_if], capture_output=True)
        assert gone.returncode != 0
        with pytest.raises(MirrorflowError, match="forwarder died"):
            victim.cut()
        # no route out: the datacenter's address is blackholed here, not sent anywhere else
        route = subprocess.run(
            ["ip", "route", "get", victim.address], capture_output=True, text=True
        )
        assert route.returncode != 0 or "blackhole" in route.stdout, route.stdout
        names = [dc.name for dc in made]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(dc.host_if in links for dc in made)
    assert not any(name in namespaces for name in names)
