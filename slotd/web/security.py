"""Who is asking, and whether a form really came from our page: token or basic auth,
double-submit CSRF, and the action log."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from typing import Any

from starlette.requests import Request

from slotd.web.settings import DashboardSettings

log = logging.getLogger("slotd.dashboard")

SESSION_COOKIE = "slotd_dashboard"
CSRF_COOKIE = "slotd_csrf"


def session_value(token: str) -> str:
    """What the login cookie holds: derived from the token, so the token itself never sits
    in a cookie, and changing the token logs everyone out."""
    return hmac.new(token.encode(), b"slotd-dashboard-session", hashlib.sha256).hexdigest()


def identify(request: Request, settings: DashboardSettings) -> str | None:
    """The caller's name for the action log, or None when they are not let in."""
    if not settings.authenticated:
        user = request.scope.get("user")  # a host application's own authentication
        name = getattr(user, "display_name", None) or getattr(user, "username", None)
        return str(name) if name else "anonymous"
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if settings.token:
        if scheme.lower() == "bearer" and _same(value.strip(), settings.token):
            return "token"
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and _same(cookie, session_value(settings.token)):
            return "token"
    if settings.basic_user and scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        # Both compared, always, so the time taken says nothing about which was wrong.
        ok_user = _same(user, settings.basic_user)
        ok_password = _same(password, settings.basic_password or "")
        if ok_user and ok_password:
            return user
    return None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def csrf_token(request: Request) -> str:
    """The page's form token: the caller's CSRF cookie, or a new one set on the response."""
    token = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "new_csrf", None)
    if not token:
        token = secrets.token_urlsafe(32)
        request.state.new_csrf = token
    return token


def csrf_ok(request: Request, form: Any) -> bool:
    """Double submit: another site can make a browser send our cookie, but cannot read it
    to put it in the form. Origin, when the browser sends it, must be our own."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = str(form.get("csrf") or "")
    if not cookie or not sent or not _same(cookie, sent):
        return False
    origin = request.headers.get("origin")
    if origin and origin != "null":
        host = request.headers.get("host", "")
        return origin.split("://", 1)[-1] == host
    return True


def base_path(request: Request) -> str:
    """Where the dashboard is mounted ('' standalone): every link and cookie path starts here."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def back_path(request: Request, wanted: str | None) -> str:
    """A path of ours to return to after an action: never an open redirect elsewhere."""
    target = wanted or "/"
    base = base_path(request)
    if base and target.startswith(base + "/"):
        target = target[len(base) :]
    return target if target.startswith("/") and not target.startswith("//") else "/"


def audit(request: Request, who: str, action: str, scope: str, count: int) -> None:
    client = request.client.host if request.client else "-"
    log.info(
        "dashboard action: who=%s from=%s action=%s scope=%s count=%d",
        who,
        client,
        action,
        scope,
        count,
    )
