"""The FastAPI app of mirrorflow's Airflow UI page, mounted by ``plugins/mirrorflow_ui.py``.

Routes (under the plugin's prefix, ``/mirrorflow``):

- ``GET /``: the topology page, server-rendered HTML (``templates/ui/topology.html.j2``): the
  clusters, and every flow of the rendered mirror DAGs with its health, reason, lag, last
  heartbeat, checkpoint and batch; it reloads itself every few seconds.
- ``GET /api/health``: the same as JSON.

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
from mirrorflow.airflow.ui.sites import dags_paused, site_dags
from mirrorflow.health.model import SiteDag
from mirrorflow.health.status import topology_health
from mirrorflow.runtime import jobs

User = Annotated[BaseUser, Depends(get_user)]
REFRESH_SECONDS = 5
TEMPLATE = "ui/topology.html.j2"


def collect(user: BaseUser | None, now: float | None = None) -> dict[str, Any]:
    """Clusters and flows of the mirror DAGs ``user`` may read (None: all), with their health."""
    now = time.time() if now is None else now
    dags_folder = Path(conf.get("core", "dags_folder"))
    state_dir = jobs.default_state_dir()
    sites = [s for s in site_dags(dags_folder) if user is None or _may_read(user, s.dag_id)]
    paused = dags_paused(
        [s.dag_id for s in sites] + [d for s in sites for d in s.flow_dags.values()]
    )
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
            flow.update(mirror_dag=site.dag_id, flow_dag=site.flow_dags.get(flow["flow"]))
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


def _may_read(user: BaseUser, dag_id: str) -> bool:
    return get_auth_manager().is_authorized_dag(
        method="GET", details=DagDetails(id=dag_id), user=user
    )


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
    return environment


def _age(at: float | None, now: float) -> str:
    if at is None:
        return "—"
    seconds = max(0, int(now - at))
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}min ago"
    return f"{seconds // 3600}h ago"


def _utc(at: float | None) -> str:
    return "" if at is None else datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def render_page(data: dict[str, Any]) -> str:
    return _jinja().get_template(TEMPLATE).render(refresh=REFRESH_SECONDS, **data)


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
        return render_page(collect(user))

    @app.get("/api/health")
    def health(user: User) -> dict[str, Any]:
        return collect(user)

    @app.exception_handler(HTTPException)
    async def refused(request: Request, exc: HTTPException) -> Response:
        """401 on the page from a browser: to the login page, back here after it."""
        wants_html = "text/html" in request.headers.get("accept", "")
        page_path = request.scope.get("root_path", "").rstrip("/") + "/"
        if (
            exc.status_code == 401
            and wants_html
            and request.url.path in (page_path, page_path[:-1])
        ):
            login = get_auth_manager().get_url_login(next_url=str(request.url))
            return RedirectResponse(login, status_code=303)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    return app
