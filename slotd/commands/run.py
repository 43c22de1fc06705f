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
from slotd.registry import load_registry

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
    from slotd.faults import Injector

    faults = Injector.from_settings(settings)  # refuses unless SLOTD_ALLOW_FAULTS=1
    write_url = db.primary_url(settings)
    read_url = db.read_url(settings, write_url)
    if not settings.database_url:
        log.warning(
            "running on the embedded development database; set SLOTD_DATABASE_URL for production"
        )
    _check_schema(write_url)
    from slotd.supervisor import Supervisor

    code = Supervisor(app, registry, settings, write_url, read_url, faults).run()
    sys.exit(code)


def _check_schema(url: str) -> None:
    """A missing schema is a usage error, said once; a database that is down is not: the
    supervisor waits for it."""
    try:
        with db.connect(url, role="slotd run", connect_timeout=5) as conn:
            present = repository.schema_present(conn)
    except psycopg.OperationalError:
        return
    if not present:
        raise ConfigError("the database has no slotd schema: run `slotd migrate` first")


def register(group: click.Group) -> None:
    group.add_command(run)
