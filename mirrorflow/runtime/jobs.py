"""A mirror job as files and processes: where its state lives and how it is stopped.

Per flow ``S->T``, under the flows state directory (``$MIRRORFLOW_STATE/flows`` by default, the
job's own default)::

    S-T/progress.json the flow's progress (batches, records, its periodic tasks); the positions
                      themselves live in ``mm2-offsets.<source>.internal`` on the target
    S-T/restart       a restart request: the flow starts over at the requested position (a
                      running application restarts the flow after its batch)
    S-T/paused        the flow is paused (its DAG is): it does not run while the file exists
    S-T/hold          a failover stopped the flow: it stays paused, its DAG unpaused or not,
                      until the hold is released (failback)
    S-T/lease         the flow's lease: the running job that holds it (an exclusive ``flock``
                      held by the job's driver for its lifetime) and its process id

Per job, in the directory of its stop file (``S-T`` for a job of one flow, ``to-T`` for a job
running every flow into ``T``, as the generated site DAGs run them)::

    stop              the stop file: once it exists the job finishes its batches, then exits
    job.json          the running job: its process id (the leader of its own process group)

The job runs in a process group of its own, so a signal meant for the Airflow task (SIGTERM
when a task is marked failed, then SIGKILL 5 seconds later) never cuts a batch short: the task
asks the job to stop through the stop file, and the job's guard (:mod:`mirrorflow.runtime.guard`)
enforces the grace period even if the task itself is killed, asking a copying job to stop
itself if its launcher dies without asking (a job not copying yet is ended at once). One flow
runs in one job at a time: each job's driver holds its flows' leases (:func:`hold_leases`)
while it runs, and a second job of a flow ends at start, naming the one that holds it. No
Airflow import here: ``mirrorflow demo down`` uses it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

from mirrorflow import paths
from mirrorflow.errors import MirrorflowError
from mirrorflow.runtime import launch
from mirrorflow.runtime.processes import alive as process_alive
from mirrorflow.runtime.processes import command_line, wait_for_exit

PID_FILE = "job.json"
PROGRESS_FILE = "progress.json"  # as the driver writes it
RESTART_FILE = "restart"  # as the driver reads it
PAUSED_FILE = "paused"  # as the application reads it
HOLD_FILE = "hold"  # a failover's hold: the flow stays paused whatever its DAG says
LEASE_FILE = "lease"  # held (flock) by the driver of the job running the flow
KILL_WAIT = 10.0  # seconds between SIGTERM and SIGKILL to a job that outlived its grace period

Log = Callable[[str], None]


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where mirror jobs keep their state unless told otherwise (as ``spark_jobs/mirror.py``),
    in this process's environment or ``environ`` (a job's own)."""
    return paths.state_dir(environ) / "flows"


def split_flow(flow: str) -> tuple[str, str]:
    source, arrow, target = flow.partition("->")
    if not arrow or not source or not target:
        raise MirrorflowError(f"{flow!r} is not a flow name", "write it as SOURCE->TARGET")
    return source, target


@dataclass(frozen=True)
class JobFiles:
    """The files through which a mirror job (one flow, or the flows of one application) is
    found, stopped and restarted.

    The job's own files (``job.json``, ``stop``) live in the directory of its stop file
    (:func:`mirrorflow.runtime.launch.stop_file_for`: ``S-T`` for one flow, ``to-T`` for the
    flows of a target site); each flow's progress and restart request in its ``S-T``.
    """

    state_dir: Path
    flows: tuple[str, ...]

    @classmethod
    def for_flow(cls, flow: str, state_dir: Path | str | None = None) -> JobFiles:
        return cls.for_flows([flow], state_dir)

    @classmethod
    def for_flows(cls, flows: Sequence[str], state_dir: Path | str | None = None) -> JobFiles:
        if not flows:
            raise MirrorflowError("no flow given", "name at least one flow, as SOURCE->TARGET")
        for flow in flows:
            split_flow(flow)
        base = Path(state_dir) if state_dir else default_state_dir()
        return cls(base.resolve(), tuple(dict.fromkeys(flows)))

    @property
    def flow(self) -> str:
        """The job's name in messages: its flow, or its flows."""
        return ", ".join(self.flows)

    @property
    def directory(self) -> Path:
        return self.stop_file.parent

    @property
    def stop_file(self) -> Path:
        return launch.stop_file_for(self.state_dir, self.flows)  # as `mirrorflow mirror` does

    @property
    def pid_file(self) -> Path:
        return self.directory / PID_FILE

    def flow_dir(self, flow: str) -> Path:
        """A flow's own directory (as the job's spec names it): progress, restart, pause."""
        source, target = split_flow(flow)
        return self.state_dir / f"{source}-{target}"

    def request_stop(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.stop_file.touch()

    def clear_stop_request(self) -> None:
        self.stop_file.unlink(missing_ok=True)

    def record(self, pid: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.pid_file.with_suffix(".partial")
        partial.write_text(json.dumps({"pid": pid, "flows": list(self.flows)}) + "\n")
        partial.replace(self.pid_file)

    def forget(self, pid: int) -> None:
        if self.recorded_pid() == pid:
            self.pid_file.unlink(missing_ok=True)

    def recorded_pid(self) -> int | None:
        try:
            return int(json.loads(self.pid_file.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def running_pid(self) -> int | None:
        """The recorded job's process id if that process is still this job."""
        pid = self.recorded_pid()
        return pid if pid is not None and self.is_job(pid) else None

    def is_job(self, pid: int) -> bool:
        """Whether ``pid`` is alive and is a mirror job started with this stop file."""
        return process_alive(pid) and str(self.stop_file) in command_line(pid)


def has_progress(flow_dir: Path) -> bool:
    """Whether the flow's job copied at least one batch with this state directory."""
    return (flow_dir / PROGRESS_FILE).exists()


def read_progress(flow_dir: Path) -> dict:
    """The flow's ``progress.json`` (empty when it has none yet)."""
    try:
        return json.loads((flow_dir / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def set_paused(flow_dir: Path, paused: bool) -> bool:
    """Pause or resume the flow (its ``paused`` file); True when that changed anything."""
    path = flow_dir / PAUSED_FILE
    if paused == path.exists():
        return False
    if paused:
        flow_dir.mkdir(parents=True, exist_ok=True)
        path.touch()
    else:
        path.unlink(missing_ok=True)
    return True


def hold(flow_dir: Path, reason: str) -> None:
    """Pause the flow and keep it paused (a failover's cut): the mirror DAG's watcher does not
    resume a held flow when its flow DAG is unpaused."""
    flow_dir.mkdir(parents=True, exist_ok=True)
    partial = flow_dir / f"{HOLD_FILE}.partial"
    partial.write_text(json.dumps({"reason": reason}) + "\n")
    partial.replace(flow_dir / HOLD_FILE)
    set_paused(flow_dir, True)


def held(flow_dir: Path) -> str | None:
    """Why the flow is held paused (None: it is not)."""
    try:
        return str(json.loads((flow_dir / HOLD_FILE).read_text()).get("reason") or "held")
    except OSError:
        return None
    except (ValueError, AttributeError):
        return "held"


def release(flow_dir: Path) -> bool:
    """Remove the flow's hold (it stays paused until its DAG or ``set_paused`` resumes it)."""
    path = flow_dir / HOLD_FILE
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def running_jobs(state_dir: Path, flow: str) -> list[int]:
    """The process ids of the running mirror jobs recorded under ``state_dir`` that run
    ``flow`` (a job of that flow alone, or of its site)."""
    pids = []
    for pid_file in sorted(state_dir.glob(f"*/{PID_FILE}")):
        try:
            flows = json.loads(pid_file.read_text()).get("flows") or []
            files = JobFiles.for_flows(flows, state_dir)
        except (OSError, ValueError, TypeError, AttributeError, MirrorflowError):
            continue
        pid = files.running_pid() if flow in files.flows else None
        if pid is not None:
            pids.append(pid)
    return pids


def mirror_processes(state_dir: Path, flow: str) -> list[int]:
    """The process ids of the mirror jobs' drivers on this machine that run ``flow`` with
    ``state_dir`` (however they were started: a DAG, ``mirrorflow mirror``, spark-submit), found
    by their command lines (``spark_jobs/mirror.py … --flow S->T [--state-dir DIR]``)."""
    wanted = Path(state_dir).resolve()
    found = []
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"] or []  # None: not readable
        if not argv or "java" in Path(argv[0]).name:  # spark-submit's JVM: its driver counts
            continue
        if not any(a.endswith(launch.MIRROR_JOB.name) for a in argv[1:3]):
            continue
        flows = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--flow"]
        states = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--state-dir"]
        state = Path(states[-1]) if states else default_state_dir(_environment(process))
        if flow in flows and state.resolve() == wanted and process_alive(process.pid):
            found.append(process.pid)
    return sorted(found)


def _environment(process: psutil.Process) -> dict[str, str] | None:
    """A process's environment; None when it cannot be read (it ended, or is another user's):
    then this process's is assumed, as before environments were read."""
    try:
        return process.environ()
    except psutil.Error:
        return None


def request_restart(flow_dir: Path, starting_offsets: str | None = None) -> None:
    """Ask the flow to start over at ``starting_offsets`` (earliest, latest or epoch ms; None:
    the job's own start position), its positions overwritten in the offsets topic. A running
    application restarts the flow after its batch; otherwise its next start does."""
    flow_dir.mkdir(parents=True, exist_ok=True)
    partial = flow_dir / f"{RESTART_FILE}.partial"
    partial.write_text(json.dumps({"starting_offsets": starting_offsets}) + "\n")
    partial.replace(flow_dir / RESTART_FILE)


def restart_request(flow_dir: Path) -> str | None:
    """The flow's pending restart request: None when there is none, else its start position
    ("" for the job's own; an empty request file, as 0.x wrote it, means that too)."""
    path = flow_dir / RESTART_FILE
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        position = json.loads(text).get("starting_offsets") if text else None
    except (ValueError, AttributeError):
        position = None
    return str(position or "")


def kill_job(files: JobFiles, pid: int, log: Log = print) -> None:
    """End the job's whole process group now: SIGTERM, then SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, KILL_WAIT), (signal.SIGKILL, KILL_WAIT)):
        if not files.is_job(pid):
            return
        log(f"sending {sig.name} to the mirror job of {files.flow} (process group {pid})")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        if wait_for_exit(pid, wait):
            return


def stop_job(files: JobFiles, pid: int, grace: float, log: Log = print) -> bool:
    """Ask the job to stop (stop file), wait up to ``grace`` seconds, then kill it.

    Returns True if the job stopped by itself, after finishing its batch.
    """
    files.request_stop()
    if wait_for_exit(pid, grace):
        return True
    log(f"the mirror job of {files.flow} did not stop within {grace:.0f}s")
    kill_job(files, pid, log)
    return False


class FlowBusy(MirrorflowError):
    """A flow's lease is held: another mirror job runs the flow."""


def _holder(path: Path) -> str:
    """Who holds a lease, as its file says: ``pid N since T``."""
    try:
        held = json.loads(path.read_text())
        return f"pid {int(held['pid'])}, since {held.get('since', '?')}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown"


def _busy(flow: str, path: Path) -> FlowBusy:
    holder = _holder(path)
    pid = holder.split(",")[0].removeprefix("pid ")
    stop = f"`kill {pid}` stops it after its batch" if pid.isdigit() else "stop it"
    return FlowBusy(
        f"flow {flow} is already running in another mirror job ({holder}; lease {path})",
        f"{stop}, or pause the DAG that runs it; one flow runs in one job at a time",
    )


def hold_leases(state_dir: Path, flows: Sequence[str], record: bool = True) -> list[int]:
    """Take the lease of each flow (``S-T/lease``: an exclusive ``flock``, released by the
    kernel when this process ends, however it ends) and, with ``record``, write this process's
    id in it; a flow whose lease another job holds raises :class:`FlowBusy` naming it. Returns
    the open file descriptors: the leases last as long as they stay open."""
    files = JobFiles.for_flows(flows, state_dir)
    held: list[int] = []
    try:
        for flow in files.flows:
            path = files.flow_dir(flow) / LEASE_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise _busy(flow, path) from None
            held.append(fd)
            if not record:
                continue
            since = datetime.now(UTC).isoformat(timespec="seconds")
            holder = json.dumps({"pid": os.getpid(), "flows": list(files.flows), "since": since})
            os.ftruncate(fd, 0)
            os.pwrite(fd, (holder + "\n").encode(), 0)
    except BaseException:
        release_leases(held)
        raise
    return held


def release_leases(held: Sequence[int]) -> None:
    """Give up leases taken by :func:`hold_leases`."""
    for fd in held:
        with contextlib.suppress(OSError):
            os.close(fd)


def check_leases(state_dir: Path, flows: Sequence[str], wait_s: float = 0.0) -> None:
    """Fail (:class:`FlowBusy`) if another job holds a lease of ``flows``, after waiting up to
    ``wait_s`` for it to go (a job that was just stopped: its driver ends after its JVM). What a
    launcher checks before it starts a job; the job's driver takes the leases itself."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            release_leases(hold_leases(state_dir, flows, record=False))
            return
        except FlowBusy:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def stop_all(state_dir: Path, grace: float, log: Log = print) -> list[str]:
    """Stop every running mirror job recorded under ``state_dir``; return their flows."""
    stopped: list[str] = []
    for pid_file in sorted(state_dir.glob(f"*/{PID_FILE}")):
        try:
            recorded = json.loads(pid_file.read_text())
            flows = recorded.get("flows") or [recorded["flow"]]  # 0.x recorded one flow
            files = JobFiles.for_flows(flows, state_dir)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, MirrorflowError):
            continue
        pid = files.running_pid()
        if pid is None:
            continue
        log(f"stopping the mirror job of {files.flow} (finishing its batch, at most {grace:.0f}s)")
        stop_job(files, pid, grace, log)
        files.forget(pid)
        stopped.extend(files.flows)
    return stopped
