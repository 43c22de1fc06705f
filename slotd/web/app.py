"""The dashboard as an ASGI application (Starlette routes, Jinja2 templates): standalone
under `slotd dashboard`, or mounted in the user's own FastAPI/Starlette app."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import psycopg
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from slotd import db
from slotd.config import Settings
from slotd.registry import validate_type_name
from slotd.repository import DashboardReads, Repository
from slotd.repository.states import STATES, validate_state
from slotd.web import actions, charts, formats, graphs, listings, pages
from slotd.web.database import Database
from slotd.web.security import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    back_path,
    base_path,
    csrf_ok,
    csrf_token,
    identify,
    session_value,
)
from slotd.web.settings import DashboardSettings

HERE = Path(__file__).resolve().parent
# Scripts and styles only from our own /static: an injected <script> would not run even
# if escaping ever failed. No framing (clickjacking a retry button), no referrer leaks.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}

Handler = Callable[[Request, str], Awaitable[Response]]
# The header static/dashboard.js sends when it asks for a page's live parts again.
LIVE_HEADER = "x-slotd-live"
# How many pages' live reads are kept for sharing (a page is its path and query).
LIVE_PAGES = 64


class Dashboard:
    """The database's connections, the settings, the templates."""

    def __init__(self, database: Database, settings: DashboardSettings) -> None:
        self.database = database
        self.settings = settings
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every page, every value: payloads and errors are user data
            undefined=jinja2.StrictUndefined,
        )
        env.filters.update(formats.FILTERS)
        self.templates = Jinja2Templates(env=env)
        self._shared: dict[str, tuple[float, Any]] = {}
        self._shared_lock = threading.Lock()

    def close(self) -> None:
        self.database.close()

    def read(self, fn: Callable[[DashboardReads], Any]) -> Any:
        with self.database.reading() as conn:
            return fn(DashboardReads(conn))

    def read_live(self, page: str, fn: Callable[[DashboardReads], Any]) -> Any:
        """A page's data for a live update: asks for the same page (path and query) within
        half the refresh interval share one read, so the database's cost is bounded per
        page shown, not per open tab: at most one page's statements each half interval.
        Only the data is shared, never the rendered page (it carries the viewer's CSRF
        token); a full load always reads afresh (it follows an action)."""
        refresh = self.settings.refresh
        if refresh is None:
            return self.read(fn)
        now = time.monotonic()
        with self._shared_lock:
            kept = self._shared.get(page)
        if kept is not None and now - kept[0] < refresh.total_seconds() / 2:
            return kept[1]
        data = self.read(fn)
        with self._shared_lock:
            self._shared[page] = (now, data)
            while len(self._shared) > LIVE_PAGES:  # the oldest go first
                del self._shared[min(self._shared, key=lambda k: self._shared[k][0])]
        return data

    async def load(self, request: Request, fn: Callable[[DashboardReads], Any]) -> Any:
        """What a page reads, off the event loop: shared when it is a live update."""
        if request.headers.get(LIVE_HEADER) == "1":
            page = request.url.path + "?" + request.url.query
            return await run_in_threadpool(self.read_live, page, fn)
        return await run_in_threadpool(self.read, fn)

    def write(self, fn: Callable[[Repository], Any]) -> Any:
        with self.database.primary() as conn:
            return fn(Repository(conn))

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.setdefault("who", getattr(request.state, "who", None))
        context.setdefault("notice", actions.notice(request.query_params))
        refresh = self.settings.refresh
        context.update(
            # A live update gets the page's <main> only: the script takes its live parts.
            fragment=request.headers.get(LIVE_HEADER) == "1",
            refresh_ms=int(refresh.total_seconds() * 1000) if refresh else 0,
            base=base_path(request),
            csrf=csrf_token(request),
            actions=self.settings.actions,
            page=name.removesuffix(".html"),
        )
        return self.templates.TemplateResponse(request, name, context, status_code=status)


def guarded(app: Dashboard, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Authentication, the database's errors as a page, and the headers every response
    carries."""

    async def endpoint(request: Request) -> Response:
        who = identify(request, app.settings)
        if who is None:
            response = _refuse(app, request)
        else:
            request.state.who = who
            try:
                response = await handler(request, who)
            except ValueError as exc:  # a bad type name or page cursor in the query string
                response = app.render(request, "error.html", 400, message=str(exc))
            except psycopg.Error as exc:
                # One redacted line: never a URL, a password or a traceback of ours.
                response = app.render(
                    request, "error.html", 503, message=f"database error: {db.first_line(exc)}"
                )
        return _finish(request, response)

    return endpoint


def _refuse(app: Dashboard, request: Request) -> Response:
    if request.method == "GET" and app.settings.token and not app.settings.basic_user:
        query = urlencode({"next": request.url.path})
        return RedirectResponse(f"{base_path(request)}/login?{query}", status_code=303)
    headers = {}
    if app.settings.basic_user:
        headers["www-authenticate"] = 'Basic realm="slotd dashboard", charset="UTF-8"'
    return Response("authentication required\n", 401, headers=headers, media_type="text/plain")


def _finish(request: Request, response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    new = getattr(request.state, "new_csrf", None)
    if new:
        response.set_cookie(
            CSRF_COOKIE,
            new,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=base_path(request) or "/",
        )
    return response


def create_app(
    database_url: str | None = None,
    *,
    read_url: str | None = None,
    settings: DashboardSettings | None = None,
) -> Starlette:
    """The dashboard. Without arguments it reads slotd's environment (SLOTD_DATABASE_URL,
    SLOTD_DATABASE_URL_READ, SLOTD_PREPARE, SLOTD_DASHBOARD_*), like `slotd dashboard`.
    `read_url`: where its pages read (a replica); its actions always go to the primary."""
    base_settings = Settings.from_env()
    url = database_url or db.primary_url(base_settings)
    if read_url is None and database_url is None:
        read_url = db.read_url(base_settings, url)
    settings = settings or DashboardSettings.from_env(lease_margin=base_settings.lease_margin)
    database = Database(
        url, read_url, prepare=base_settings.prepare, statement_timeout=settings.statement_timeout
    )
    app = Dashboard(database, settings)

    async def overview(request: Request, who: str) -> Response:
        window = charts.window_named(request.query_params.get("window"))
        data = await app.load(request, lambda r: pages.overview(r, window))
        return app.render(request, "overview.html", **data)

    async def task_type(request: Request, who: str) -> Response:
        name = validate_type_name(request.path_params["task_type"])
        window = charts.window_named(request.query_params.get("window"))
        data = await app.load(request, lambda r: pages.task_type(r, name, window))
        return app.render(request, "type.html", **data)

    async def running(request: Request, who: str) -> Response:
        rows = await app.load(request, lambda r: pages.running(r, app.settings.lease_margin))
        return app.render(request, "running.html", rows=rows)

    async def task(request: Request, who: str) -> Response:
        task_id = request.path_params["task_id"]
        before = _count_param(request, "attempts_before", 1)
        steps_from = _count_param(request, "steps_from", 0) or 0
        row = await app.load(request, lambda r: pages.task(r, task_id, before, steps_from))
        if row is None:
            return app.render(
                request,
                "error.html",
                404,
                message=f"no task {task_id}: it finished, was purged or never existed",
            )
        drawn = graphs.task_graph(
            {"id": row["id"], "task_type": row.get("task_type"), "state": row["graph_state"]},
            row["neighbours"],
            base_path(request),
        )
        return app.render(request, "task.html", task=row, task_graph=drawn)

    async def batch(request: Request, who: str) -> Response:
        batch_id = request.path_params["batch_id"]
        found = await app.load(request, lambda r: pages.batch(r, batch_id))
        if found is None:
            message = f"no batch {batch_id}: it was pruned (batch retention) or never existed"
            return app.render(request, "error.html", 404, message=message)
        drawn = graphs.batch_graph(found, base_path(request))
        return app.render(request, "batch.html", batch=found, batch_graph=drawn)

    async def dead(request: Request, who: str) -> Response:
        search, after = _search(request)
        data = await run_in_threadpool(app.read, lambda r: listings.dead(r, search, after))
        return app.render(
            request, "dead.html", task_type=search.task_type, q=search.query or "",
            error=search.error or "", **data,
        )  # fmt: skip

    async def tasks(request: Request, who: str) -> Response:
        search, after = _search(request)
        data = await run_in_threadpool(app.read, lambda r: listings.tasks(r, search, after))
        return app.render(
            request, "tasks.html", task_type=search.task_type, q=search.query or "",
            state=search.state or "", tag=search.tag or "", states=STATES, **data,
        )  # fmt: skip

    async def schedules(request: Request, who: str) -> Response:
        data = await run_in_threadpool(app.read, pages.schedules)
        return app.render(request, "schedules.html", **data)

    async def login_form(request: Request) -> Response:
        return _finish(request, app.render(request, "login.html", next=_next(request), error=""))

    async def login(request: Request) -> Response:
        form = await request.form()
        token = app.settings.token
        if not token or not csrf_ok(request, form):
            return _finish(
                request,
                app.render(
                    request,
                    "login.html",
                    403,
                    next=_next(request),
                    error="reload the page and try again",
                ),
            )
        import hmac

        if not hmac.compare_digest(str(form.get("token") or "").encode(), token.encode()):
            return _finish(
                request,
                app.render(request, "login.html", 401, next=_next(request), error="wrong token"),
            )
        response = RedirectResponse(base_path(request) + _next(request), status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            session_value(token),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=base_path(request) or "/",
        )
        return _finish(request, response)

    routes = [
        Route("/", guarded(app, overview)),
        Route("/running", guarded(app, running)),
        Route("/types/{task_type}", guarded(app, task_type)),
        Route("/batches/{batch_id:int}", guarded(app, batch)),
        Route("/tasks/{task_id:int}", guarded(app, task)),
        Route("/dead", guarded(app, dead)),
        Route("/tasks", guarded(app, tasks)),
        *[Route(path, guarded(app, fn), methods=["POST"]) for path, fn in actions.routes(app)],
        Route("/schedules", guarded(app, schedules)),
        Route("/login", login_form),
        Route("/login", login, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    starlette = Starlette(routes=routes)
    starlette.state.dashboard = app
    return starlette


def _type_param(value: str | None) -> str | None:
    return validate_type_name(value) if value else None


def _count_param(request: Request, name: str, least: int) -> int | None:
    """A whole number from the query string (a page's place), None when absent; anything
    else is a 400 page."""
    text = request.query_params.get(name)
    if not text:
        return None
    if not text.isdigit() or int(text) < least or len(text) > 18:
        raise ValueError(f"bad {name} {text!r}: follow the page's own links")
    return int(text)


def _search(request: Request) -> tuple[listings.Search, listings.Cursor | None]:
    """A listing's search and page from its query string; bad values are a 400 page."""
    params = request.query_params
    state = (params.get("state") or "").strip() or None
    search = listings.Search(
        task_type=_type_param(params.get("type")),
        query=(params.get("q") or "").strip() or None,
        error=(params.get("error") or "").strip() or None,
        state=validate_state(state) if state else None,
        tag=(params.get("tag") or "").strip() or None,
    )
    return search, listings.parse_cursor(params.get("after"))


def _next(request: Request) -> str:
    return back_path(request, request.query_params.get("next"))
