"""CPU and memory of a process tree, from Linux's /proc and rusage.

Three parts:

* **The reaping wrapper** (``python procstats.py exec --report R.json -- CMD ...``) makes itself a
  child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), runs ``CMD``, forwards SIGTERM/SIGINT to it
  and reaps *every* descendant, orphans included (a JVM's Python workers, a daemon the JVM
  forgot). When it exits, ``getrusage(RUSAGE_CHILDREN)`` of the wrapper is exactly the CPU time
  of the whole tree over its whole life: the kernel adds a process's CPU time to its parent's
  children totals when the parent reaps it, and nothing in the tree escapes being reaped by the
  wrapper or by a process the wrapper reaps. The wrapper's own CPU (a sleeping Python) is kept
  out of those totals. It writes them to ``R.json`` with microsecond resolution.

* **Sampling** (:class:`TreeSampler`), done by whoever started the wrapper: at each call it scans
  /proc, finds the wrapper's descendants and sums their CPU (ticks, ``utime+stime`` plus
  ``cutime+cstime`` of already reaped children) and resident memory. This gives a time line (CPU
  between two moments, e.g. while records were being copied) and the peak memory, which rusage
  cannot give (``ru_maxrss`` is the largest *single* process, not the sum).

* **Threads** (``python procstats.py threads --seconds 120 PID ...``): each thread's time on a CPU
  over a window, from ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds, not ticks: an idle
  thread's few microseconds a second count), summed by thread name with its digits as ``#``
  (``rdk:broker#``, ``kafka-producer-#``); mirrorflow's Python threads carry their task's name.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PR_SET_CHILD_SUBREAPER = 36


# --------------------------------------------------------------------------------------------
# /proc reading


@dataclass(frozen=True)
class Proc:
    """One process as seen in /proc/<pid>/stat (CPU in seconds, memory in bytes)."""

    pid: int
    ppid: int
    comm: str
    state: str
    cpu_s: float  # utime + stime of the process itself (all its threads)
    reaped_children_cpu_s: float  # cutime + cstime: children it has waited for
    start_ticks: int  # with pid, identifies the process across samples
    rss_bytes: int


def read_proc(pid: int) -> Proc | None:
    """The process ``pid``, or None if it is gone (or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    head, _, tail = raw.rpartition(")")
    comm = head.partition("(")[2]
    f = tail.split()
    # f[0] is field 3 of proc(5): state; f[n - 3] is field n.
    return Proc(
        pid=pid,
        ppid=int(f[1]),
        comm=comm,
        state=f[0],
        cpu_s=(int(f[11]) + int(f[12])) / CLK_TCK,
        reaped_children_cpu_s=(int(f[13]) + int(f[14])) / CLK_TCK,
        start_ticks=int(f[19]),
        rss_bytes=int(f[21]) * PAGE_SIZE,
    )


def all_processes() -> dict[int, Proc]:
    """Every process on the machine, by pid (one pass over /proc)."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            proc = read_proc(int(entry.name))
            if proc is not None:
                table[proc.pid] = proc
    return table


def descendants(root: int, table: dict[int, Proc]) -> list[Proc]:
    """The strict descendants of ``root`` in ``table`` (children, grandchildren, ...)."""
    children: dict[int, list[Proc]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child.pid)
    return found


def pss_bytes(pid: int) -> int | None:
    """Proportional set size (shared pages divided among their users), if readable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (utime+stime, all threads) used so far by one live process."""
    proc = read_proc(pid)
    return None if proc is None else proc.cpu_s


def machine_busy_cpu_seconds() -> float:
    """CPU seconds spent by the whole machine, all cores, outside idle and iowait."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()
    assert fields[0] == "cpu"
    # user nice system idle iowait irq softirq steal (guest is already inside user)
    values = [int(v) for v in fields[1:9]]
    busy = sum(values) - values[3] - values[4]
    return busy / CLK_TCK


# --------------------------------------------------------------------------------------------
# Sampling a tree from outside


@dataclass
class TreeSample:
    t: float  # time.monotonic()
    cpu_s: float  # cumulative CPU of the trees so far (monotonic over samples)
    rss_bytes: int  # resident memory summed over the live processes of the trees
    pss_bytes: int | None
    processes: int


@dataclass
class TreeSampler:
    """Samples the descendants of some root processes (e.g. reaping wrappers).

    The roots themselves are left out (their own CPU and memory), but the CPU of children they
    already reaped (their ``cutime+cstime``) is counted, so a child that exits between two
    samples is not lost. CPU is only counted while a root lives: the exact total of a tree is
    its wrapper's report.
    """

    roots: list[int]
    with_pss: bool = True
    pss_every: int = 8  # PSS costs ~10 ms per JVM: read it at every n-th sample only
    samples: list[TreeSample] = field(default_factory=list)
    peak_rss_bytes: int = 0
    peak_pss_bytes: int = 0
    peak_processes: int = 0
    commands: dict[str, int] = field(default_factory=dict)  # comm -> highest process count

    def sample(self) -> TreeSample:
        now = time.monotonic()
        table = all_processes()
        cpu = 0.0
        rss = 0
        pss: int | None = 0 if self.with_pss and not len(self.samples) % self.pss_every else None
        count = 0
        by_comm: dict[str, int] = {}
        for root in self.roots:
            root_proc = table.get(root)
            if root_proc is not None:
                cpu += root_proc.reaped_children_cpu_s
            for proc in descendants(root, table):
                count += 1
                cpu += proc.cpu_s + proc.reaped_children_cpu_s
                if proc.state == "Z":
                    continue
                rss += proc.rss_bytes
                by_comm[proc.comm] = by_comm.get(proc.comm, 0) + 1
                if pss is not None:
                    value = pss_bytes(proc.pid)
                    pss = None if value is None else pss + value
        if self.samples:  # a process seen just before it was reaped may make a dip
            cpu = max(cpu, self.samples[-1].cpu_s)
        sample = TreeSample(now, cpu, rss, pss, count)
        self.samples.append(sample)
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        self.peak_pss_bytes = max(self.peak_pss_bytes, pss or 0)
        self.peak_processes = max(self.peak_processes, count)
        for comm, n in by_comm.items():
            self.commands[comm] = max(self.commands.get(comm, 0), n)
        return sample


# --------------------------------------------------------------------------------------------
# The reaping wrapper


def wrapped(report: Path, command: Sequence[str], orphan_grace: float = 15.0) -> list[str]:
    """The command line that runs ``command`` under the reaping wrapper, reporting to ``report``."""
    wrapper = [sys.executable, str(Path(__file__).resolve()), "exec", "--report", str(report)]
    return [*wrapper, "--orphan-grace", str(orphan_grace), "--", *command]


@dataclass
class TreeUsage:
    """What the wrapper reports about the tree it ran (CPU in seconds)."""

    returncode: int
    user_s: float
    system_s: float
    max_single_rss_bytes: int
    orphans_reaped: int
    orphans_killed: int
    wrapper_self_s: float

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.system_s

    @classmethod
    def load(cls, path: Path) -> TreeUsage:
        return cls(**json.loads(path.read_text()))


def _set_child_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _own_children() -> list[int]:
    me = os.getpid()
    return [p.pid for p in all_processes().values() if p.ppid == me]


def run_wrapped(command: Sequence[str], report: Path, orphan_grace: float = 15.0) -> int:
    """Run ``command``, reap its whole tree, write a :class:`TreeUsage` to ``report``."""
    _set_child_subreaper()
    child = subprocess.Popen(list(command))

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)

    status: int | None = None
    orphans_reaped = 0
    # While the command runs, block in wait4: every orphan that exits is reaped on the way.
    while status is None:
        try:
            pid, raw, _ = os.wait4(-1, 0)
        except ChildProcessError:
            break
        if pid == child.pid:
            status = raw
            child.returncode = os.waitstatus_to_exitcode(raw)
        else:
            orphans_reaped += 1
    # The command is gone; give its orphans a grace period, then end them (they are ours).
    orphans_killed = 0
    deadline = time.monotonic() + orphan_grace
    escalation = [signal.SIGTERM, signal.SIGKILL]
    while True:
        try:
            pid, _, _ = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            orphans_reaped += 1
            continue
        if time.monotonic() > deadline and escalation:
            sig = escalation.pop(0)
            for pid in _own_children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                    orphans_killed += sig == signal.SIGKILL
            deadline = time.monotonic() + 5.0
        time.sleep(0.05)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = resource.getrusage(resource.RUSAGE_SELF)
    returncode = child.returncode if status is not None else -1
    usage = TreeUsage(
        returncode=returncode if returncode is not None else -1,
        user_s=children.ru_utime,
        system_s=children.ru_stime,
        max_single_rss_bytes=children.ru_maxrss * 1024,
        orphans_reaped=orphans_reaped,
        orphans_killed=orphans_killed,
        wrapper_self_s=me.ru_utime + me.ru_stime,
    )
    tmp = report.with_suffix(report.suffix + ".tmp")
    tmp.write_text(json.dumps(usage.__dict__, indent=2))
    tmp.replace(report)
    return usage.returncode


def thread_times(pids: Iterable[int]) -> dict[tuple[int, int], tuple[str, int]]:
    """(pid, tid) -> (thread name, nanoseconds on a CPU so far) of every thread of ``pids``."""
    times: dict[tuple[int, int], tuple[str, int]] = {}
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                task = f"/proc/{pid}/task/{tid}"
                with contextlib.suppress(OSError):
                    ran_ns = int(Path(f"{task}/schedstat").read_text().split()[0])
                    times[pid, int(tid)] = (Path(f"{task}/comm").read_text().strip(), ran_ns)
    return times


def thread_cores(pids: Sequence[int], seconds: float) -> list[tuple[int, str, int, float]]:
    """Cores each group of ``pids``' threads took over the next ``seconds``: (pid, name with
    digits as ``#``, threads, cores), busiest first."""
    before = thread_times(pids)
    time.sleep(seconds)
    groups: dict[tuple[int, str], list[float]] = {}
    for (pid, tid), (name, ran_ns) in thread_times(pids).items():
        ran = ran_ns - before.get((pid, tid), (name, 0))[1]
        group = groups.setdefault((pid, re.sub(r"[0-9]+", "#", name)), [0, 0.0])
        group[0] += 1
        group[1] += ran / 1e9 / seconds
    rows = [(pid, name, int(n), cores) for (pid, name), (n, cores) in groups.items()]
    return sorted(rows, key=lambda row: -row[3])


def _print_threads(pids: Sequence[int], seconds: float) -> None:
    rows = thread_cores(pids, seconds)
    for pid in pids:
        print(f"pid {pid}: {sum(r[3] for r in rows if r[0] == pid):.4f} cores")
    print("| pid | threads | count | cores |\n|---|---|---|---|")
    for pid, name, count, cores in rows:
        print(f"| {pid} | `{name}` | {count} | {cores:.4f} |")
    print(f"all: {sum(r[3] for r in rows):.4f} cores over {seconds:g} s")


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run a command, reap its whole process tree and report the tree's CPU time."
    )
    sub = parser.add_subparsers(dest="action", required=True)
    ex = sub.add_parser("exec", help="run CMD under the reaping wrapper")
    ex.add_argument("--report", type=Path, required=True, help="JSON file for the usage")
    ex.add_argument("--orphan-grace", type=float, default=15.0)
    ex.add_argument("command", nargs=argparse.REMAINDER)
    th = sub.add_parser("threads", help="each thread's CPU over a window, by thread name")
    th.add_argument("--seconds", type=float, default=120.0)
    th.add_argument("pids", type=int, nargs="+")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.action == "threads":
        _print_threads(args.pids, args.seconds)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("exec needs a command after --")
    return _exit_code(run_wrapped(command, args.report, args.orphan_grace))


if __name__ == "__main__":
    sys.exit(main())
