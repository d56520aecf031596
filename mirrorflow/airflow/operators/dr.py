"""The operators of a flow's disaster-recovery DAGs (failover, failback, drill): one task per
step of the workflow; the logic lives in :mod:`mirrorflow.dr`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, SkipMixin
from airflow.sdk.exceptions import AirflowException

from mirrorflow.airflow.operators.flow_files import flow_file_paths
from mirrorflow.errors import MirrorflowError
from mirrorflow.runtime import jobs


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
