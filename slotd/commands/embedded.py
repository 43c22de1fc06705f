"""`slotd embedded status|stop`: the private local PostgreSQL used when no database URL is set."""

from __future__ import annotations

import json

import click

from slotd.config import Settings
from slotd.dev import embedded as embedded_pg


@click.group("embedded")
def embedded() -> None:
    """The embedded development PostgreSQL (used when SLOTD_DATABASE_URL is not set)."""


@embedded.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def status_command(ctx: click.Context, as_json: bool) -> None:
    """Where the embedded server keeps its data and whether it is running."""
    settings: Settings = ctx.obj
    info = embedded_pg.status(settings)
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    state = f"running (pid {info['pid']})" if info["running"] else "not running"
    click.echo(f"embedded PostgreSQL: {state}")
    for key in ("home", "data_dir", "socket_dir", "log_file", "url", "server_user"):
        click.echo(f"  {key.replace('_', ' ')}: {info[key]}")
    if settings.database_url:
        click.echo("  (not in use: SLOTD_DATABASE_URL / DATABASE_URL is set)")


@embedded.command("stop")
@click.pass_context
def stop_command(ctx: click.Context) -> None:
    """Stop the embedded server (its data stays; the next slotd command starts it again)."""
    settings: Settings = ctx.obj
    if embedded_pg.stop(settings):
        click.echo("embedded PostgreSQL stopped")
    else:
        click.echo("embedded PostgreSQL was not running")


def register(group: click.Group) -> None:
    group.add_command(embedded)
