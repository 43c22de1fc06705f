"""`slotd dashboard`: the web dashboard on its own (uvicorn serving slotd.web)."""

from __future__ import annotations

import logging

import click

from slotd import db
from slotd.config import Settings
from slotd.errors import ConfigError


@click.command("dashboard")
@click.option(
    "--addr",
    default=None,
    help="HOST:PORT to listen on (default SLOTD_DASHBOARD_ADDR, else 127.0.0.1:8080).",
)
@click.pass_context
def dashboard(ctx: click.Context, addr: str | None) -> None:
    """The web dashboard: queues, running work, dead letters (extra slotd[web])."""
    import os

    settings: Settings = ctx.obj
    try:
        # Only here: the rest of slotd never needs a web framework.
        import uvicorn

        from slotd.web.app import create_app
        from slotd.web.settings import (
            DEFAULT_ADDR,
            DashboardSettings,
            is_loopback,
            parse_addr,
        )
    except ImportError as exc:
        raise ConfigError(
            f"the dashboard needs the web extra ({exc.name} is missing): pip install 'slotd[web]'"
        ) from None
    host, port = parse_addr(addr or os.environ.get("SLOTD_DASHBOARD_ADDR") or DEFAULT_ADDR)
    web = DashboardSettings.from_env(lease_margin=settings.lease_margin)
    if not web.authenticated and not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host} without authentication: set "
            "SLOTD_DASHBOARD_TOKEN or SLOTD_DASHBOARD_BASIC_AUTH, or listen on 127.0.0.1"
        )
    url = db.primary_url(settings)
    app = create_app(url, settings=web)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    mode = "actions on" if web.actions else "read-only"
    auth = "token" if web.token else "basic auth" if web.basic_user else "no auth (loopback)"
    click.echo(f"slotd dashboard on http://{host}:{port}/ ({mode}, {auth})", err=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    finally:
        app.state.dashboard.close()


def register(group: click.Group) -> None:
    group.add_command(dashboard)
