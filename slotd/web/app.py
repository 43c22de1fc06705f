"""The dashboard as an ASGI application (Starlette routes, Jinja2 templates): standalone
under `slotd dashboard`, or mounted in the user's own FastAPI/Starlette app."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import psycopg
from psycopg_pool import ConnectionPool
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
from slotd.web import pages
from slotd.web.security import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    audit,
    csrf_ok,
    csrf_token,
    identify,
    session_value,
)
from slotd.web.settings import DashboardSettings

HERE = Path(__file__).resolve().parent
RETRY_BATCH = 1000
PURGE_BATCH = 5000
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


class Dashboard:
    """One database pool, the settings, the templates; opened on the first request so a
    mounted app needs no lifespan hook from its host."""

    def __init__(self, database_url: str, settings: DashboardSettings) -> None:
        self.url = database_url
        self.settings = settings
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every page, every value: payloads and errors are user data
            undefined=jinja2.StrictUndefined,
        )
        env.filters["ago"] = _ago
        self.templates = Jinja2Templates(env=env)
        self._pool: ConnectionPool[Any] | None = None
        self._lock = threading.Lock()

    def pool(self) -> ConnectionPool[Any]:
        with self._lock:
            if self._pool is None:
                timeout = self.settings.statement_timeout
                self._pool = ConnectionPool(
                    self.url,
                    min_size=1,
                    max_size=4,
                    kwargs={"autocommit": True, "application_name": "slotd dashboard"},
                    configure=lambda conn: DashboardReads.prepare(conn, timeout),
                    open=True,
                    timeout=10,
                )
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def read(self, fn: Callable[[DashboardReads], Any]) -> Any:
        with self.pool().connection() as conn:
            return fn(DashboardReads(conn))

    def write(self, fn: Callable[[Repository], Any]) -> Any:
        with self.pool().connection() as conn:
            return fn(Repository(conn))

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.setdefault("who", getattr(request.state, "who", None))
        context.update(
            base=_base(request),
            csrf=csrf_token(request),
            actions=self.settings.actions,
            page=name.removesuffix(".html"),
        )
        return self.templates.TemplateResponse(request, name, context, status_code=status)


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


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
        return RedirectResponse(f"{_base(request)}/login?{query}", status_code=303)
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
            path=_base(request) or "/",
        )
    return response


def create_app(
    database_url: str | None = None,
    *,
    settings: DashboardSettings | None = None,
) -> Starlette:
    """The dashboard. Without arguments it reads slotd's environment (SLOTD_DATABASE_URL,
    SLOTD_DASHBOARD_*), like `slotd dashboard`."""
    base_settings = Settings.from_env()
    url = database_url or db.primary_url(base_settings)
    settings = settings or DashboardSettings.from_env(lease_margin=base_settings.lease_margin)
    app = Dashboard(url, settings)

    async def overview(request: Request, who: str) -> Response:
        data = await run_in_threadpool(app.read, pages.overview)
        return app.render(request, "overview.html", **data)

    async def running(request: Request, who: str) -> Response:
        rows = await run_in_threadpool(
            app.read, lambda r: pages.running(r, app.settings.lease_margin)
        )
        return app.render(request, "running.html", rows=rows)

    async def task(request: Request, who: str) -> Response:
        task_id = request.path_params["task_id"]
        row = await run_in_threadpool(app.read, lambda r: pages.task(r, task_id))
        if row is None:
            return app.render(
                request,
                "error.html",
                404,
                message=f"no task {task_id}: it finished, was purged or never existed",
            )
        return app.render(request, "task.html", task=row)

    async def dead(request: Request, who: str) -> Response:
        task_type = _type_param(request.query_params.get("type"))
        query = request.query_params.get("q") or None
        data = await run_in_threadpool(app.read, lambda r: pages.dead(r, task_type, query))
        done = request.query_params.get("done")
        notice = _notice(done, request.query_params) if done else None
        return app.render(
            request, "dead.html", task_type=task_type, q=query or "", notice=notice, **data
        )

    async def schedules(request: Request, who: str) -> Response:
        data = await run_in_threadpool(app.read, pages.schedules)
        return app.render(request, "schedules.html", **data)

    async def action(request: Request, who: str) -> Response:
        form = await request.form()
        if not app.settings.actions:
            return app.render(
                request,
                "error.html",
                403,
                message="the dashboard is read-only: set SLOTD_DASHBOARD_ACTIONS=on to allow "
                "retry and purge",
            )
        if not csrf_ok(request, form):
            return app.render(
                request,
                "error.html",
                403,
                message="this form is stale or came from another site: reload the page and "
                "try again",
            )
        verb = str(form.get("action") or "")
        scope = str(form.get("scope") or "")
        try:
            ids = [int(str(v)) for v in form.getlist("id")]
            task_type = _type_param(str(form.get("type") or "") or None)
        except ValueError:
            return app.render(request, "error.html", 400, message="bad task id or type")
        if verb not in ("retry", "purge") or scope not in ("ids", "type"):
            return app.render(request, "error.html", 400, message="unknown action")
        if (scope == "ids" and not ids) or (scope == "type" and task_type is None):
            return app.render(request, "error.html", 400, message="select dead letters first")
        bulk = scope == "type" or len(ids) > 1
        if bulk and form.get("confirm") != "yes":
            count = (
                len(ids)
                if scope == "ids"
                else await run_in_threadpool(app.read, lambda r: r.dead_count(task_type))
            )
            return app.render(
                request,
                "confirm.html",
                verb=verb,
                scope=scope,
                ids=ids,
                task_type=task_type,
                count=count,
                cap=DashboardReads.COUNT_CAP,
            )
        selector = {"ids": ids} if scope == "ids" else {"task_type": task_type}
        if verb == "retry":
            done, left = await run_in_threadpool(app.write, lambda r: _retry(r, **selector))
        else:
            done, left = await run_in_threadpool(app.write, lambda r: _purge(r, **selector)), 0
        what = f"ids:{','.join(map(str, ids))}" if scope == "ids" else f"type:{task_type}"
        audit(request, who, verb, what, done)
        back = {"done": verb, "n": str(done), "left": str(left)}
        if scope == "type" and task_type:
            back["type"] = task_type
        return RedirectResponse(f"{_base(request)}/dead?{urlencode(back)}", status_code=303)

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
        response = RedirectResponse(_base(request) + _next(request), status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            session_value(token),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=_base(request) or "/",
        )
        return _finish(request, response)

    routes = [
        Route("/", guarded(app, overview)),
        Route("/running", guarded(app, running)),
        Route("/tasks/{task_id:int}", guarded(app, task)),
        Route("/dead", guarded(app, dead)),
        Route("/dead/action", guarded(app, action), methods=["POST"]),
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


def _next(request: Request) -> str:
    target = request.query_params.get("next") or "/"
    # Only a path of ours: never an open redirect to another site.
    return target if target.startswith("/") and not target.startswith("//") else "/"


def _notice(done: str, params: Any) -> str:
    n = int(params.get("n") or 0) if str(params.get("n") or "0").isdigit() else 0
    left = int(params.get("left") or 0) if str(params.get("left") or "0").isdigit() else 0
    verb = {"retry": "retried", "purge": "purged"}.get(done, "changed")
    text = f"{verb} {n} dead letter{'s' if n != 1 else ''}"
    if left:
        text += f"; {left} left dead: a live task with the same key already exists"
    return text


def _retry(repo: Repository, **selector: Any) -> tuple[int, int]:
    done = 0
    while True:
        batch = repo.dead_retry_batch(batch=RETRY_BATCH, **selector)
        done += len(batch)
        if len(batch) < RETRY_BATCH:
            break
    return done, repo.dead_count(**selector) if selector.get("ids") else 0


def _purge(repo: Repository, **selector: Any) -> int:
    done = 0
    while True:
        count = repo.dead_purge_batch(batch=PURGE_BATCH, **selector)
        done += count
        if count < PURGE_BATCH:
            return done
