"""The FastAPI app of mirrorflow's Airflow UI page, mounted by its plugin (:mod:`.plugin`).

Routes (under the plugin's prefix, ``/mirrorflow``):

- ``GET /``: the topology page, server-rendered HTML (``templates/ui/topology.html.j2``): the
  clusters and flows drawn as a graph (inline SVG laid out by :mod:`.graph`: a box per cluster,
  an arrow per flow with its health and lag), and every flow of the rendered mirror DAGs with its
  health, reason, lag, last heartbeat, checkpoint and batch; it reloads itself every few
  seconds.
- ``GET /api/health``: the same as JSON.
- ``GET /history?page=N&limit=M``: the history of failovers, drills and failbacks, newest
  first, from their reports (:mod:`mirrorflow.health.history`), ``limit`` (default 20, at most
  200) a page with links to the newer and older pages, each linking to its HTML report; and,
  per flow whose failover, drill or failback DAG Airflow knows, buttons that trigger that DAG
  through Airflow's own
  REST API (``POST /api/v2/dags/{dag_id}/dagRuns``) from the browser, as the logged-in user (the
  UI's ``_token`` cookie): Airflow's own permission checks decide, not this app.
- ``GET /api/history?page=N&limit=M``: the same page as JSON (``runs``, ``page``, ``limit``,
  ``total``, ``pages``, ``newer_page``, ``older_page``, ``actions``); a bad ``page`` or
  ``limit`` is a 400 naming it.
- ``GET /flows/{source}/{target}``: one flow in detail (:mod:`mirrorflow.health.detail`): its
  health, lag per partition, topics, groups with their last checkpoints (read from the target,
  bounded in time; an unreachable cluster gives a note), and its DR runs.
- ``GET /api/flows/{source}/{target}``: the same as JSON.
- ``GET /reports/{kind}/{run}``: a run's ``report.html``; only runs that exist (the names are
  matched against the directories listed, never used as a path), 404 otherwise.

Airflow mounts a plugin's app without any of its own authentication, so this app adds it: every
route depends on :func:`requires_access_dag` ``("GET")`` (a logged-in user who may read DAGs;
401 without a login, 403 without the permission), and a flow is shown only to a user who may
read its site's mirror DAG. An anonymous browser asking for the page is sent to the login page.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import get_user, requires_access_dag
from airflow.configuration import conf
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from mirrorflow import paths
from mirrorflow.airflow.ui import charts
from mirrorflow.airflow.ui.graph import layout
from mirrorflow.airflow.ui.sites import dags_paused, mirror_tasks, site_dags
from mirrorflow.health import detail as flow_details
from mirrorflow.health import history as dr_history
from mirrorflow.health import trends
from mirrorflow.health.model import STATES, SiteDag
from mirrorflow.health.numbers import thousands
from mirrorflow.health.status import topology_health
from mirrorflow.runtime import jobs

User = Annotated[BaseUser, Depends(get_user)]
REFRESH_SECONDS = 5
SPARKLINE = "rate"  # the flows' table shows records/s over the last hour
TEMPLATE = "ui/topology.html.j2"
HISTORY_TEMPLATE = "ui/history.html.j2"
FLOW_TEMPLATE = "ui/flow.html.j2"
TRIGGER_KINDS = ("failover", "drill", "failback")  # DR DAGs the pages trigger, when they exist
# A run's report is the project's own HTML, but serve it locked down all the same.
REPORT_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:",
    "X-Content-Type-Options": "nosniff",
}


def collect(user: BaseUser | None, now: float | None = None) -> dict[str, Any]:
    """Clusters and flows of the mirror DAGs ``user`` may read (None: all), with their health."""
    now = time.time() if now is None else now
    dags_folder = Path(conf.get("core", "dags_folder"))
    state_dir = jobs.default_state_dir()
    sites = [s for s in site_dags(dags_folder) if user is None or _may_read(user, s.dag_id)]
    paused = dags_paused(
        [s.dag_id for s in sites] + [d for s in sites for d in s.flow_dags.values()]
    )
    tasks = mirror_tasks([s.dag_id for s in sites if s.dag_id in paused])
    clusters: list[str] = []
    flows: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    for site in sites:

        def dags(flow: str, site=site) -> SiteDag:
            flow_dag = site.flow_dags.get(flow)
            return SiteDag(site.dag_id, paused.get(site.dag_id), flow_dag, paused.get(flow_dag))

        health = topology_health(
            site.flow_files, state_dir, dags=dags, only=site.flow_dags, now=now
        )
        clusters += [c for c in health.clusters if c not in clusters]
        for flow in health.flows:
            flow.update(
                mirror_dag=site.dag_id,
                flow_dag=site.flow_dags.get(flow["flow"]),
                mirror_task=tasks.get(site.dag_id),  # where its job's log is
            )
            flows.append(flow)
        if health.error:
            errors.append({"dag_id": site.dag_id, "error": health.error})
    return {
        "generated_at": now,
        "dags_folder": str(dags_folder),
        "state_dir": str(state_dir),
        "clusters": clusters,
        "flows": flows,
        "errors": errors,
    }


def _may_read(user: BaseUser, dag_id: str | None) -> bool:
    return get_auth_manager().is_authorized_dag(
        method="GET", details=DagDetails(id=dag_id) if dag_id else None, user=user
    )


def dr_dag_id(kind: str, flow: str | None) -> str | None:
    """The DAG of a DR run of ``kind`` for ``flow`` (``failover__S__T``), None without a flow."""
    source, arrow, target = (flow or "").partition("->")
    return f"{kind}__{source}__{target}" if arrow and source and target else None


def readable_runs(user: BaseUser | None) -> list[dr_history.RunReport]:
    """The DR runs' reports ``user`` may see (their kind's DAG for the flow is readable),
    newest first."""
    return [
        r
        for r in dr_history.history(paths.state_dir())
        if user is None or _may_read(user, dr_dag_id(r.kind, r.flow))
    ]


def dr_actions(user: BaseUser | None, flows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per flow, the failover, drill and failback DAGs Airflow knows and ``user`` may read."""
    wanted = {
        flow["flow"]: [dr_dag_id(kind, flow["flow"]) for kind in TRIGGER_KINDS] for flow in flows
    }
    known = dags_paused([d for ids in wanted.values() for d in ids if d])
    actions = []
    for flow, dag_ids in wanted.items():
        dags = [
            {"kind": kind, "dag_id": dag_id, "paused": known[dag_id]}
            for kind, dag_id in zip(TRIGGER_KINDS, dag_ids, strict=True)
            if dag_id in known and (user is None or _may_read(user, dag_id))
        ]
        actions.append({"flow": flow, "dags": dags})
    return actions


def collect_history(
    user: BaseUser | None, page: int = 1, limit: int = dr_history.PAGE_SIZE
) -> dict[str, Any]:
    """Page ``page`` of the DR runs ``user`` may see (``limit`` a page, newest first), and per
    flow of the rendered mirror DAGs, the DR DAGs Airflow knows (:func:`dr_actions`)."""
    chosen = dr_history.paginate(readable_runs(user), page, limit)
    return {
        "generated_at": time.time(),
        "reports_dir": str(dr_history.reports_root(paths.state_dir())),
        **chosen.as_dict(),
        "actions": dr_actions(user, collect(user)["flows"]),
    }


def page_number(name: str, value: str | None, default: int, maximum: int | None = None) -> int:
    """A paging parameter of the query (``page``, ``limit``): a whole number from 1 (to
    ``maximum``), else 400 naming it."""
    if value is None or value == "":
        return default
    bound = f" to {maximum}" if maximum else ""
    whole = value.isascii() and value.isdigit() and len(value) <= 9
    if not whole or not 1 <= int(value) <= (maximum or int(value)):
        raise HTTPException(
            400, f"{name}={value[:40]!r}: give {name} as a whole number from 1{bound}"
        )
    return int(value)


def flow_trend(data: dict[str, Any], flow: dict[str, Any]) -> trends.Trend:
    """The last hour of a flow of :func:`collect`'s ``data``, from its job's ``trend.json``."""
    flow_dir = Path(data["state_dir"]) / f"{flow['source']}-{flow['target']}"
    return trends.flow_trend(flow_dir, data["generated_at"])


def collect_flow(user: BaseUser | None, source: str, target: str) -> dict[str, Any]:
    """One flow of the rendered mirror DAGs ``user`` may read, in detail (404 if none), with
    its last hour (``trend``: every series' points, gaps and restarts)."""
    return flow_and_trend(user, source, target)[0]


def flow_and_trend(
    user: BaseUser | None, source: str, target: str
) -> tuple[dict[str, Any], trends.Trend]:
    """:func:`collect_flow`'s answer, and the flow's trend to draw."""
    flow = f"{source}->{target}"
    topology = collect(user)
    found = [f for f in topology["flows"] if f["flow"] == flow]
    sites = [
        s
        for s in site_dags(Path(conf.get("core", "dags_folder")))
        if flow in s.flow_dags and (user is None or _may_read(user, s.dag_id))
    ]
    if not found or not sites:
        raise HTTPException(404, f"no flow {flow} in the mirror DAGs you may read")
    detail = flow_details.flow_detail(list(sites[0].flow_files), flow, jobs.default_state_dir())
    trend = flow_trend(topology, found[0])
    data = {
        "generated_at": topology["generated_at"],
        "flow": found[0],
        "trend": trend.as_dict(),
        **detail,
        "runs": [r.as_dict() for r in readable_runs(user) if r.flow == flow],
        "dags": [d for a in dr_actions(user, found) for d in a["dags"]],
    }
    return data, trend


def history_paging(page: str | None = None, limit: str | None = None) -> tuple[int, int]:
    """The history's ``?page=`` and ``?limit=`` (a dependency of its routes)."""
    size = page_number("limit", limit, dr_history.PAGE_SIZE, dr_history.MAX_PAGE_SIZE)
    return page_number("page", page, 1), size


Paging = Annotated[tuple[int, int], Depends(history_paging)]


def _jinja():
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.resource("templates"))),
        autoescape=True,  # reasons and errors come from files and clusters
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["age"] = _age
    environment.filters["utc"] = _utc
    environment.filters["num"] = thousands
    return environment


def _age(at: float | None, now: float) -> str:
    if at is None:
        return "—"
    seconds = max(0, int(now - at))
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}min ago"
    return f"{thousands(seconds // 3600)}h ago"


def _utc(at: float | None) -> str:
    return "" if at is None else datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def render_page(data: dict[str, Any], template: str = TEMPLATE) -> str:
    return _jinja().get_template(template).render(refresh=REFRESH_SECONDS, **data)


def render_topology(data: dict[str, Any]) -> str:
    """The topology page of :func:`collect`'s ``data``: the drawn graph, the flows' table with
    each flow's sparkline (records/s over the last hour)."""
    graph = layout(data["clusters"], data["flows"])
    sparklines = {
        f["flow"]: charts.sparkline(flow_trend(data, f), SPARKLINE) for f in data["flows"]
    }
    return render_page({**data, "graph": graph, "states": STATES, "sparklines": sparklines})


def create_app() -> FastAPI:
    """The app: every route requires a login and the DAG read permission."""
    app = FastAPI(
        title="mirrorflow",
        description="Replication health of mirrorflow's flows",
        dependencies=[Depends(requires_access_dag("GET"))],
        docs_url=None,  # no anonymous documentation pages either
        redoc_url=None,
        openapi_url=None,
    )

    @app.get("/", response_class=HTMLResponse)
    def page(user: User) -> str:
        return render_topology(collect(user))

    @app.get("/api/health")
    def health(user: User) -> dict[str, Any]:
        return collect(user)

    @app.get("/history", response_class=HTMLResponse)
    def history_page(user: User, paging: Paging) -> str:
        return render_page(collect_history(user, *paging), HISTORY_TEMPLATE)

    @app.get("/api/history")
    def history_json(user: User, paging: Paging) -> dict[str, Any]:
        return collect_history(user, *paging)

    @app.get("/flows/{source}/{target}", response_class=HTMLResponse)
    def flow_page(source: str, target: str, user: User) -> str:
        data, trend = flow_and_trend(user, source, target)
        drawn = [charts.chart(trend, name) for name in trends.SERIES]
        return render_page({**data, "charts": drawn}, FLOW_TEMPLATE)

    @app.get("/api/flows/{source}/{target}")
    def flow_json(source: str, target: str, user: User) -> dict[str, Any]:
        return collect_flow(user, source, target)

    @app.get("/reports/{kind}/{run}", response_class=HTMLResponse)
    def report(kind: str, run: str, user: User) -> Response:
        file = dr_history.find_report(paths.state_dir(), kind, run)
        if file is None:
            raise HTTPException(404, f"no {kind} report {run!r}")
        flow = dr_history.read_report(kind, file.parent).flow
        if not _may_read(user, dr_dag_id(kind, flow)):
            raise HTTPException(403, "you may not read this run's DAG")
        return HTMLResponse(file.read_text(encoding="utf-8"), headers=REPORT_HEADERS)

    @app.exception_handler(HTTPException)
    async def refused(request: Request, exc: HTTPException) -> Response:
        """401 on a page from a browser: to the login page, back here after it."""
        wants_html = "text/html" in request.headers.get("accept", "")
        api_path = request.scope.get("root_path", "").rstrip("/") + "/api/"
        if (
            exc.status_code == 401
            and wants_html
            and request.method == "GET"
            and not request.url.path.startswith(api_path)
        ):
            login = get_auth_manager().get_url_login(next_url=str(request.url))
            return RedirectResponse(login, status_code=303)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    return app
