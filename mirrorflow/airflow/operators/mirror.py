"""The operator of a site's mirror DAG: its Spark mirror job, one long-running task.

``MirrorFlowOperator`` runs one mirror job, an application of every flow it is given (the site
DAG ``mirror__<target>`` gives it every enabled flow into ``<target>``, ``mirror__<application>``
the flows of one ``mirror.application``), as one long-running task.
At run time (never at parse time: no file is read when the DAG is parsed) it builds the one
``spark-submit`` command line every launcher uses (:func:`mirrorflow.runtime.launch.mirror_command`)
and runs it through :class:`~mirrorflow.airflow.hooks.MirrorJobHook`:

* **Spark connection** ``conn_id`` (default ``spark_default``, of the Spark provider's type
  ``spark``): ``local[*]``, or ``spark://host:7077`` for a standalone cluster. Without a
  ``spark_default`` connection the job runs on ``local[*]``. The driver always runs in client
  mode, beside the task: the stop file and the pid file are local files.
* **Only paths on the command line**: flow files (relative ones against the project root, which
  is also the job's working directory, so the flow files' ``${file:…}`` references resolve as
  they do for ``mirrorflow`` commands), the flows' names, the state directory, the stop file.
* **Airflow connections as secrets**: ``${airflow:CONN_ID:FIELD}`` references in the flow
  files are resolved by the task itself, through Airflow's connection lookup, and handed to the
  job in a private file it deletes at start (:mod:`mirrorflow.airflow.connections`); the job's
  environment holds no ``AIRFLOW_CONN_*`` variable.
* **A clean stop**: the job runs in its own process group. ``on_kill`` (task marked failed,
  timeout) creates the stop file, waits ``stop_grace_period`` for the batches in progress to
  finish, and only then falls back to a kill. Pausing the DAG while the job runs has the same
  effect, and the task then ends successfully.
* **One flow paused, the others going on**: each flow has a DAG of its own (``flow_dags``,
  ``flow__<source>__<target>``); while that DAG is paused the flow is paused inside the
  running application (its ``S-T/paused`` file), and unpausing it resumes the flow.
* **Restarts without loss**: a job that dies fails the task; the DAG's retries start it again
  and it resumes from its positions (in the target's ``mm2-offsets.<source>.internal``). A job
  left over from an earlier try (its task killed while the job finished its batch) is stopped
  before a new one starts; a flow that another job runs (its lease, ``S-T/lease``, is held: a
  ``mirrorflow mirror`` of it, say) fails the task in one line naming that job, so two never
  copy the same flow at once.
* **No orphans**: the job runs under :mod:`mirrorflow.runtime.guard`, which ends it when the
  task's process dies, however it dies: at once if the job was not copying yet, else after
  asking it to stop and waiting up to the grace period for its batch.
* **Bounded retries**: a cluster that does not answer is retried for ``retry_timeout``
  (default 10 minutes), then the job fails the task, naming the cluster: the DAG's retries
  and alerts take over.
* **Alerts**: every ``pause_check_interval`` the task also derives each flow's health; a flow
  that turns STALLED, LAGGING or FAILED is logged at ERROR and given to ``on_alert``, and a
  STALLED one fails the task (``fail_on_stall``) after stopping the job, so Airflow's failure
  callbacks and retries apply (:mod:`mirrorflow.airflow.alerts`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from mirrorflow.airflow.alerts import HealthAlerts, OnAlert
from mirrorflow.airflow.hooks import DEFAULT_CONN_ID, MirrorJobHook
from mirrorflow.airflow.operators.flow_files import flow_file_paths
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import project_root
from mirrorflow.runtime import guard, jobs, launch


class MirrorFlowOperator(BaseOperator):
    """Run the mirror job of ``flows`` (``"SOURCE->TARGET"`` each) defined by ``flow_files``,
    all of them in one Spark application.

    :param flows: the flows to run, e.g. ``["primary->secondary", "tertiary->secondary"]``
    :param flow: one flow (instead of ``flows``)
    :param flow_files: their flow files (mm2.properties or YAML), merged in order
    :param flow_dags: per flow, the DAG whose pause pauses that flow (``flow__S__T``)
    :param state_dir: where the job keeps its local files: progress, stop, pause and restart
        requests (default ``$MIRRORFLOW_STATE/flows``)
    :param stop_grace_period: how long a stop waits for the batches in progress to finish
    :param pause_check_interval: seconds between checks whether the DAGs were paused
    :param conn_id: the Airflow connection naming the Spark master (default ``spark_default``)
    :param driver_memory: the Spark driver's memory
    :param metrics_port: the job serves Prometheus metrics on 127.0.0.1 at this port (0: off;
        None: as ``$MIRRORFLOW_METRICS_PORT`` of the task's environment says)
    :param retry_timeout: how long a flow retries a cluster that does not answer before it
        fails the job (and the task); None: the job's default (10 minutes), -1: forever
    :param conf: Spark settings added to (or overriding) the mirror job's own; no secret (it
        would be on the command line): a ``spark://`` master's secret comes from the properties
        file of ``$MIRRORFLOW_SPARK_PROPERTIES`` (see :mod:`mirrorflow.runtime.spark_security`)
    :param on_alert: called as ``on_alert(context, alert)`` when a flow turns STALLED, LAGGING
        or FAILED, or RUNNING again (``alert``: flow, state, previous, reason, lag_records,
        lag_seconds, dag_id, at, recovered); see :mod:`mirrorflow.airflow.alerts`
    :param fail_on_stall: a STALLED flow stops the job and fails the task (so its failure
        callbacks and retries apply)
    """

    ui_color = "#e0f0ff"

    def __init__(
        self,
        *,
        flow_files: Sequence[str],
        flows: Sequence[str] | None = None,
        flow: str | None = None,
        flow_dags: dict[str, str] | None = None,
        state_dir: str | None = None,
        stop_grace_period: timedelta | float = timedelta(seconds=60),
        pause_check_interval: float = 10.0,
        conn_id: str = DEFAULT_CONN_ID,
        driver_memory: str = "1g",
        conf: dict[str, str] | None = None,
        metrics_port: int | None = None,
        retry_timeout: timedelta | float | None = None,
        on_alert: OnAlert | None = None,
        fail_on_stall: bool = True,
        **kwargs: Any,
    ) -> None:
        names = list(flows or ()) + ([flow] if flow else [])
        if not names:
            raise ValueError("no flow given: pass flows=[...] (or flow=...)")
        for name in names:
            jobs.split_flow(name)
        if not flow_files:
            raise ValueError(f"flows {', '.join(names)}: no flow files given")
        unknown = sorted(set(flow_dags or {}) - set(names))
        if unknown:
            raise ValueError(f"flow_dags names flows this job does not run: {unknown}")
        super().__init__(**kwargs)
        self.flows = list(dict.fromkeys(names))
        self.flow_files = list(flow_files)
        self.flow_dags = dict(flow_dags or {})
        self.state_dir = state_dir
        grace = stop_grace_period
        self.stop_grace_period = grace.total_seconds() if isinstance(grace, timedelta) else grace
        self.pause_check_interval = pause_check_interval
        self.conn_id, self.driver_memory, self.conf = conn_id, driver_memory, dict(conf or {})
        self.metrics_port = metrics_port
        timeout = retry_timeout
        self.retry_timeout = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        self.on_alert, self.fail_on_stall = on_alert, fail_on_stall
        self._job_files: jobs.JobFiles | None = None
        self._hook: MirrorJobHook | None = None

    @property
    def label(self) -> str:
        return ", ".join(self.flows)

    # -- running ---------------------------------------------------------------------------
    def execute(self, context: Any) -> None:
        files = jobs.JobFiles.for_flows(self.flows, self.state_dir)
        self._job_files = files
        flow_files = self._flow_file_paths()
        leftover = files.running_pid()
        if leftover is not None:
            self.log.warning(
                "a mirror job of %s from an earlier try is still running (pid %d): "
                "stopping it before starting a new one",
                self.label,
                leftover,
            )
            jobs.stop_job(files, leftover, self.stop_grace_period, self.log.warning)
        try:
            jobs.check_leases(files.state_dir, self.flows, wait_s=5.0 if leftover else 0.0)
        except MirrorflowError as exc:  # another job (e.g. `mirrorflow mirror`) runs a flow
            raise AirflowException(f"the mirror job of {self.label} cannot start: {exc}") from None
        files.clear_stop_request()
        self._hook = hook = MirrorJobHook(self.conn_id)
        master = hook.master()
        try:
            command = launch.mirror_command(
                flow_files,
                self.flows,
                master=master,
                driver_memory=self.driver_memory,
                conf=self.conf,
                state_dir=files.state_dir,
                stop_file=files.stop_file,
                metrics_port=self.metrics_port,
                retry_timeout=self.retry_timeout,
            )
        except MirrorflowError as exc:  # e.g. a spark:// master without its secret
            raise AirflowException(f"the mirror job of {self.label} cannot start: {exc}") from None
        watcher = _JobWatcher(self, hook, files, context)
        watcher.alerts = HealthAlerts(
            self.flows,
            flow_files,
            files.state_dir,
            log=self.log,
            on_alert=self.on_alert,
            context=context,
            dag_id=watcher.dag_id,
        )
        watcher.sync_flow_pauses()  # a flow whose DAG is paused does not start at all
        try:  # ${airflow:…} references: resolved here, by the task's own connection lookup
            handoff = launch.handed_over(flow_files, self.flows)
        except MirrorflowError as exc:  # e.g. no such connection
            raise AirflowException(f"the mirror job of {self.label} cannot start: {exc}") from None
        self.log.info("running %s on Spark master %s", self.label, master)
        watcher.start()
        try:
            code = hook.submit(
                guard.guarded(command, files.stop_file, self.stop_grace_period),
                cwd=project_root(),
                env={**launch.job_environment(), **handoff},
            )
        finally:
            launch.discard(handoff)
            watcher.stop()
            if hook.process is not None:
                files.forget(hook.process.pid)
        if watcher.stalled is not None:
            raise AirflowException(
                f"the mirror job of {self.label} stalled, so it was stopped: flow "
                f"{watcher.stalled['flow']}: {watcher.stalled['reason']}"
            )
        if code != 0 and not (watcher.paused or files.stop_file.exists()):
            reason = hook.error_line or f"exit code {code}; see the log above"
            raise AirflowException(f"the mirror job of {self.label} failed: {reason}")
        if watcher.paused:
            self.log.info("the DAG was paused: the mirror job of %s has stopped", self.label)
        elif files.stop_file.exists():
            self.log.info("the mirror job of %s stopped on request (stop file)", self.label)

    def _flow_file_paths(self) -> list[Path]:
        return flow_file_paths(self.flow_files, self.label)

    # -- stopping --------------------------------------------------------------------------
    def on_kill(self) -> None:
        files, hook = self._job_files, self._hook
        process = hook.process if hook is not None else None
        if files is None or process is None or process.poll() is not None:
            return
        self.log.info(
            "stopping the mirror job of %s: finishing its batches (at most %.0fs)",
            self.label,
            self.stop_grace_period,
        )
        # If this task is killed before the grace period ends (Airflow sends SIGKILL 5 s after
        # SIGTERM), the job's guard still ends the job when the grace period is over.
        files.request_stop()
        if jobs.wait_for_exit(process.pid, self.stop_grace_period):
            self.log.info("the mirror job of %s stopped cleanly", self.label)
        jobs.kill_job(files, process.pid, self.log.warning)


class _JobWatcher:
    """While the job runs: records its process id, stops it if its DAG gets paused, and pauses
    or resumes each flow as its own DAG is paused or unpaused."""

    def __init__(self, operator: MirrorFlowOperator, hook, files: jobs.JobFiles, context) -> None:
        self.operator, self.hook, self.files = operator, hook, files
        self.ti = context.get("ti")
        self.dag_id = getattr(self.ti, "dag_id", None)
        self.flow_dags = dict(operator.flow_dags) if self.ti is not None else {}
        self.paused = False
        self.alerts: HealthAlerts | None = None
        self.stalled: dict[str, Any] | None = None  # the alert that stopped the job
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mirrorflow-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5)

    def sync_flow_pauses(self) -> None:
        """Pause each flow whose DAG is paused, resume each whose DAG is not."""
        for flow, dag_id in list(self.flow_dags.items()):
            if jobs.held(self.files.flow_dir(flow)) is not None:
                jobs.set_paused(self.files.flow_dir(flow), True)  # a failover's cut: kept
                continue
            paused = self._dag_paused(dag_id)
            if paused is None:
                del self.flow_dags[flow]  # this Airflow cannot tell: the flow runs
                jobs.set_paused(self.files.flow_dir(flow), False)
            elif jobs.set_paused(self.files.flow_dir(flow), paused):
                self.operator.log.info(
                    "flow %s %s (its DAG %s is %s)",
                    flow,
                    "paused: it ends after its batch" if paused else "resumed",
                    dag_id,
                    "paused" if paused else "unpaused",
                )

    def _run(self) -> None:
        recorded = None
        seen_unpaused = False
        next_check = time.monotonic() + self.operator.pause_check_interval
        clock = threading.Event()
        while not self._done.is_set():
            process = self.hook.process
            if process is not None and recorded != process.pid:
                recorded = process.pid
                self.files.record(process.pid)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + self.operator.pause_check_interval
                self.sync_flow_pauses()
                paused = self._dag_paused(self.dag_id) if self.dag_id is not None else None
                if paused is None:
                    self.dag_id = None  # this Airflow cannot tell: stop asking
                elif not paused:
                    seen_unpaused = True
                elif seen_unpaused and not self.paused:
                    # Paused while running (a run of a DAG that was already paused, as with
                    # dag.test(), is the user's explicit choice and keeps going).
                    self.paused = True
                    self.operator.log.info(
                        "the DAG %s was paused: stopping the mirror job after its batches",
                        self.dag_id,
                    )
                    self.files.request_stop()
                self._check_health()
            clock.wait(0.5)

    def _check_health(self) -> None:
        stalled = self.alerts.check() if self.alerts is not None else None
        if stalled is None or not self.operator.fail_on_stall or self.stalled is not None:
            return
        self.stalled = stalled
        self.operator.log.error(
            "stopping the mirror job of %s: flow %s is STALLED",
            self.operator.label,
            stalled["flow"],
        )
        pid = self.files.running_pid()
        if pid is not None:
            jobs.kill_job(self.files, pid, self.operator.log.warning)

    def _dag_paused(self, dag_id: str) -> bool | None:
        try:
            return bool(self.ti.get_dag(dag_id).is_paused)
        except Exception as exc:
            self.operator.log.info("cannot watch whether the DAG %s is paused: %s", dag_id, exc)
            return None
