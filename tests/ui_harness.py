"""Shared parts of the UI plugin's browser tests (tests/test_ui_*.py): a real api-server (and
dag-processor) from a private Airflow home, Debian's Chromium driven by Playwright, logging in
through Airflow's login page, plain HTTP calls that do not follow redirects, Airflow's REST API
as a given user, ``mirrorflow render`` into the api-server's DAGs folder, and the screenshots'
folder (``$MIRRORFLOW_TEST_ARTEFACTS/ui``, else the test's temporary folder)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirrorflow.devtools.local_airflow import UI_USER, LocalAirflow
from mirrorflow.devtools.sandbox import free_port_block

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MIRRORFLOW = str(Path(sys.executable).parent / "mirrorflow")  # the CLI of this environment
VIEWER = "viewer"


class AirflowWithViewer(LocalAirflow):
    """The local Airflow with a second user of the simple auth manager's *viewer* role (its
    password generated into the same 0600 file by Airflow)."""

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = f"{UI_USER}:admin,{VIEWER}:viewer"
        return env

    def password_of(self, user: str) -> str:
        return json.loads(self.password_file.read_text())[user]


@contextlib.contextmanager
def running_airflow(
    base: Path, services: tuple[str, ...], kind: type[LocalAirflow] = LocalAirflow
) -> Iterator[LocalAirflow]:
    """Airflow's ``services`` (the api-server with the plugin; a dag-processor if asked) from
    a new home under ``base`` (SQLite, simple auth manager, 0600 password file), on a free
    port (searched from this process's own start, so parallel test workers do not race for
    8080); stopped at the end."""
    airflow = kind(base / "airflow", base / "state", say=lambda line: None)
    airflow.choose_port(free_port_block(1))
    airflow.migrate()
    airflow.dags_folder.mkdir(parents=True, exist_ok=True)
    try:
        airflow.start_services(services)
        airflow.wait_for_api()
        yield airflow
    finally:
        airflow.stop_services(say=lambda line: None)


def render_dags(config: Path, airflow: LocalAirflow) -> None:
    """``mirrorflow render`` of the flow file into the api-server's DAGs folder."""
    result = subprocess.run(
        [MIRRORFLOW, "render", str(config), "--out", str(airflow.dags_folder)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict]:
    """GET without following redirects: (status, body, headers)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), dict(exc.headers)


def plugin_get_routes() -> list[str]:
    """Every GET route of the plugin's app, as the plugin mounts it."""
    from fastapi.routing import APIRoute

    from mirrorflow.airflow.ui.app import create_app

    routes = [r.path for r in create_app().routes if isinstance(r, APIRoute) and "GET" in r.methods]
    assert routes, "the plugin's app has no GET route"
    return routes


FORGED = (
    {},
    {"Accept": "application/json"},
    {"Authorization": "Bearer not-a-token"},
    {"Cookie": "_token=not-a-token"},
)


def assert_refused(url: str, secret: str = "primary") -> None:
    """``url`` refuses anonymous and forged requests (401/403) and shows them nothing."""
    for headers in FORGED:
        status, body, _ = fetch(url, headers)
        assert status in (401, 403), (url, headers, status, body[:200])
        assert secret not in body, f"a refused request to {url} saw {secret!r}"


def artefacts_dir(tmp_path: Path) -> Path:
    base = os.environ.get("MIRRORFLOW_TEST_ARTEFACTS")
    folder = Path(base) / "ui" if base else tmp_path / "artefacts"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"UI screenshots in {folder}")
    return folder


def require_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run scripts/bootstrap.sh as root (it installs Debian's "
            "chromium package for this browser test)"
        )


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """Debian's Chromium, headless, driven by Playwright (never a downloaded browser)."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            browser.close()


def goto(page, url: str, attempts: int = 3) -> None:
    """``page.goto(url)``, once more when the page's own reload aborted it. The Replication page
    reloads itself every few seconds (its meta refresh); a ``goto`` that starts as that reload
    does is cancelled by it (``net::ERR_ABORTED``, or "interrupted by another navigation")."""
    from playwright.sync_api import Error

    for attempt in range(1, attempts + 1):
        try:
            page.goto(url)
            return
        except Error as error:
            raced = "ERR_ABORTED" in str(error) or "interrupted by another navigation" in str(error)
            if not raced or attempt == attempts:
                raise


def login(browser, airflow: LocalAirflow, path: str, user: str, password: str):
    """A new page, logged in through Airflow's login page on the way to ``path`` (under the
    api-server, e.g. ``/mirrorflow/``), which it shows then."""
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    goto(page, f"http://127.0.0.1:{airflow.port}{path}")
    assert "/auth/login" in page.url, page.url
    page.locator('input[name="username"]').fill(user)
    page.locator('input[name="password"]').fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(".*" + re.escape(path.rstrip("/")) + "/?$"), timeout=30_000)
    return page


def trigger_with_buttons(page, dag_id: str, confirm: str, shot: Path | None = None):
    """Press the page's buttons of ``dag_id``: "Dry run" (triggers at once), then ``confirm``
    (e.g. "Fail over…") dismissed (nothing triggered) and accepted. Returns the two run ids."""
    actions = page.locator(f'#actions tr[data-dag="{dag_id}"]')
    answer = actions.locator(".answer")
    actions.get_by_role("button", name="Dry run").click()
    page.wait_for_function("e => e.dataset.runId", arg=answer.element_handle(), timeout=30_000)
    dry_run_id = answer.get_attribute("data-run-id")
    if shot is not None:
        page.screenshot(path=str(shot), full_page=True)
    page.once("dialog", lambda dialog: dialog.dismiss())
    actions.get_by_role("button", name=confirm).click()
    page.wait_for_function("e => e.textContent === 'not triggered'", arg=answer.element_handle())
    page.once("dialog", lambda dialog: dialog.accept())
    actions.get_by_role("button", name=confirm).click()
    page.wait_for_function(
        "([e, old]) => e.dataset.runId && e.dataset.runId !== old",
        arg=[answer.element_handle(), dry_run_id],
        timeout=30_000,
    )
    return dry_run_id, answer.get_attribute("data-run-id")


def api_call(airflow: LocalAirflow, method: str, path: str, token: str, body=None):
    """(status, JSON) of a call to Airflow's REST API with ``token``."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{airflow.port}{path}",
        json.dumps(body).encode() if body is not None else None,
        {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def token_of(airflow: AirflowWithViewer, user: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{airflow.port}/auth/token",
        json.dumps({"username": user, "password": airflow.password_of(user)}).encode(),
        {"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["access_token"]


def runs_of(airflow: LocalAirflow, token: str, dag_id: str) -> dict[str, dict]:
    status, reply = api_call(airflow, "GET", f"/api/v2/dags/{dag_id}/dagRuns", token)
    assert status == 200, reply
    return {r["dag_run_id"]: r for r in reply["dag_runs"]}
