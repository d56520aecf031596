"""``MirrorFlowOperator``: a flow's Spark mirror job as one long-running Airflow task.

At run time (never at parse time: no file is read when the DAG is parsed) it builds the one
``spark-submit`` command line every launcher uses (:func:`mirrorflow.runtime.launch.mirror_command`)
and runs it through :class:`~mirrorflow.airflow.hooks.MirrorJobHook`:

* **Spark connection** ``conn_id`` (default ``spark_default``, of the Spark provider's type
  ``spark``): ``local[*]``, or ``spark://host:7077`` for a standalone cluster. Without a
  ``spark_default`` connection the job runs on ``local[*]``. The driver always runs in client
  mode, beside the task: the stop file and the pid file are local files.
* **Only paths on the command line**: flow files (relative ones against the project root, which
  is also the job's working directory, so the flow files' ``${file:…}`` references resolve as
  they do for ``mirrorflow`` commands), the flow's name, the state directory, the stop file.
* **A clean stop**: the job runs in its own process group. ``on_kill`` (task marked failed,
  timeout) creates the stop file, waits ``stop_grace_period`` for the batch in progress to
  finish, and only then falls back to the provider's kill. Pausing the DAG while the job runs
  has the same effect, and the task then ends successfully.
* **Restarts without loss**: a job that dies fails the task; the DAG's retries start it again
  and it resumes from its positions (in the target's ``mm2-offsets.<source>.internal``). A job
  left over from an earlier try (its task killed) is stopped before a new one starts, so two
  never copy the same flow at once.
* **Params** of a manual run: ``starting_offsets`` (default/earliest/latest/timestamp) with
  ``starting_timestamp``, and ``restart`` (start over at the chosen position, the flow's
  positions overwritten).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from mirrorflow.airflow.hooks import DEFAULT_CONN_ID, MirrorJobHook
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import project_root
from mirrorflow.runtime import jobs, launch

STARTING_OFFSETS = ("default", "earliest", "latest", "timestamp")


class MirrorFlowOperator(BaseOperator):
    """Run the mirror job of ``flow`` (``"SOURCE->TARGET"``) defined by ``flow_files``.

    :param flow: the flow to run, e.g. ``"primary->secondary"``
    :param flow_files: its flow files (mm2.properties or YAML), merged in order
    :param state_dir: where the job keeps its local files: progress, stop and restart requests
        (default ``$MIRRORFLOW_STATE/flows``)
    :param stop_grace_period: how long a stop waits for the batch in progress to finish
    :param pause_check_interval: seconds between checks whether the DAG was paused
    :param conn_id: the Airflow connection naming the Spark master (default ``spark_default``)
    :param driver_memory: the Spark driver's memory
    :param conf: Spark settings added to (or overriding) the mirror job's own; no secret (it
        would be on the command line): a ``spark://`` master's secret comes from the properties
        file of ``$MIRRORFLOW_SPARK_PROPERTIES`` (see :mod:`mirrorflow.runtime.spark_security`)
    """

    ui_color = "#e0f0ff"

    def __init__(
        self,
        *,
        flow: str,
        flow_files: Sequence[str],
        state_dir: str | None = None,
        stop_grace_period: timedelta | float = timedelta(seconds=60),
        pause_check_interval: float = 10.0,
        conn_id: str = DEFAULT_CONN_ID,
        driver_memory: str = "1g",
        conf: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        jobs.split_flow(flow)
        if not flow_files:
            raise ValueError(f"flow {flow}: no flow files given")
        super().__init__(**kwargs)
        self.flow = flow
        self.flow_files = list(flow_files)
        self.state_dir = state_dir
        grace = stop_grace_period
        self.stop_grace_period = grace.total_seconds() if isinstance(grace, timedelta) else grace
        self.pause_check_interval = pause_check_interval
        self.conn_id, self.driver_memory, self.conf = conn_id, driver_memory, dict(conf or {})
        self._job_files: jobs.JobFiles | None = None
        self._hook: MirrorJobHook | None = None

    # -- running ---------------------------------------------------------------------------
    def execute(self, context: Any) -> None:
        files = jobs.JobFiles.for_flow(self.flow, self.state_dir)
        self._job_files = files
        flow_files = self._flow_file_paths()
        leftover = files.running_pid()
        if leftover is not None:
            self.log.warning(
                "a mirror job of %s from an earlier try is still running (pid %d): "
                "stopping it before starting a new one",
                self.flow,
                leftover,
            )
            jobs.stop_job(files, leftover, self.stop_grace_period, self.log.warning)
        files.clear_stop_request()
        first_try = getattr(context.get("ti"), "try_number", 1) <= 1
        starting_offsets = self._start_position(context.get("params") or {}, files, first_try)
        self._hook = hook = MirrorJobHook(self.conn_id)
        master = hook.master()
        try:
            command = launch.mirror_command(
                flow_files,
                self.flow,
                master=master,
                driver_memory=self.driver_memory,
                conf=self.conf,
                state_dir=files.state_dir,
                stop_file=files.stop_file,
                starting_offsets=starting_offsets,
            )
        except MirrorflowError as exc:  # e.g. a spark:// master without its secret
            raise AirflowException(f"the mirror job of {self.flow} cannot start: {exc}") from None
        self.log.info("running flow %s on Spark master %s", self.flow, master)
        watcher = _JobWatcher(self, hook, files, context)
        watcher.start()
        try:
            code = hook.submit(command, cwd=project_root(), env=launch.job_environment())
        finally:
            watcher.stop()
            if hook.process is not None:
                files.forget(hook.process.pid)
        if code != 0 and not (watcher.paused or files.stop_file.exists()):
            reason = hook.error_line or f"exit code {code}; see the log above"
            raise AirflowException(f"the mirror job of {self.flow} failed: {reason}")
        if watcher.paused:
            self.log.info("the DAG was paused: the mirror job of %s has stopped", self.flow)
        elif files.stop_file.exists():
            self.log.info("the mirror job of %s stopped on request (stop file)", self.flow)

    def _flow_file_paths(self) -> list[Path]:
        root = project_root()
        resolved = [p if p.is_absolute() else root / p for p in map(Path, self.flow_files)]
        missing = [str(p) for p in resolved if not p.is_file()]
        if missing:
            raise AirflowException(
                f"flow {self.flow}: flow file(s) not found: {', '.join(missing)} "
                f"(relative paths are read from {root})"
            )
        return resolved

    def _start_position(
        self, params: dict[str, Any], files: jobs.JobFiles, first_try: bool = True
    ) -> str | None:
        """``--starting-offsets`` from the run's Params; on restart, the first try asks the job
        to start over there (a retry resumes from what the first try copied)."""
        choice = params.get("starting_offsets") or "default"
        if choice not in STARTING_OFFSETS:
            raise AirflowException(f"starting_offsets must be one of {', '.join(STARTING_OFFSETS)}")
        position = None
        if choice == "timestamp":
            stamp = params.get("starting_timestamp")
            if not stamp:
                raise AirflowException("starting_offsets 'timestamp' needs starting_timestamp")
            when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
            if when.tzinfo is None:
                raise AirflowException("starting_timestamp needs a time zone, e.g. ...Z")
            position = str(int(when.timestamp() * 1000))
        elif choice != "default":
            position = choice
        if params.get("restart") and first_try:
            files.request_restart()
            self.log.warning(
                "restart: %s starts over from %s, its positions overwritten",
                self.flow,
                choice,
            )
        elif params.get("restart"):
            self.log.info("restart was done by this run's first try: resuming from its progress")
        elif position is not None and files.has_progress():
            self.log.warning(
                "flow %s resumes from its progress; starting_offsets=%s applies only to a flow "
                "without progress, or with restart",
                self.flow,
                choice,
            )
        return position

    # -- stopping --------------------------------------------------------------------------
    def on_kill(self) -> None:
        files, hook = self._job_files, self._hook
        process = hook.process if hook is not None else None
        if files is None or process is None or process.poll() is not None:
            return
        self.log.info(
            "stopping the mirror job of %s: finishing its batch (at most %.0fs)",
            self.flow,
            self.stop_grace_period,
        )
        files.request_stop()
        # If this task is killed before the grace period ends, the reaper still ends the job.
        jobs.spawn_reaper(files, process.pid, self.stop_grace_period)
        if jobs.wait_for_exit(process.pid, self.stop_grace_period):
            self.log.info("the mirror job of %s stopped cleanly", self.flow)
        jobs.kill_job(files, process.pid, self.log.warning)


class _JobWatcher:
    """While the job runs: records its process id, and stops it if the DAG gets paused."""

    def __init__(self, operator: MirrorFlowOperator, hook, files: jobs.JobFiles, context) -> None:
        self.operator, self.hook, self.files = operator, hook, files
        self.ti = context.get("ti")
        self.dag_id = getattr(self.ti, "dag_id", None)
        self.paused = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mirrorflow-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5)

    def _run(self) -> None:
        recorded = None
        seen_unpaused = False
        next_check = 0.0
        clock = threading.Event()
        while not self._done.is_set():
            process = self.hook.process
            if process is not None and recorded != process.pid:
                recorded = process.pid
                self.files.record(process.pid)
            now = time.monotonic()
            if now >= next_check and self.dag_id is not None:
                next_check = now + self.operator.pause_check_interval
                paused = self._dag_paused()
                if paused is None:
                    self.dag_id = None  # this Airflow cannot tell: stop asking
                elif not paused:
                    seen_unpaused = True
                elif seen_unpaused and not self.paused:
                    # Paused while running (a run of a DAG that was already paused, as with
                    # dag.test(), is the user's explicit choice and keeps going).
                    self.paused = True
                    self.operator.log.info(
                        "the DAG %s was paused: stopping the mirror job after its batch",
                        self.dag_id,
                    )
                    self.files.request_stop()
            clock.wait(0.5)

    def _dag_paused(self) -> bool | None:
        try:
            return bool(self.ti.get_dag(self.dag_id).is_paused)
        except Exception as exc:
            self.operator.log.info("cannot watch whether the DAG is paused: %s", exc)
            return None
