"""The history of disaster-recovery runs (failovers, drills, failbacks) from their reports.

Each run leaves ``$MIRRORFLOW_STATE/reports/<kind>/<run>/report.json`` (and ``report.html``,
``report.md``), where ``<kind>`` is ``failover``, ``drill``, ``failback`` or any later kind and
``<run>`` the run's directory (its DAG run id, made safe as a directory name); :func:`paginate`
cuts the history, newest first, into pages. The reports are
read generically, so a kind whose report has other keys still shows: its flow, mode, result,
RPO, RTO and time when it names them, a dash when it does not.

:func:`find_report` is the only way from a request to a file: it lists the existing run
directories and returns the one whose name equals the one asked for, so no path from a request
is ever joined to the state directory (no traversal).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeGuard

from mirrorflow.health.numbers import thousands

KNOWN_KINDS = ("failover", "drill", "failback")
PAGE_SIZE, MAX_PAGE_SIZE = 20, 200  # the history's runs per page: by default, at most
REPORT_JSON, REPORT_HTML = "report.json", "report.html"


@dataclass(frozen=True)
class RunReport:
    """One run's report, as the history lists it (strings for display, None: not reported)."""

    kind: str
    run: str  # its directory's name
    flow: str | None
    mode: str | None
    result: str | None
    ok: bool | None  # whether the result is a success (None: cannot tell)
    dry_run: bool | None
    rpo: str | None
    rto: str | None
    started: str | None  # ISO 8601
    at: float  # Unix time, for ordering: when it started (else the report's file time)
    has_html: bool

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def reports_root(state: Path) -> Path:
    """Where runs keep their reports: ``<state>/reports`` (``state``: ``$MIRRORFLOW_STATE``)."""
    return state / "reports"


def _run_dirs(root: Path) -> list[tuple[str, Path]]:
    """Every ``(kind, run directory)`` holding a report.json, kinds and runs as found on disk."""
    found = []
    kinds = sorted(root.iterdir()) if root.is_dir() else []
    for kind_dir in kinds:
        if not kind_dir.is_dir() or kind_dir.is_symlink():
            continue
        for run_dir in sorted(kind_dir.iterdir()):
            if run_dir.is_dir() and not run_dir.is_symlink() and (run_dir / REPORT_JSON).is_file():
                found.append((kind_dir.name, run_dir))
    return found


def history(state: Path) -> list[RunReport]:
    """Every run's report under ``<state>/reports``, newest first. A report that cannot be read
    still shows, with its result saying so."""
    runs = [read_report(kind, directory) for kind, directory in _run_dirs(reports_root(state))]
    return sorted(runs, key=lambda r: (r.at, r.kind, r.run), reverse=True)


@dataclass(frozen=True)
class Page:
    """One page of the history: its runs (newest first) and where it sits among the others."""

    runs: list[RunReport]
    page: int  # from 1
    limit: int  # runs per page
    total: int  # runs on every page
    pages: int  # at least 1, even with no run
    newer: int | None  # the page before it (newer runs), None on the first
    older: int | None  # the page after it (older runs), None on the last

    def as_dict(self) -> dict[str, object]:
        return {
            "runs": [r.as_dict() for r in self.runs],
            "page": self.page,
            "limit": self.limit,
            "total": self.total,
            "pages": self.pages,
            "newer_page": self.newer,
            "older_page": self.older,
        }


def paginate(runs: list[RunReport], page: int = 1, limit: int = PAGE_SIZE) -> Page:
    """Page ``page`` (from 1) of ``runs`` (already newest first), ``limit`` a page. A page past
    the last has no run and points back to the last."""
    if page < 1 or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"page {page} / limit {limit}: page from 1, limit 1 to {MAX_PAGE_SIZE}")
    total = len(runs)
    pages = max(1, -(-total // limit))
    chosen = runs[(page - 1) * limit : page * limit]
    newer = min(page - 1, pages) if page > 1 else None
    older = page + 1 if page < pages else None
    return Page(chosen, page, limit, total, pages, newer, older)


def find_report(state: Path, kind: str, run: str, name: str = REPORT_HTML) -> Path | None:
    """The file ``name`` of the run ``kind``/``run`` if that run exists (None otherwise): the
    kind and run are matched against the directories listed, never joined as given."""
    for found_kind, directory in _run_dirs(reports_root(state)):
        if found_kind == kind and directory.name == run:
            path = directory / name
            return path if path.is_file() and not path.is_symlink() else None
    return None


def read_report(kind: str, directory: Path) -> RunReport:
    """One run's report.json, read generically (keys of the failover's report, and the usual
    spellings of a drill's or failback's)."""
    file = directory / REPORT_JSON
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        error = None if isinstance(data, dict) else "report.json is not an object"
    except (OSError, ValueError) as exc:
        data, error = {}, f"report.json unreadable: {exc.__class__.__name__}"
    if not isinstance(data, dict):
        data = {}
    request = data.get("request")
    if not isinstance(request, dict):
        request = {}
    started = _first(data, "started", "started_at", "start", "at", "ended", "ended_at")
    at = _unix(started)
    if at is None:
        try:
            at = file.stat().st_mtime
        except OSError:
            at = 0.0
    result, ok = _result(data) if error is None else (error, False)
    dry_run = _first(data, "dry_run")
    dry_run = request.get("dry_run") if dry_run is None else dry_run
    return RunReport(
        kind=kind,
        run=directory.name,
        flow=_text(_first(data, "flow") or request.get("flow")),
        mode=_text(_first(data, "mode") or request.get("mode")),
        result=result,
        ok=ok,
        dry_run=dry_run if isinstance(dry_run, bool) else None,
        rpo=_rpo(_first(data, "rpo", "rpo_records")),
        rto=_rto(_first(data, "rto", "rto_seconds")),
        started=_iso(at) if _unix(started) is not None else None,
        at=at,
        has_html=(directory / REPORT_HTML).is_file(),
    )


def _first(data: dict, *keys: str) -> object:
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    return None


SUCCESS = ("success", "succeeded", "passed", "pass", "ok", "done", "completed")


def _result(data: dict) -> tuple[str | None, bool | None]:
    value = _first(data, "status", "result", "outcome", "state", "passed")
    if isinstance(value, bool):
        return ("passed" if value else "failed"), value
    if isinstance(value, dict):  # e.g. {"status": "...", ...}
        return _result(value)
    text = _text(value)
    if text is None:
        return None, None
    lowered = text.lower()
    if lowered in SUCCESS:
        return text, True
    if lowered.startswith(("fail", "error", "abort")):
        return text, False
    return text, None


def _rpo(value: object) -> str | None:
    if isinstance(value, dict):
        short = value.get("summary_short") or value.get("summary")
        if isinstance(short, str) and short:
            return short
        records = value.get("records")
        if _is_number(records):
            exact = value.get("exact", True)
            return f"{thousands(int(records))} record(s)" + ("" if exact else " or more")
        return None
    if _is_number(value):
        return f"{thousands(int(value))} record(s)"
    return _text(value)


def _rto(value: object) -> str | None:
    if isinstance(value, dict):
        short = value.get("summary_short")
        if isinstance(short, str) and short:
            return short
        value = _first(value, "seconds", "rto_seconds", "value")
    if _is_number(value):
        return f"{thousands(float(value), 1)} s"
    return _text(value)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text(value: object) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    text = str(value).strip()
    return text.splitlines()[0][:200] if text else None


def _unix(value: object) -> float | None:
    if _is_number(value):
        return float(value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    return None


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
