"""The `slotd` command line."""

from __future__ import annotations

import sys
from typing import Any

import click
import psycopg

import slotd
from slotd import db, upgrades
from slotd.config import Settings
from slotd.errors import ConfigError, SchemaNotMigrated, SlotdError
from slotd.repository import migrate as run_migrations


class SlotdGroup(click.Group):
    """Errors become one line on stderr: 2 for usage and configuration, 1 for the rest."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            click.echo(f"slotd: {exc}", err=True)
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
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None)
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
@click.pass_context
def migrate(ctx: click.Context, force: bool) -> None:
    """Create or upgrade the schema (safe to run twice, and from two hosts at once)."""
    settings = settings_from(ctx)
    url = db.primary_url(settings)
    with db.connect(url, role="slotd migrate", prepare=settings.prepare) as conn:
        applied = run_migrations(conn, force=force)
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
    ):
        try:
            module = importlib.import_module(f"slotd.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"slotd.commands.{name}":
                continue
            raise
        module.register(main)


_register_commands()
