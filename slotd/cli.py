"""The `slotd` command line."""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import click
import psycopg

import slotd
from slotd import db
from slotd.config import Settings, parse_duration
from slotd.errors import ConfigError, SchemaNotMigrated, SlotdError
from slotd.upgrade import guard as upgrades
from slotd.upgrade.live import migrate_live


class SlotdGroup(click.Group):
    """Errors become one line on stderr: 2 for usage and configuration, 1 for the rest."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            # Redacted: it may quote a URL, or an application's own exception text.
            click.echo(f"slotd: {db.redact(str(exc))}", err=True)
            sys.exit(2)
        except click.UsageError as exc:
            click.echo(f"slotd: {exc.format_message()}", err=True)
            sys.exit(2)
        except SchemaNotMigrated as exc:
            click.echo(f"slotd: {exc}", err=True)
            sys.exit(2)
        except psycopg.Error as exc:
            first = db.first_line(exc)
            if upgrades.is_behind(exc):
                # Any command on an unmigrated or older schema: the fix, not the symptom.
                click.echo(
                    f"slotd: the database's slotd schema is missing or older than "
                    f"this slotd ({first}): {upgrades.ADVICE}",
                    err=True,
                )
                sys.exit(2)
            click.echo(f"slotd: database error: {first}", err=True)
            sys.exit(1)
        except SlotdError as exc:
            click.echo(f"slotd: {db.redact(str(exc))}", err=True)
            sys.exit(1)


def settings_from(ctx: click.Context) -> Settings:
    settings: Settings = ctx.obj
    return settings


@click.group(cls=SlotdGroup)
@click.version_option(slotd.__version__, prog_name="slotd")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default=None,
    help="How the log is written (default SLOTD_LOG_FORMAT, else text).",
)
@click.pass_context
def main(ctx: click.Context, log_format: str | None) -> None:
    """slotd: a durable PostgreSQL task queue and its worker daemon."""
    try:
        ctx.obj = Settings.from_env().with_(log_format=log_format)
    except ConfigError as exc:
        click.echo(f"slotd: {exc}", err=True)
        sys.exit(2)


@main.command()
@click.option(
    "--force",
    is_flag=True,
    help="Apply contract steps even while replicas older than they allow are alive.",
)
@click.option(
    "--lock-timeout",
    default="500ms",
    show_default=True,
    help="How long a step may wait for a table lock before the try is rolled back and "
    "retried (while it waits, the fleet's enqueues and claims on that table wait too).",
)
@click.option(
    "--wait",
    default="5m",
    show_default=True,
    help="How long to keep retrying a step that cannot take its lock; then exit 1, "
    "nothing applied, naming who holds slotd's tables (0s: one try).",
)
@click.pass_context
def migrate(ctx: click.Context, force: bool, lock_timeout: str, wait: str) -> None:
    """Create or upgrade the schema (safe to run twice, from two hosts at once, and under
    a live fleet: see the Upgrade guide)."""
    settings = settings_from(ctx)
    bound = parse_duration(lock_timeout, name="--lock-timeout")
    patience = parse_duration(wait, name="--wait")
    if bound <= timedelta(0):
        raise ConfigError("--lock-timeout must be more than 0")
    url = db.primary_url(settings)
    with db.connect(url, role="slotd migrate", prepare=settings.prepare) as conn:
        applied = migrate_live(
            conn,
            force=force,
            lock_timeout=bound,
            patience=patience,
            say=lambda line: click.echo(line, err=True),
        )
    click.echo(f"applied {', '.join(applied)}" if applied else "schema up to date")


def _register_commands() -> None:
    # Each command family lives in its own module under slotd/commands and exposes
    # register(group); the families that are not installed yet are simply absent.
    import importlib

    for name in (
        "run",
        "ops",
        "dead",
        "control",
        "schedules",
        "embedded",
        "examples",
        "dashboard",
        "results",
        "events",
        "tasks",
        "sequences",
    ):
        try:
            module = importlib.import_module(f"slotd.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"slotd.commands.{name}":
                continue
            raise
        module.register(main)


_register_commands()
