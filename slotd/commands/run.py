"""`slotd run`: the daemon."""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import timedelta

import click
import psycopg

from slotd import db, logs, repository
from slotd.config import Settings, format_duration
from slotd.errors import ConfigError
from slotd.registry import Registry, load_registry
from slotd.upgrade import guard as upgrades

log = logging.getLogger("slotd.run")


@click.command("run")
@click.option("--app", "app", envvar="SLOTD_APP", help="MODULE:ATTR naming a slotd.Registry")
@click.option("--slots", type=click.IntRange(min=1), default=None, help="slot processes (4)")
@click.option("--metrics-addr", default=None, help="host:port for /metrics, or 'off'")
@click.pass_context
def run(ctx: click.Context, app: str | None, slots: int | None, metrics_addr: str | None) -> None:
    """The supervisor with N slot processes, until SIGTERM."""
    settings: Settings = ctx.obj.with_(slots=slots, metrics_addr=metrics_addr)
    logs.configure(settings.log_format, role="supervisor")
    if not app:
        raise ConfigError("no application: pass --app MODULE:ATTR or set SLOTD_APP")
    sys.path.insert(0, os.getcwd())
    registry = load_registry(app)
    settings = _database_from_app(settings, registry)
    from slotd.dev.faults import Injector

    faults = Injector.from_settings(settings)  # refuses unless SLOTD_ALLOW_FAULTS=1
    write_url = db.primary_url(settings)
    read_url = db.read_url(settings, write_url)
    if not settings.database_url:
        from slotd.dev import embedded

        # The URL itself, for psql or the user's own application on the same database.
        log.warning(
            "running on the embedded development database %s (data in %s); "
            "set SLOTD_DATABASE_URL for production",
            write_url,
            embedded.data_dir(settings),
        )
    _check_schema(write_url, settings.start_wait)
    from slotd.supervisor.loop import Supervisor

    code = Supervisor(app, registry, settings, write_url, read_url, faults).run()
    sys.exit(code)


def _database_from_app(settings: Settings, registry: Registry) -> Settings:
    """The application's own database (Django's DATABASES) unless SLOTD_DATABASE_URL (or
    DATABASE_URL) is set; set and naming another database, it wins with a warning, so the
    worker never drains one database silently while the tasks wait in another."""
    own = registry.database_url
    if not own:
        return settings
    if not settings.database_url:
        return settings.with_(database_url=own)
    if _where(settings.database_url) != _where(own):
        log.warning(
            "SLOTD_DATABASE_URL (%s) names another database than the application's (%s); "
            "draining SLOTD_DATABASE_URL",
            db.redact(settings.database_url),
            db.redact(own),
        )
    return settings


def _where(url: str) -> tuple[str | None, ...]:
    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return (url,)
    return tuple(str(parts.get(k) or "") or None for k in ("host", "port", "dbname"))


def _check_schema(url: str, patience: timedelta) -> None:
    """A missing or older schema is a usage error, said once before any slot starts (not
    a slot's first statement failing, over and over). So is a database that cannot be
    reached at start once SLOTD_START_WAIT has passed (a mistyped URL retried for ever was
    121 warnings in 40 s and no exit), or at once when it refuses us (a wrong password, no
    such database): retrying cannot fix those. A database that goes away after the start
    is waited out for ever, by every component on its own."""
    backoff = db.Reconnect()
    give_up = time.monotonic() + patience.total_seconds()
    said = False
    while True:
        try:
            with db.connect(url, role="slotd run", connect_timeout=5) as conn:
                present = repository.schema_present(conn)
                lacking = repository.unapplied_migrations(conn) if present else []
            break
        except psycopg.OperationalError as exc:
            delay = backoff.next()
            if _refused(exc):
                raise ConfigError(
                    f"the database {db.redact(url)} refused slotd: {db.first_line(exc)} "
                    "(check SLOTD_DATABASE_URL)"
                ) from None
            if time.monotonic() + delay > give_up:
                raise ConfigError(
                    f"cannot reach the database {db.redact(url)}: {db.first_line(exc)} "
                    f"(check SLOTD_DATABASE_URL; waited {format_duration(patience)}, "
                    "SLOTD_START_WAIT)"
                ) from None
            if not said:  # one line while it waits, not one per try
                said = True
                log.warning(
                    "database unreachable at start (%s); trying for up to %s (SLOTD_START_WAIT)",
                    db.first_line(exc),
                    format_duration(patience),
                )
            time.sleep(delay)
    if not present:
        raise ConfigError("the database has no slotd schema: run `slotd migrate` first")
    if lacking:
        raise ConfigError(upgrades.behind_message(lacking))


# What libpq says when the server answered and refused us (a connection failure carries no
# SQLSTATE): a wrong password or user, no pg_hba.conf entry, no such database or role. A
# server translated to another language falls back to the wait, then the same exit.
_REFUSALS = ("authentication failed", "no pg_hba.conf entry", "does not exist")


def _refused(exc: psycopg.OperationalError) -> bool:
    """The server answered and said no: retrying cannot help. Not a server still starting
    (57P03), nor nothing listening, nor a name that does not resolve yet."""
    state = exc.sqlstate or ""
    return state.startswith("28") or state == "3D000" or any(r in str(exc) for r in _REFUSALS)


def register(group: click.Group) -> None:
    group.add_command(run)
