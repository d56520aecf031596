"""The step plumbing the disaster-recovery workflows share: the failover
(:mod:`mirrorflow.dr.failover`), the failback (:mod:`mirrorflow.dr.failback`) and the drill
(:mod:`mirrorflow.dr.drill`).

A workflow (:class:`Workflow`) is a kind (``failover``, ``failback``, ``drill``: its DAG's and its
report folder's name), a request class (:class:`~mirrorflow.dr.request.DRRequest`: what a run was
asked to do, from a DAG run's Params or a command's options), a run record class (:class:`Run`) and
its steps in order, each registered with :meth:`Workflow.step`. A step runs in a process of its own
(an Airflow task) or in turn with the others (:meth:`Workflow.run_all`, the ``mirrorflow``
commands); either way it reads the run record, ``$MIRRORFLOW_STATE/reports/<kind>/<run
id>/run.json``, and adds its own :class:`StepRecord` to it, however it ends: success, skipped
(:class:`StepSkipped`: the step does not apply to the run) or failed (its one-line error). A drill
also keeps a timeline (:meth:`Run.event`).

The run's **ledger** (``run.json``'s ``changes``, :meth:`Run.change`) lists every change its steps
make (a flow held, ACLs created, offsets committed, records copied, a broker killed…), each saved
to ``run.json`` the moment it is made, before the step goes on (and may fail): so a run that
fails still reports what it changed, with what is needed to undo it (``undo``). A dry run's
ledger lists what it would change, each entry marked ``dry_run``.

The ``report`` step (:meth:`Workflow.report`) renders the run's report from the record:
``templates/<kind>_report.{md,html}.j2`` and ``report.json`` (the context), mode 0600
(:func:`write_report`), and fails the run (its DAG's last task, the command) when an earlier step
failed. Nothing here holds a secret: run records have names, offsets and paths only.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from mirrorflow import paths
from mirrorflow.dr.request import DRRequest
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.spec import MirrorSpec

Log = Callable[[str], None]
Partition = tuple[str, int]
Step = Callable[..., dict]


class StepSkipped(Exception):
    """A step that does not apply to this run (e.g. no principal to fence): the reason."""


def now() -> str:
    """The time now, as run records keep it (ISO 8601, UTC, milliseconds)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def iso(epoch: float) -> str:
    """Epoch seconds as run records keep times."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def stamp_ms(stamp: str | None) -> tuple[int, int] | None:
    """An ISO 8601 time as (epoch milliseconds, its precision in ms: 1000 for whole seconds,
    else 1), None when it is none."""
    try:
        moment = datetime.fromisoformat(str(stamp))
    except ValueError:
        return None
    clock = str(stamp).split("T", 1)[-1]
    precision = 1 if "." in clock or "," in clock else 1000
    return math.floor(moment.timestamp() * 1000), precision


def seconds_between(started: str | None, ended: str | None) -> float | None:
    """Seconds from one recorded time to another (None when either is missing)."""
    try:
        return round(
            (
                datetime.fromisoformat(str(ended)) - datetime.fromisoformat(str(started))
            ).total_seconds(),
            3,
        )
    except ValueError:
        return None


def safe_run_id(run_id: str) -> str:
    """A DAG run id as a directory name (``manual__2026-…+00:00`` keeps its letters)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]+", "_", run_id).strip("._")
    return cleaned or "run"


def reports_dir(kind: str) -> Path:
    """Where runs of ``kind`` keep their record and report: ``$MIRRORFLOW_STATE/reports/<kind>``."""
    return paths.state_dir() / "reports" / kind


# -- the run record ----------------------------------------------------------------------------


@dataclass
class StepRecord:
    """One step of a run: when it ran, how it ended, what it found or changed."""

    step: str
    started: str
    ended: str | None = None
    status: str = "running"  # running, success, skipped, failed
    summary: str = ""
    details: dict = field(default_factory=dict)


class Run:
    """A run's record, ``run.json`` in its report directory ``reports/<KIND>/<run id>/``: the
    request, each step's record (and what a workflow adds, e.g. a failover's mode, a drill's
    timeline). Every step reads it and adds its own, so steps run in separate processes
    (Airflow tasks) share what they found."""

    KIND: ClassVar[str]

    def __init__(self, request: DRRequest) -> None:
        self.request = request
        self.directory = reports_dir(self.KIND) / safe_run_id(request.run_id)
        self.file = self.directory / "run.json"
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):
            data = {}
        self.data: dict = data or self.new_record()
        self.current: str | None = None  # the step being recorded

    def new_record(self) -> dict:
        """The record of a run no step has recorded yet."""
        request = self.request
        return {
            "flow": request.flow,
            "run_id": request.run_id,
            "request": {**request.record(), "flow_files": list(request.flow_files)},
            "started": now(),
            "steps": [],
            "changes": [],
        }

    @property
    def steps(self) -> list[dict]:
        return self.data["steps"]

    def step(self, name: str) -> dict:
        """The latest record of step ``name`` (empty when it has not run)."""
        found = [s for s in self.steps if s["step"] == name]
        return found[-1] if found else {}

    def details(self, name: str) -> dict:
        """What step ``name`` found or changed, as it last recorded it (empty: not run)."""
        return self.step(name).get("details", {})

    def failed_steps(self) -> list[str]:
        return [s["step"] for s in self.steps if s["status"] == "failed"]

    @property
    def changes(self) -> list[dict]:
        """The ledger: every change the run's steps made (or, in a dry run, would make)."""
        return self.data.setdefault("changes", [])

    def change(
        self, kind: str, what: str, undo: dict | None = None, *, step: str | None = None
    ) -> dict:
        """Add a change to the ledger and save the record at once (before the step goes on):
        ``kind`` (e.g. ``hold``, ``fence-acl``, ``group-offsets``), ``what`` one line, ``undo``
        what undoing it needs (None: not undoable, or nothing to say). In a dry run the entry is
        marked ``dry_run`` (``what`` then says what would be done). Returns the entry."""
        entry: dict[str, Any] = {
            "at": now(),
            "step": step or self.current or "-",
            "kind": kind,
            "what": what,
            "dry_run": bool(self.data.get("request", {}).get("dry_run")),
        }
        if undo is not None:
            entry["undo"] = undo
        self.changes.append(entry)
        self.save()
        return entry

    def event(self, what: str, at: float | None = None) -> float:
        """Add a moment to the timeline (epoch seconds, default now); returns it."""
        at = time.time() if at is None else at
        self.data.setdefault("timeline", []).append({"at": iso(at), "epoch": at, "event": what})
        return at

    def save(self) -> None:
        paths.write_private(self.file, json.dumps(self.data, indent=1, sort_keys=True) + "\n")

    @contextlib.contextmanager
    def recording(self, name: str) -> Iterator[StepRecord]:
        """Run a step: its record is saved however it ends (success, skipped, failed)."""
        record = StepRecord(name, now())
        self.current = name
        try:
            yield record
            record.status = "success"
        except StepSkipped as skipped:
            record.status, record.summary = "skipped", str(skipped)
            raise
        except Exception as exc:
            record.status, record.summary = "failed", str(exc)
            raise
        finally:
            self.current = None
            record.ended = now()
            self.steps.append(asdict(record))
            self.save()

    # -- the report ------------------------------------------------------------------------
    def report_context(self) -> dict:
        """What the report templates show (and ``report.json`` holds), from the record."""
        raise NotImplementedError

    def report_header(self, step_details: bool = True, ended: bool = True) -> dict:
        """What every report shows of its run: flow, run id, request, dry run, when it started
        (and ``ended``, when the last step ended and how many seconds it took), its status
        (``success`` or ``failed at <step>``), its steps, each with its seconds (and
        ``step_details``, what it found), and its ledger (``changes``, oldest first). Steps are
        in the workflow's order (a step skipped ahead, :meth:`Workflow.skip_ahead`, in its
        place), a step run again after its earlier record."""
        data = self.data
        known = _WORKFLOWS.get(self.KIND)
        order = {name: i for i, name in enumerate(known.steps if known else ())}
        rows = [
            {
                **{k: v for k, v in s.items() if step_details or k != "details"},
                "seconds": seconds_between(s.get("started"), s.get("ended")),
            }
            for s in sorted(data["steps"], key=lambda s: order.get(s["step"], len(order)))
        ]
        failed = self.failed_steps()
        header = {
            "flow": data["flow"],
            "run_id": data["run_id"],
            "request": data["request"],
            "dry_run": bool(data["request"]["dry_run"]),
            "started": data.get("started"),
            "status": "failed at " + failed[0] if failed else "success",
            "steps": rows,
            "changes": list(data.get("changes") or []),
        }
        if ended:
            last = rows[-1]["ended"] if rows else None
            header.update(ended=last, seconds=seconds_between(data.get("started"), last))
        return header

    def report_lines(self, context: dict) -> list[str]:
        """Lines the report step logs before saying where the report is (default none)."""
        return []


def write_report(run: Run, context: dict | None = None) -> dict[str, str]:
    """Render and write ``report.md``, ``report.html`` and ``report.json`` (mode 0600) in the
    run's directory; their paths. The templates are ``<run.KIND>_report.{md,html}.j2``;
    ``context`` defaults to the run's :meth:`Run.report_context`."""
    import jinja2

    context = run.report_context() if context is None else context
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.resource("templates"))),
        undefined=jinja2.StrictUndefined,
        autoescape=jinja2.select_autoescape(["html.j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    written = {}
    for template, name, key in (
        (f"{run.KIND}_report.md.j2", "report.md", "markdown"),
        (f"{run.KIND}_report.html.j2", "report.html", "html"),
    ):
        text = environment.get_template(template).render(**context)
        written[key] = str(paths.write_private(run.directory / name, text))
    written["json"] = str(
        paths.write_private(
            run.directory / "report.json", json.dumps(context, indent=1, sort_keys=True)
        )
    )
    return written


# -- workflows ---------------------------------------------------------------------------------

_WORKFLOWS: dict[str, Workflow] = {}


class Workflow:
    """A DR workflow: its kind, request and run record classes, and its steps in order.

    :param run: the run record class (its ``KIND`` is the workflow's kind)
    :param request: the request class
    :param steps: the steps' names in order (the DAG's task ids)
    :param always: the steps that run however the steps before them ended (as their DAG
        tasks' trigger rule ``all_done``): the report, a drill's restore
    :param skip_reason: ``(request, run, step)``: why a step does not apply to the run (None:
        it does), the rule its steps skip by; with it the DAG skips, when a step is done, the
        tasks of the steps right after it that will not apply (:meth:`skip_ahead`)
    """

    def __init__(
        self,
        run: type[Run],
        request: type[DRRequest],
        steps: Sequence[str],
        always: Sequence[str] = ("report",),
        skip_reason: Callable[[Any, Any, str], str | None] | None = None,
    ) -> None:
        self.kind = run.KIND
        self.run_class, self.request_class = run, request
        self.steps, self.always = tuple(steps), tuple(always)
        self.skip_reason = skip_reason
        self.functions: dict[str, Step] = {"report": self.report} if "report" in steps else {}
        _WORKFLOWS[self.kind] = self

    def step(self, name: str, *, xcom_details: bool = True) -> Callable[[Callable], Step]:
        """Register the step ``name``: ``body(request, run, record, log, **options)`` fills
        its record (details, summary) inside the run's recording; the step, called as
        ``step(request, log=print, **options)``, returns ``{"step", **details, "summary"}``
        (the task's XCom; without the details when ``xcom_details`` is false: large ones)."""
        if name not in self.steps:
            raise ValueError(f"{self.kind} has no step {name!r}")

        def register(body: Callable[..., None]) -> Step:
            def run_step(request: DRRequest, log: Log = print, **options: Any) -> dict:
                run = self.run_class(request)
                with run.recording(name) as record:
                    body(request, run, record, log, **options)
                details = record.details if xcom_details else {}
                return {"step": name, **details, "summary": record.summary}

            # the body's name and docstring; the step's own signature
            for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
                setattr(run_step, attribute, getattr(body, attribute))
            self.functions[name] = run_step
            return run_step

        return register

    def skip_ahead(self, request: DRRequest, after: str) -> list[str]:
        """The steps right after ``after`` that do not apply to the run as its record now
        stands (a failover's mode, once its preflight chose it), up to the first that does, each
        recorded as skipped with its reason as if it had run: the DAG then skips their tasks
        without starting a process for each (seconds apiece on a busy scheduler, in an
        emergency), and its report lists them as the command's does. Only those: the DAG's
        tasks follow each other, so a later task skipped now would let its successor start
        before the steps before it ended. Empty without a :attr:`skip_reason`."""
        if self.skip_reason is None:
            return []
        run = self.run_class(request)
        skipped = []
        for name in self.steps[self.steps.index(after) + 1 :]:
            reason = self.skip_reason(request, run, name)
            if not reason:
                break
            with contextlib.suppress(StepSkipped), run.recording(name):
                raise StepSkipped(reason)
            skipped.append(name)
        return skipped

    def report(self, request: DRRequest, log: Log = print) -> dict:
        """The ``report`` step: records itself, writes the report (Markdown, HTML, JSON), logs
        where; returns the files and the steps that failed (the task fails on those)."""
        run = self.run_class(request)
        with run.recording("report") as record:
            record.details = {"directory": str(run.directory)}
            record.summary = f"report written to {run.directory}"
        context = run.report_context()
        written = write_report(run, context)
        for line in run.report_lines(context):
            log(line)
        log(f"{self.kind} report: {written['markdown']} (and report.html, report.json)")
        return {"step": "report", **written, "failed_steps": run.failed_steps()}

    def run_all(self, request: DRRequest, log: Log = print) -> Run:
        """Every step in order, as the DAG runs them: a step that does not apply is skipped, a
        failed step ends the run but for the steps that always run (the report is written
        however it ended). Returns the run's record; raises, naming the report, on a failure."""
        failed: MirrorflowError | None = None
        for name in self.steps:
            if failed is not None and name not in self.always:
                continue
            try:
                self.functions[name](request, log=log)
            except StepSkipped as skipped:
                log(f"{name}: skipped: {skipped}")
            except MirrorflowError as exc:
                log(f"{name}: failed: {exc}")
                failed = exc
        run = self.run_class(request)
        if failed is not None:
            raise MirrorflowError(
                f"{self.kind} of {request.flow} failed: {failed.message}",
                (failed.hint + "; " if failed.hint else "")
                + f"report: {run.directory / 'report.md'}",
            )
        return run


def workflow(kind: str) -> Workflow:
    """The workflow ``kind`` (``failover``, ``failback``, ``drill``), its module imported."""
    if kind not in _WORKFLOWS:
        with contextlib.suppress(ModuleNotFoundError):
            importlib.import_module(f"mirrorflow.dr.{kind}")
    if kind not in _WORKFLOWS:
        raise ValueError(f"no DR workflow {kind!r}: one of failover, failback, drill")
    return _WORKFLOWS[kind]


def refuse_provenance_mode(spec: MirrorSpec, action: str) -> None:
    """A drill of a flow in provenance mode is refused in one line: it rehearses a one-way
    copy (its drill topic, its verification), not topics written on both sides."""
    if spec.provenance:
        raise MirrorflowError(
            f"{action} of {spec.flow} is not supported in provenance mode: it rehearses a "
            f"one-way copy, and {spec.flow}'s topics are written on both {spec.source} and "
            f"{spec.target}",
            "rehearse on a flow with the default replication policy, or run a real failover "
            "and failback (both work in provenance mode)",
        )
