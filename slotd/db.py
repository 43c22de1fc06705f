"""Which database, and connections to it: URLs resolved once, secrets never printed."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from slotd import proc
from slotd.config import Settings
from slotd.errors import ConfigError

_PASSWORD_IN_URL = re.compile(r"(://[^:/@]*:)([^@]*)(@)")
_PASSWORD_PARAM = re.compile(r"(password=)(\S+)", re.I)


def redact(text: str) -> str:
    """Hide a password in a URL, a conninfo string or an error message quoting either."""
    if "@" not in text and "=" not in text:  # the common log line: nothing to hide, fast
        return text
    return _PASSWORD_PARAM.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***\3", text))


def first_line(exc: BaseException) -> str:
    """An error as one redacted line: what logs and the command line print."""
    text = str(exc).strip()
    return redact(text.splitlines()[0] if text else type(exc).__name__)


def primary_url(settings: Settings) -> str:
    """SLOTD_DATABASE_URL, else DATABASE_URL, else the embedded development server."""
    if settings.database_url:
        return _checked(settings.database_url)
    from slotd import embedded

    return embedded.ensure(settings)


def existing_url(settings: Settings) -> str:
    """For commands that read or tidy existing work (status, dead letters, cleanup): the
    configured database, or the embedded one if it is running. Never initdb's or starts a
    server just to report that it holds nothing."""
    if settings.database_url:
        return _checked(settings.database_url)
    from slotd import embedded

    url = embedded.running_url(settings)
    if url is None:
        raise ConfigError(
            "no database configured (set SLOTD_DATABASE_URL) and the embedded one is not "
            "running; `slotd migrate` or `slotd run` starts it"
        )
    return url


def read_url(settings: Settings, primary: str) -> str | None:
    """The read replica's URL, or None when discovery shares the primary."""
    return _checked(settings.database_url_read) if settings.database_url_read else None


def _checked(url: str) -> str:
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"bad database URL {redact(url)!r}: {redact(str(exc))}") from None
    return url


def connect(url: str, *, role: str = "slotd", **kwargs: Any) -> psycopg.Connection[Any]:
    """An autocommit connection with TCP keepalives, so a dead peer is noticed in seconds
    rather than at the kernel's two-hour default."""
    params: dict[str, Any] = {
        "autocommit": True,
        "connect_timeout": 10,
        "application_name": role[:63],
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    params.update(kwargs)
    return proc.track(psycopg.connect(url, **params))
