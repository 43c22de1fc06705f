"""What an operator may change from the dashboard: retry and purge dead letters, cancel live
tasks (one, or every live one of a type or a key), pause and resume a type.

Each is a POST, refused unless SLOTD_DASHBOARD_ACTIONS=on and the form carries the page's
CSRF token; anything that touches more than one task asks first, with a count; each is
written to the action log (who, from where, what, how many). Each calls what the command
line calls (slotd.control, the repository's dead-letter batches): one definition of what a
cancel or a pause does, whoever asks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from slotd import repository
from slotd.config import parse_duration
from slotd.errors import ConfigError
from slotd.producer import control
from slotd.producer.sequences import resume_sequence
from slotd.registry import validate_type_name
from slotd.repository import DashboardReads, Repository
from slotd.repository.sequences import NAME_MAX
from slotd.web.database import Database
from slotd.web.security import audit, back_path, base_path, csrf_ok
from slotd.web.settings import DashboardSettings


class Dashboard(Protocol):
    """What an action uses of the dashboard (web.app.Dashboard, which mounts these routes):
    its connections, its settings and its pages. A shape, so the actions stand below the app
    that mounts them instead of importing it."""

    database: Database
    settings: DashboardSettings

    def read(self, fn: Callable[[DashboardReads], Any]) -> Any: ...

    def write(self, fn: Callable[[Repository], Any]) -> Any: ...

    def render(
        self, request: Request, name: str, status: int = 200, **context: Any
    ) -> Response: ...


RETRY_BATCH = 1000
PURGE_BATCH = 5000
Handler = Callable[[Request, str], Awaitable[Response]]


def routes(app: Dashboard) -> list[tuple[str, Handler]]:
    async def dead_letters(request: Request, who: str) -> Response:
        form = await request.form()
        return _refused(app, request, form) or await _dead_letters(app, request, who, form)

    async def cancel_one(request: Request, who: str) -> Response:
        form = await request.form()
        if refused := _refused(app, request, form):
            return refused
        task_id = int(request.path_params["task_id"])
        done = await run_in_threadpool(_cancel, app, who, {"ids": [task_id]})
        audit(request, who, "cancel", f"ids:{task_id}", len(done))
        return _back(request, form, "cancel", n=len(done), running=_running(done))

    async def cancel_many(request: Request, who: str) -> Response:
        form = await request.form()
        return _refused(app, request, form) or await _cancel_many(app, request, who, form)

    async def pause(request: Request, who: str) -> Response:
        form = await request.form()
        if refused := _refused(app, request, form):
            return refused
        try:
            task_type = validate_type_name(str(form.get("type") or ""))
            until = _until(str(form.get("until") or "").strip())
        except (ValueError, ConfigError) as exc:
            return app.render(request, "error.html", 400, message=str(exc))
        await run_in_threadpool(_pause, app, task_type, until, _by(who))
        audit(request, who, "pause", f"type:{task_type}", 1)
        return _back(request, form, "pause", type=task_type, until=str(form.get("until") or ""))

    async def resume(request: Request, who: str) -> Response:
        form = await request.form()
        if refused := _refused(app, request, form):
            return refused
        try:
            task_type = validate_type_name(str(form.get("type") or ""))
        except ValueError as exc:
            return app.render(request, "error.html", 400, message=str(exc))
        was = await run_in_threadpool(_resume, app, task_type, _by(who))
        audit(request, who, "resume", f"type:{task_type}", int(was))
        return _back(request, form, "resume", type=task_type, n=int(was))

    async def resume_sequence(request: Request, who: str) -> Response:
        form = await request.form()
        if refused := _refused(app, request, form):
            return refused
        name = str(form.get("sequence") or "")
        if not name or len(name) > NAME_MAX or "\x00" in name:
            message = f"bad sequence: a name of 1 to {NAME_MAX} characters"
            return app.render(request, "error.html", 400, message=message)
        was = await run_in_threadpool(_resume_sequence, app, name)
        audit(request, who, "resume sequence", f"sequence:{name}", int(was))
        return _back(request, form, "resume_sequence", n=int(was))

    return [
        ("/dead/action", dead_letters),
        ("/tasks/{task_id:int}/cancel", cancel_one),
        ("/cancel", cancel_many),
        ("/types/pause", pause),
        ("/types/resume", resume),
        ("/sequences/resume", resume_sequence),
    ]


def _refused(app: Dashboard, request: Request, form: FormData) -> Response | None:
    if not app.settings.actions:
        return app.render(
            request,
            "error.html",
            403,
            message="the dashboard is read-only: set SLOTD_DASHBOARD_ACTIONS=on to allow "
            "its actions (retry, purge, cancel, pause, resume)",
        )
    if not csrf_ok(request, form):
        return app.render(
            request,
            "error.html",
            403,
            message="this form is stale or came from another site: reload the page and try again",
        )
    return None


def _by(who: str) -> str:
    # Recorded with the change (a cancel's reason, a pause's paused_by), as user@host is
    # for the command line.
    return f"{who}@dashboard"


def _until(text: str) -> timedelta | None:
    if not text:
        return None
    span = parse_duration(text, name="until")
    if span <= timedelta(0):
        raise ConfigError("bad until: it must be longer than 0s")
    return span


def _pause(app: Dashboard, task_type: str, until: timedelta | None, by: str) -> None:
    with app.database.changing() as conn:  # one short transaction, bounded
        control.pause(conn, task_type, until, by=by)


def _resume(app: Dashboard, task_type: str, by: str) -> bool:
    with app.database.changing() as conn:
        return control.resume(conn, task_type, by=by)


def _resume_sequence(app: Dashboard, name: str) -> bool:
    with app.database.changing() as conn:  # the halt cleared and the next made due, one lock
        return resume_sequence(conn, name)


def _cancel(app: Dashboard, who: str, selector: dict[str, Any]) -> list[repository.CancelledTask]:
    with app.database.primary() as conn:
        return control.cancel_matching(conn, by=_by(who), first=app.database.bound, **selector)


def _running(done: list[repository.CancelledTask]) -> int:
    return sum(1 for task in done if task.running)


async def _cancel_many(app: Dashboard, request: Request, who: str, form: FormData) -> Response:
    try:
        task_type = validate_type_name(str(form.get("type") or ""))
    except ValueError as exc:
        return app.render(request, "error.html", 400, message=str(exc))
    key = str(form.get("key") or "") or None
    if form.get("confirm") != "yes":
        count, running = await run_in_threadpool(app.read, lambda r: r.live_count(task_type, key))
        return app.render(
            request,
            "confirm_cancel.html",
            task_type=task_type,
            key=key,
            count=count,
            running=running,
            cap=DashboardReads.COUNT_CAP,
            back=back_path(request, str(form.get("back") or "")),
        )
    done = await run_in_threadpool(_cancel, app, who, {"task_type": task_type, "key": key})
    scope = f"type:{task_type}" + (f",key:{key}" if key is not None else "")
    audit(request, who, "cancel", scope, len(done))
    return _back(request, form, "cancel", n=len(done), running=_running(done), type=task_type)


async def _dead_letters(app: Dashboard, request: Request, who: str, form: FormData) -> Response:
    verb = str(form.get("action") or "")
    scope = str(form.get("scope") or "")
    try:
        ids = [int(str(v)) for v in form.getlist("id")]
        raw_type = str(form.get("type") or "")
        task_type = validate_type_name(raw_type) if raw_type else None
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
    return RedirectResponse(f"{base_path(request)}/dead?{urlencode(back)}", status_code=303)


def _retry(repo: Repository, **selector: Any) -> tuple[int, int]:
    """Until a batch revives nothing: a batch may revive fewer than it asked for and still
    leave work (of two dead letters of a key only one; a row another transaction holds)."""
    done = 0
    while batch := repo.dead_retry_batch(batch=RETRY_BATCH, **selector):
        done += len(batch)
    return done, repo.dead_count(**selector)


def _purge(repo: Repository, **selector: Any) -> int:
    done = 0
    while True:
        count = repo.dead_purge_batch(batch=PURGE_BATCH, **selector)
        done += count
        if count < PURGE_BATCH:
            return done


def _back(request: Request, form: FormData, done: str, **params: Any) -> Response:
    """Back to the page the form was on, which says what happened (see `notice`)."""
    path = back_path(request, str(form.get("back") or ""))
    path, _, _ = path.partition("?")
    query = urlencode({"done": done, **{k: str(v) for k, v in params.items()}})
    return RedirectResponse(f"{base_path(request)}{path}?{query}", status_code=303)


def notice(params: Any) -> str | None:
    """The line a page shows after an action redirected to it. Built from a verb and
    numbers, never from text in the URL: a crafted link cannot make the page say anything."""
    done = params.get("done")
    if not done:
        return None
    n, left, running = (_count(params.get(k)) for k in ("n", "left", "running"))
    try:
        task_type = validate_type_name(str(params.get("type") or "")) if params.get("type") else ""
    except ValueError:
        task_type = ""
    if done in ("retry", "purge"):
        text = f"{'retried' if done == 'retry' else 'purged'} {n} dead letter{_s(n)}"
        if left:
            text += f"; {left} left dead: a live task with the same key already exists"
        return text
    if done == "cancel":
        text = f"cancelled {n} task{_s(n)}"
        if running:
            text += f" ({running} running: their replicas stop them)"
        if not n:
            text += ": nothing live matched (finished, dead or already cancelled)"
        return text
    if done == "pause" and task_type:
        until = str(params.get("until") or "")
        try:
            span = parse_duration(until, name="until") if until else None
        except ConfigError:
            span = None
        return f"paused {task_type}" + (f" for {until}" if span else " until resumed")
    if done == "resume" and task_type:
        return f"resumed {task_type}" if n else f"{task_type} was not paused"
    if done == "resume_sequence":  # its name is not repeated from the URL: see above
        if n:
            return "resumed the sequence: its next task is due (the failed one stays dead)"
        return "the sequence was not halted: resumed already, or its failed task retried"
    return None


def _count(value: Any) -> int:
    text = str(value or "0")
    return int(text) if text.isdigit() else 0


def _s(n: int) -> str:
    return "" if n == 1 else "s"
