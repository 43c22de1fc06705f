"""`slotd run`: the daemon."""

from __future__ import annotations

import logging
import os
import sys

import click
import psycopg

from slotd import db, logs, repository
from slotd.config import Settings
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
        from slotd import embedded

        # The URL itself, for psql or the user's own application on the same database.
        log.warning(
            "running on the embedded development database %s (data in %s); "
            "set SLOTD_DATABASE_URL for production",
            write_url,
            embedded.data_dir(settings),
        )
    _check_schema(write_url)
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


def _check_schema(url: str) -> None:
    """A missing or older schema is a usage error, said once before any slot starts (not
    a slot's first statement failing, over and over); a database that is down is not:
    the supervisor waits for it."""
    try:
        with db.connect(url, role="slotd run", connect_timeout=5) as conn:
            present = repository.schema_present(conn)
            lacking = repository.unapplied_migrations(conn) if present else []
    except psycopg.OperationalError:
        return
    if not present:
        raise ConfigError("the database has no slotd schema: run `slotd migrate` first")
    if lacking:
        raise ConfigError(upgrades.behind_message(lacking))


def register(group: click.Group) -> None:
    group.add_command(run)
