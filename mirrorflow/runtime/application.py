"""One Spark application running several flows, each with its own progress, errors and pause.

MirrorMaker 2 runs every flow into a cluster in one process; so can a mirror job: each flow's
:class:`~mirrorflow.runtime.driver.MirrorJob` runs on a thread of its own over the shared
SparkContext (its Spark jobs in a FAIR scheduler pool named after the flow, so a large batch of
one flow does not hold back the others). Per flow ``S->T``, under the flows state directory:

- ``S-T/paused``: while it exists the flow does not run. Created while the flow runs (a pause,
  or a failover's hold), the flow stops within :data:`PAUSE_BOUND_S` whatever its source is
  doing: its batch in progress may end on its own for :data:`PAUSE_GRACE_S`, then it is
  cancelled (:meth:`~mirrorflow.runtime.driver.MirrorJob.cancel`: at least once, its copies
  acknowledged so far are kept and the positions moved past them; exactly once, its open
  transactions are aborted); the flow is then PAUSED, and nothing more of it reaches the
  target. Removed, the flow starts again from its positions.
- ``S-T/restart``: a restart request (:func:`mirrorflow.runtime.jobs.request_restart`). A
  running flow ends its batch and starts again at the requested position.
- ``S-T/progress.json``: the flow's progress and state (written by the flow's job).

A flow that fails (a refused principal, a record too large) stops alone, its error logged in one
line; the others go on. The application ends when it is asked to (SIGTERM, SIGINT, its stop
file: every flow finishes its batch in progress), or, with ``once``, when every flow has copied
what was there. It exits 2 if any flow failed.

With a metrics port, the application serves one Prometheus registry for all its flows on
127.0.0.1 (:mod:`mirrorflow.runtime.metrics`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.errors import MirrorflowError
from mirrorflow.replication import lag
from mirrorflow.replication.scheduler import name_os_thread
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.runtime import jobs
from mirrorflow.runtime.driver import MirrorJob
from mirrorflow.runtime.metrics import FlowMetrics, Metrics
from mirrorflow.runtime.progress import record_state, update_progress

if TYPE_CHECKING:
    from mirrorflow.runtime.spark_session import JobSpark

log = logging.getLogger("mirrorflow.mirror")

CONTROL_INTERVAL_S = 0.5
PAUSE_GRACE_S = 2.0  # a paused flow's batch in progress may end on its own this long
PAUSE_BOUND_S = 10.0  # documented: a pause or a hold stops the flow within this (docs/concepts.md)


class FlowThread:
    """One flow's job on its own thread; started again after a pause."""

    def __init__(
        self,
        spec: MirrorSpec,
        make_job: Callable[[MirrorSpec], MirrorJob],
        metrics: FlowMetrics | None = None,
        ended: threading.Event | None = None,
    ) -> None:
        self.spec, self._make_job, self.metrics = spec, make_job, metrics
        self._ended = ended  # set when its job's thread ends: the application looks at once
        self.job: MirrorJob | None = None
        self.thread: threading.Thread | None = None
        self.error: MirrorflowError | None = None
        self.finished = False  # ended for good: --once done, or failed
        self.paused = False
        self.paused_at = 0.0  # monotonic: when this thread saw the flow paused while it ran
        self.restarting = False  # ending its batch to start over (a restart request)
        self.recorded: str | None = None  # the state this thread last wrote for the flow
        self._measuring: threading.Thread | None = None
        self._measured_at = 0.0  # monotonic: when its lag was last measured while stopped

    @property
    def flow_dir(self) -> Path:
        return Path(self.spec.flow_dir)

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def quiet(self) -> bool:
        """Cancelled, with no batch in flight: nothing more of this job reaches the target,
        even if its thread is still in a call to a cluster that does not answer."""
        return self.job is not None and self.job.quiet.is_set()

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def start(self, once: bool) -> None:
        self.recorded, self.restarting = None, False
        self.job = self._make_job(self.spec)
        self.thread = threading.Thread(
            target=self._run, args=(self.job, once), name=f"flow {self.spec.flow}", daemon=True
        )
        self.thread.start()

    def _run(self, job: MirrorJob, once: bool) -> None:
        name_os_thread("flow")
        job.spark.context.setLocalProperty("spark.scheduler.pool", self.spec.flow)
        try:
            job.run(once=once)
            # Ended without a pause or restart: --once is done, or the job was asked to stop.
            self.finished = not (self.paused or self.restarting)
        except Exception as exc:
            if job.cancelled:  # paused: what failed after the cancellation copies nothing
                log.info("%s: ended after its pause (%s)", self.spec.flow, exc)
            elif isinstance(exc, MirrorflowError):
                self._failed(exc)
            else:  # the flow dies alone, the others go on
                log.exception("flow %s stopped", self.spec.flow)
                self._failed(MirrorflowError(f"flow {self.spec.flow} stopped: {exc}"))
        finally:
            if self._ended is not None:
                self._ended.set()

    def _failed(self, error: MirrorflowError) -> None:
        # Kept for its message: its traceback's frames, and the Kafka clients in them, go now,
        # not at the interpreter's exit (a librdkafka client destroyed then may call back into
        # a finalized interpreter).
        error.__traceback__ = error.__context__ = error.__cause__ = None
        self.error, self.finished = error, True
        log.error("%s", error)
        self.record_state("FAILED", str(error))

    def record_state(self, state: str, error: str | None = None) -> None:
        """The flow's state in its progress.json and its metrics."""
        # The source's ends its job last listed stay known after it stops or fails (the RPO
        # estimate of an emergency failover).
        job = self.job
        observed = job.backlog.observed(dict(job.positions)) if job is not None else {}
        record_state(self.flow_dir, self.spec.flow, state, error, **observed)
        if self.metrics is not None:
            self.metrics.state(state)

    def request_stop(self) -> None:
        if self.job is not None:
            self.job.request_stop()

    def measure_lag(self) -> None:
        """While the flow is paused or failed, no job of it measures its lag: measure it here,
        every :data:`~mirrorflow.replication.lag.MEASURE_EVERY_S`, on a thread of its own (a
        source that does not answer holds back no other flow), into ``progress.json`` and the
        metrics: the backlog a pause or an outage leaves shows."""
        if self._measuring is not None and self._measuring.is_alive():
            return
        if time.monotonic() - self._measured_at < lag.MEASURE_EVERY_S:
            return
        self._measured_at = time.monotonic()
        self._measuring = threading.Thread(
            target=self._measure, name=f"lag {self.spec.flow}", daemon=True
        )
        self._measuring.start()

    def _measure(self) -> None:
        name_os_thread("lag-paused")
        from mirrorflow.replication.remote_cluster import flow_positions

        spec = self.spec
        try:  # the stored positions: a cancelled batch may have committed some since
            positions = {
                tp: o for tp, o in flow_positions(spec).items() if spec.should_replicate(tp[0])
            }
            measured = lag.measure(spec, positions)
        except MirrorflowError as exc:
            log.debug("%s: its lag could not be measured: %s", spec.flow, exc)
            return
        update_progress(self.flow_dir, **measured.as_progress())
        if self.metrics is not None:
            remote = {topic: spec.remote_topic(topic) for topic, _p in measured.ends}
            self.metrics.measured(measured, remote)


class Application:
    """Runs flows until they end or the application is asked to stop."""

    def __init__(
        self,
        spark: JobSpark,
        specs: list[MirrorSpec],
        *,
        once: bool = False,
        stop_file: Path | None = None,
        make_job: Callable[[MirrorSpec], MirrorJob] | None = None,
        metrics_port: int = 0,
    ) -> None:
        self.once, self.stop_file = once, stop_file
        self.metrics_port = metrics_port
        self.metrics = Metrics() if metrics_port else None
        self.flows = []
        # Set by a flow's thread as it ends: the control loop looks at once instead of at its
        # next round (a --once job exits as soon as its flows are done).
        self._wake = threading.Event()
        for spec in specs:
            flow_metrics = self.metrics.flow(spec.source, spec.target) if self.metrics else None
            if flow_metrics is not None:
                flow_metrics.state("STARTING")

            def job_of(s: MirrorSpec, m: FlowMetrics | None = flow_metrics) -> MirrorJob:
                return MirrorJob(spark, s, m)

            job = make_job or job_of
            self.flows.append(FlowThread(spec, job, flow_metrics, self._wake))
        self._stop = threading.Event()

    def request_stop(self, *_: object) -> None:
        # Not self._wake.set(): this runs as a signal handler, which must not take the lock
        # the control loop may hold on _wake; the loop sees the stop within its interval.
        self._stop.set()

    def run(self) -> int:
        """Run every flow; 0 when all ended well, 2 when any failed."""
        if self.metrics is not None:
            port = self.metrics.serve(self.metrics_port)
            log.info("metrics for Prometheus at http://127.0.0.1:%d/metrics", port)
        try:
            return self._run()
        finally:
            if self.metrics is not None:
                self.metrics.close()

    def _run(self) -> int:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.request_stop)
        parent = os.getppid()
        while True:
            self._wake.clear()  # before looking: a flow ending from here on wakes the wait
            if self.stop_file is not None and self.stop_file.exists():
                self._stop.set()
            if os.getppid() != parent:  # spark-submit's JVM, and with it Spark, is gone
                self._stop.set()
            for flow in self.flows:
                self._control(flow)
            if all(not f.running for f in self.flows) and (
                self._stop.is_set() or all(f.finished for f in self.flows)
            ):
                break
            self._wake.wait(CONTROL_INTERVAL_S)
        for flow in self.flows:
            if flow.error is None and not flow.paused:
                flow.record_state("STOPPED")
        return 2 if any(f.error is not None for f in self.flows) else 0

    def _control(self, flow: FlowThread) -> None:
        paused = (flow.flow_dir / jobs.PAUSED_FILE).exists()
        if flow.running:
            if self._stop.is_set() or paused:
                if paused and not flow.paused:
                    flow.paused, flow.paused_at = True, time.monotonic()
                    log.info(
                        "%s: paused: its batch in progress, if any, ends within %.0f s, else "
                        "it is cancelled",
                        flow.spec.flow,
                        PAUSE_GRACE_S,
                    )
                flow.request_stop()
                if flow.paused and time.monotonic() - flow.paused_at >= PAUSE_GRACE_S:
                    flow.cancel()
                if flow.paused and flow.quiet and flow.recorded != "PAUSED":
                    # its thread may still wait for a cluster that does not answer: it copies
                    # nothing more, and starts again only once it has ended
                    flow.record_state("PAUSED")
                    flow.recorded = "PAUSED"
                if flow.paused and flow.quiet:
                    flow.measure_lag()
            elif not flow.restarting and jobs.restart_request(flow.flow_dir) is not None:
                flow.restarting = True
                log.info("%s: restart requested: it starts over after its batch", flow.spec.flow)
                flow.request_stop()
            return
        if flow.error is not None and not self._stop.is_set():
            flow.measure_lag()
        if self._stop.is_set() or flow.finished:
            return
        if paused:
            flow.measure_lag()
            if not flow.paused:
                log.info("%s: paused", flow.spec.flow)
                flow.paused = True
            if flow.recorded != "PAUSED":
                flow.record_state("PAUSED")
                flow.recorded = "PAUSED"
            return
        if flow.paused:
            log.info("%s: resumed", flow.spec.flow)
            flow.paused = False
        flow.start(self.once)
