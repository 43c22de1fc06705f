"""Which database, and connections to it: URLs resolved once, secrets never printed."""

from __future__ import annotations

import logging
import random
import re
import weakref
from typing import Any

import psycopg

from slotd import proc, repository
from slotd.config import Settings
from slotd.errors import ConfigError

log = logging.getLogger("slotd.db")

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
    from slotd.dev import embedded

    return embedded.ensure(settings)


def existing_url(settings: Settings) -> str:
    """For commands that read or tidy existing work (status, dead letters, cleanup): the
    configured database, or the embedded one if it is running. Never initdb's or starts a
    server just to report that it holds nothing."""
    if settings.database_url:
        return _checked(settings.database_url)
    from slotd.dev import embedded

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


def listen_url(settings: Settings, primary: str) -> str:
    """Where LISTEN goes: SLOTD_DATABASE_URL_LISTEN, else the primary URL. Behind a
    transaction-mode pooler this must be a direct connection: LISTEN belongs to a server
    session, and a pool hands that session to other clients between statements."""
    return _checked(settings.database_url_listen) if settings.database_url_listen else primary


def _checked(url: str) -> str:
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"bad database URL {redact(url)!r}: {redact(str(exc))}") from None
    return url


class Reconnect:
    """How long to wait before the next connection attempt: doubling from `first` to
    `cap`, each wait drawn between half and all of it. Capped at seconds, not half a
    minute: after a failover the new primary should be serving within a few seconds of
    accepting connections, not at the end of a long backoff; jittered so that every slot
    and supervisor of a fleet cut off at the same instant does not come back in step."""

    def __init__(self, first: float = 0.25, cap: float = 3.0) -> None:
        self.first, self.cap = first, cap
        self.ceiling = first

    def next(self) -> float:
        delay = random.uniform(self.ceiling / 2, self.ceiling)
        self.ceiling = min(self.ceiling * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.ceiling = self.first


PREPARE_MODES = ("auto", "on", "off")
PREPARE_ADVICE = (
    "server-side prepared statements failed ({error}): this connection goes through a "
    "transaction-mode pooler that cannot carry them (PgBouncer before 1.21); set "
    "SLOTD_PREPARE=off"
)
_said_pooled = False
_pooled: weakref.WeakKeyDictionary[psycopg.Connection[Any], bool] = weakref.WeakKeyDictionary()


def connect_params(role: str = "slotd", **kwargs: Any) -> dict[str, Any]:
    """The connection parameters of every slotd connection: autocommit, TCP keepalives
    (a dead peer is noticed in seconds rather than at the kernel's two-hour default), a
    connect timeout, the role as application_name. For a pool of them (the dashboard's)
    as for one."""
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
    return params


def configure(conn: psycopg.Connection[Any], prepare: str) -> None:
    """Once per new connection (one of `connect`'s, or of a pool's): `prepare`
    (SLOTD_PREPARE): `on` keeps psycopg's automatic server-side prepared statements, `off`
    never prepares, `auto` prepares unless the connection goes through a pooler (see
    `pooled`), where a prepared statement would outlive the server session it was made on;
    and READ COMMITTED whatever the server's default (see `_read_committed`)."""
    if prepare == "off" or (prepare == "auto" and _auto_unprepared(conn)):
        conn.prepare_threshold = None
    _read_committed(conn, prepare)


def connect(
    url: str, *, role: str = "slotd", prepare: str = "auto", **kwargs: Any
) -> psycopg.Connection[Any]:
    """An autocommit connection (see `connect_params`), prepared statements as `prepare`
    says, at READ COMMITTED (see `configure`)."""
    conn = proc.track(psycopg.connect(url, **connect_params(role, **kwargs)))
    configure(conn, prepare)
    return conn


def _read_committed(conn: psycopg.Connection[Any], prepare: str) -> None:
    """slotd's transactions run at READ COMMITTED whatever the database's, role's or
    pooler's default: the limits' claim relies on it (sql/queries.sql,
    read_committed_session). An explicit transaction says so in its BEGIN (psycopg sends
    the connection's isolation level with it); the implicit ones of an autocommit
    pipeline get it from the session on a direct connection, set here once, and behind a
    transaction-mode pooler from the write's own SET LOCAL (Repository)."""
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    try:
        if session_is_ours(conn, prepare):
            repository.read_committed_session(conn)
    except BaseException:
        conn.close()
        raise


def _auto_unprepared(conn: psycopg.Connection[Any]) -> bool:
    global _said_pooled
    try:
        behind = pooled(conn)
    except BaseException:
        conn.close()
        raise
    if behind and not _said_pooled:
        _said_pooled = True
        log.info("connected through a pooler: server-side prepared statements are off")
    return behind


def pooled(conn: psycopg.Connection[Any]) -> bool:
    """Whether a pooler sits between us and the server. A pooler answers the startup
    itself and hands the client a cancel key of its own making (it must route cancels to
    whichever server connection is busy), so the backend pid the client was told differs
    from the pid of the server process running our statements. A plain TCP forwarder
    relays the server's own key and is, rightly, not a pooler. Asked once per connection."""
    known = _pooled.get(conn)
    if known is None:
        known = _pooled[conn] = repository.backend_pid(conn) != conn.info.backend_pid
    return known


def session_is_ours(conn: psycopg.Connection[Any], prepare: str) -> bool:
    """Whether settings made on this connection's session stay with our statements: a
    direct connection, and not one the operator declared pooled (SLOTD_PREPARE=off is what
    a transaction-mode pooler needs, so it is taken as that pooler's sign too)."""
    return prepare != "off" and not pooled(conn)


def is_prepare_error(exc: BaseException) -> bool:
    """The errors a transaction-mode pooler produces for statements prepared on another
    server session: what the slot turns into a loud stop instead of a crash loop."""
    errors = psycopg.errors
    return isinstance(exc, errors.DuplicatePreparedStatement | errors.InvalidSqlStatementName)
