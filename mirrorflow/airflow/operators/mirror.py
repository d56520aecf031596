"""Operators of the generated DAGs: a site's Spark mirror job, and each flow's control.

``MirrorFlowOperator`` runs one mirror job, an application of every flow it is given (the site
DAG ``mirror__<target>`` gives it every enabled flow into ``<target>``), as one long-running task.
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

``SyncOperator`` and ``GroupSyncOperator`` are the tasks of a site's sync DAG: the topic-config,
partition and ACL sync, and the consumer-group checkpoints and offset sync, of its flows.

``FlowControlOperator`` is the task of a flow's own DAG: a manual run with Params restarts the
flow at a start position (``starting_offsets``: default/earliest/latest/timestamp, with
``starting_timestamp``; ``restart``), inside the running application, and reports the flow's
state and progress.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator, SkipMixin
from airflow.sdk.exceptions import AirflowException

from mirrorflow.airflow.alerts import HealthAlerts, OnAlert
from mirrorflow.airflow.hooks import DEFAULT_CONN_ID, MirrorJobHook
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import project_root
from mirrorflow.runtime import guard, jobs, launch

STARTING_OFFSETS = ("default", "earliest", "latest", "timestamp")


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


def flow_file_paths(flow_files: Sequence[str], label: str) -> list[Path]:
    """The flow files as paths (relative ones against the project root); a missing one fails
    the task, naming it."""
    root = project_root()
    resolved = [p if p.is_absolute() else root / p for p in map(Path, flow_files)]
    missing = [str(p) for p in resolved if not p.is_file()]
    if missing:
        raise AirflowException(
            f"{label}: flow file(s) not found: {', '.join(missing)} "
            f"(relative paths are read from {root})"
        )
    return resolved


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


class FlowControlOperator(BaseOperator):
    """The task of a flow's own DAG: applies a manual run's Params to the flow and reports its
    state and progress (returned, so it lands in XCom).

    The flow runs inside its site's mirror job; pausing this task's DAG pauses the flow there.
    A run with *Restart* (or a start position, for a flow without progress) asks the flow to
    start over at that position: the running application restarts it after its batch, and
    this task waits up to ``wait_timeout`` for that; without a running job the request waits
    for the flow's next start.

    :param flow: the flow (``"SOURCE->TARGET"``)
    :param state_dir: the flows' state directory, as the mirror job's (default
        ``$MIRRORFLOW_STATE/flows``)
    :param wait_timeout: how long to wait for a running job to take a restart request
    """

    ui_color = "#f0f0e0"

    def __init__(
        self,
        *,
        flow: str,
        state_dir: str | None = None,
        wait_timeout: timedelta | float = timedelta(seconds=120),
        **kwargs: Any,
    ) -> None:
        jobs.split_flow(flow)
        super().__init__(**kwargs)
        self.flow, self.state_dir = flow, state_dir
        wait = wait_timeout
        self.wait_timeout = wait.total_seconds() if isinstance(wait, timedelta) else wait

    @property
    def flow_dir(self) -> Path:
        return jobs.JobFiles.for_flow(self.flow, self.state_dir).flow_dir(self.flow)

    def execute(self, context: Any) -> dict[str, Any]:
        params = context.get("params") or {}
        position = start_position(params)
        flow_dir = self.flow_dir
        choice = params.get("starting_offsets") or "default"
        if params.get("restart") or (position is not None and not jobs.has_progress(flow_dir)):
            jobs.request_restart(flow_dir, position)
            self.log.warning(
                "restart: %s starts over from %s, its positions overwritten",
                self.flow,
                choice if position is None else position,
            )
            self._wait_for_restart(flow_dir)
        elif position is not None:
            self.log.warning(
                "flow %s has progress: starting_offsets=%s applies only with restart "
                "(nothing changed)",
                self.flow,
                choice,
            )
        progress = jobs.read_progress(flow_dir)
        self.log.info(
            "flow %s: %s; %s records in %s batches; last update %s%s",
            self.flow,
            progress.get("state", "never run here"),
            progress.get("records", 0),
            progress.get("batches", 0),
            progress.get("updated", "-"),
            f"; error: {progress['error']}" if progress.get("error") else "",
        )
        return progress

    def _wait_for_restart(self, flow_dir: Path) -> None:
        if (flow_dir / jobs.PAUSED_FILE).exists():
            self.log.info("the flow is paused: it starts over when its DAG is unpaused")
            return
        deadline = time.monotonic() + self.wait_timeout
        while time.monotonic() < deadline:
            if jobs.restart_request(flow_dir) is None:
                self.log.info("the mirror job took the request: %s started over", self.flow)
                return
            time.sleep(1)
        self.log.info(
            "no running mirror job took the request within %.0fs: %s starts over when its "
            "site's mirror DAG next starts it",
            self.wait_timeout,
            self.flow,
        )


def start_position(params: dict[str, Any]) -> str | None:
    """``starting_offsets`` of a run's Params as the job takes it: None (the flow's own),
    earliest, latest, or epoch milliseconds."""
    choice = params.get("starting_offsets") or "default"
    if choice not in STARTING_OFFSETS:
        raise AirflowException(f"starting_offsets must be one of {', '.join(STARTING_OFFSETS)}")
    if choice == "timestamp":
        stamp = params.get("starting_timestamp")
        if not stamp:
            raise AirflowException("starting_offsets 'timestamp' needs starting_timestamp")
        when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        if when.tzinfo is None:
            raise AirflowException("starting_timestamp needs a time zone, e.g. ...Z")
        return str(int(when.timestamp() * 1000))
    return None if choice == "default" else choice


class SyncOperator(BaseOperator):
    """The task of a site's sync DAG: the topic-config, partition and ACL sync of ``flows``
    (``mirrorflow sync``), each change logged, the reports returned (XCom).

    A run's Param ``dry_run`` shows the diff without applying it. A refused change (or an
    unreachable cluster) fails the task with one line naming cluster, principal and resource.

    :param flows: the flows to sync (``"SOURCE->TARGET"`` each)
    :param flow_files: their flow files (mm2.properties or YAML), merged in order
    """

    ui_color = "#e8f0e0"

    def __init__(self, *, flows: Sequence[str], flow_files: Sequence[str], **kwargs: Any) -> None:
        for flow in flows:
            jobs.split_flow(flow)
        if not flows or not flow_files:
            raise ValueError("SyncOperator needs flows and flow_files")
        super().__init__(**kwargs)
        self.flows, self.flow_files = list(flows), list(flow_files)

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from mirrorflow.replication.spec import spec_for_flow
        from mirrorflow.replication.sync import run_syncs

        dry_run = bool((context.get("params") or {}).get("dry_run"))
        paths = flow_file_paths(self.flow_files, ", ".join(self.flows))
        reports, failures = [], []
        try:
            for flow in self.flows:
                # ${file:…} references resolve from the project root, as for the mirror job.
                spec = spec_for_flow(paths, flow, base_dir=project_root())
                for report in run_syncs(spec, dry_run)[0]:
                    for line in report.lines():
                        self.log.info("%s", line)
                    reports.append(report.as_dict())
                    failures += [f"{flow}: {failure}" for failure in report.failures]
        except MirrorflowError as exc:
            raise AirflowException(f"sync of {', '.join(self.flows)}: {exc}") from None
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise AirflowException(failures[0] + more)
        return reports


class GroupSyncOperator(BaseOperator):
    """The ``groups`` task of a site's sync DAG: for each of ``flows``, checkpoint its consumer
    groups now and, where the flow sets ``sync.group.offsets.enabled``, commit the translated
    offsets into the target's idle groups (``mirrorflow sync-groups``; the logic is
    :func:`mirrorflow.replication.checkpoints.run_group_sync`).

    Each group's translation table (source partition, committed offset, target partition,
    resume offset, exactness, what was done) is logged, with the groups skipped because they
    have members on the target; the runs are returned (XCom). A run's Param ``dry_run``
    translates and logs only: no checkpoint is written, no offset committed. An unreachable
    cluster or a refusal fails the task with one line naming cluster and principal.

    :param flows: the flows (``"SOURCE->TARGET"`` each); those with
        ``emit.checkpoints.enabled = false`` are passed over
    :param flow_files: their flow files (mm2.properties or YAML), merged in order
    """

    ui_color = "#e0e8f0"

    def __init__(self, *, flows: Sequence[str], flow_files: Sequence[str], **kwargs: Any) -> None:
        for flow in flows:
            jobs.split_flow(flow)
        if not flows or not flow_files:
            raise ValueError("GroupSyncOperator needs flows and flow_files")
        super().__init__(**kwargs)
        self.flows, self.flow_files = list(flows), list(flow_files)

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from mirrorflow.replication.checkpoints import run_group_sync
        from mirrorflow.replication.spec import spec_for_flow

        dry_run = bool((context.get("params") or {}).get("dry_run"))
        paths = flow_file_paths(self.flow_files, ", ".join(self.flows))
        runs = []
        for flow in self.flows:
            try:
                # ${file:…} references resolve from the project root, as for the mirror job.
                spec = spec_for_flow(paths, flow, base_dir=project_root())
                if not spec.emit_checkpoints_enabled:
                    self.log.info("%s: emit.checkpoints.enabled = false: no checkpoints", flow)
                    continue
                run = run_group_sync(
                    spec, sync_offsets=spec.sync_group_offsets_enabled, dry_run=dry_run
                )
            except MirrorflowError as exc:
                raise AirflowException(f"group sync of {flow}: {exc}") from None
            for line in run.lines():  # the groups skipped are warned of as they are
                self.log.info("%s", line)
            runs.append(run.as_dict())
        return runs


class DRStepOperator(BaseOperator, SkipMixin):
    """One step of a flow's disaster-recovery DAG (``<kind>__<source>__<target>``): runs the
    step of the workflow ``kind`` (:func:`mirrorflow.dr.steps.workflow`: ``failover``,
    ``failback``, ``drill``) with the run's Params, logs what it finds and does, and returns it
    (XCom); the logic lives in :mod:`mirrorflow.dr`. A step that does not apply to the run is
    skipped (no principal to fence, an emergency's catch-up, a drill's dry run). The ``report``
    step writes the run's report and fails when an earlier step failed, so a failed run fails,
    report written. Each workflow reads its own Params (its request's ``from_params``).
    When a step is done, the tasks of the steps right after it that will not apply to the run
    (after an emergency failover's preflight, fence-producers and catch-up; after its final
    sync, the other modes' steps) are skipped without starting: in an emergency each task is a
    process and a scheduler hand-off.

    The DAGs name the subclasses :class:`FailoverStepOperator`, :class:`FailbackStepOperator`
    and :class:`DrillStepOperator`, which set ``kind``.

    :param step: one of the workflow's steps (e.g. :data:`mirrorflow.dr.failover.STEPS`)
    :param flow: the flow (``"SOURCE->TARGET"``)
    :param flow_files: its flow files (mm2.properties or YAML), merged in order
    :param state_dir: the flows' state directory, as the mirror job's (default
        ``$MIRRORFLOW_STATE/flows``)
    :param kind: the workflow (set by the subclasses)
    :param step_options: keyword options of the step function (e.g. the drill's
        ``failover_tasks``)
    """

    kind = ""
    ui_color = "#f8e8e0"

    def __init__(
        self,
        *,
        step: str,
        flow: str,
        flow_files: Sequence[str],
        state_dir: str | None = None,
        kind: str | None = None,
        step_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        from mirrorflow.dr.steps import workflow

        kind = kind or self.kind
        steps = workflow(kind).steps
        if step not in steps:
            raise ValueError(f"unknown {kind} step {step!r}: one of {', '.join(steps)}")
        jobs.split_flow(flow)
        if not flow_files:
            raise ValueError(f"flow {flow}: no flow files given")
        super().__init__(**kwargs)
        self.kind, self.step, self.flow, self.flow_files = kind, step, flow, list(flow_files)
        self.state_dir = state_dir
        self.step_options = dict(step_options or {})

    def run_fields(self, context: Any) -> dict[str, Any]:
        """What a request takes from the task and its run: flow, flow files, run id, state."""
        return {
            "flow": self.flow,
            "flow_files": tuple(str(p) for p in flow_file_paths(self.flow_files, self.flow)),
            "run_id": str(context.get("run_id") or "manual"),
            "state_dir": self.state_dir,
        }

    def request(self, context: Any) -> Any:
        """The run's request, from its Params (the workflow's request class reads them)."""
        from mirrorflow.dr.steps import workflow

        return workflow(self.kind).request_class.from_params(
            context.get("params") or {}, **self.run_fields(context)
        )

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from mirrorflow.dr.steps import StepSkipped, workflow

        dr = workflow(self.kind)
        try:
            request = self.request(context)
            result = dr.functions[self.step](
                request, log=lambda line: self.log.info("%s", line), **self.step_options
            )
        except StepSkipped as skipped:
            raise AirflowSkipException(str(skipped)) from None
        except MirrorflowError as exc:
            raise AirflowException(f"{self.kind} of {self.flow}, step {self.step}: {exc}") from None
        if self.step != "report":
            self._skip_tasks(context, dr.skip_ahead(request, self.step), result)
        if self.step == "report" and result.get("failed_steps"):
            raise AirflowException(
                f"{self.kind} of {self.flow} failed at step {result['failed_steps'][0]}; "
                f"report: {result['markdown']}"
            )
        return result

    def _skip_tasks(self, context: Any, steps: Sequence[str], result: dict[str, Any]) -> None:
        """Skip the tasks of this run's ``steps`` (their records already say why): this task
        succeeds, its XCom pushed here (Airflow does not push it for a task that skips others)."""
        tasks = [
            t
            for t in self.get_flat_relatives(upstream=False)
            if isinstance(t, DRStepOperator) and t.kind == self.kind and t.step in steps
        ]
        if tasks:
            self.log.info("%s", "steps that do not apply, skipped: " + ", ".join(steps))
            context["ti"].xcom_push(key="return_value", value=result)
            self.skip(context["ti"], tasks)


class FailoverStepOperator(DRStepOperator):
    """A step of a flow's failover DAG (``failover__<source>__<target>``),
    :mod:`mirrorflow.dr.failover`. Params: ``mode`` (planned, emergency, auto, rollback,
    measure-rpo), ``group_pattern``, ``fence_principals``, ``dry_run``,
    ``catch_up_timeout_seconds``, ``stop_timeout_seconds``, ``failover_run`` (rollback and
    measure-rpo: the failover run they act on)."""

    kind = "failover"
    ui_color = "#f8e8e0"


class DrillFailoverStepOperator(DRStepOperator):
    """A step of the emergency failover a destructive drill rehearses, in the drill DAG
    (``drill__<source>__<target>``, tasks ``emergency-failover.<step>``): the failover
    workflow's own step, as the failover DAG's task of that step runs it, for the drill's
    request (:func:`mirrorflow.dr.drill.emergency_failover_request`: the drill group, mode
    emergency, run ``drill__<run id>``). Skipped in a dry run, a non-destructive drill, or when
    the drill's traffic step did not end. Params: the drill's."""

    kind = "failover"
    ui_color = "#f8e8e0"

    def request(self, context: Any) -> Any:
        from mirrorflow.dr import drill

        return drill.emergency_failover_request(
            drill.DrillRequest.from_params(context.get("params") or {}, **self.run_fields(context))
        )


class FailbackStepOperator(DRStepOperator):
    """A step of a flow's failback DAG (``failback__<source>__<target>``),
    :mod:`mirrorflow.dr.failback`. Params: ``group_pattern``, ``fence_principals`` (on the DR
    cluster), ``dry_run``, ``failover_run_id`` (empty: the latest failover that held the flow)."""

    kind = "failback"
    ui_color = "#e0f0e8"


class DrillStepOperator(DRStepOperator):
    """A step of a flow's DR drill DAG (``drill__<source>__<target>``), :mod:`mirrorflow.dr.drill`.
    Params: ``mode`` (non-destructive, destructive), ``canaries``, ``group_prefix``, ``dry_run``,
    ``traffic_seconds``, ``rate``."""

    kind = "drill"
    ui_color = "#e8f0f8"
