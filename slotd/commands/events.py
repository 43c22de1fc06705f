"""`slotd emit NAME [JSON]`: an event for the tasks waiting on it (ctx.wait_event), committed."""

from __future__ import annotations

import json
from typing import Any

import click

from slotd.commands.ops import _repository
from slotd.errors import ConfigError
from slotd.producer.events import emit as emit_event


@click.command("emit")
@click.argument("name")
@click.argument("data", metavar="[JSON]", required=False)
@click.pass_context
def emit(ctx: click.Context, name: str, data: str | None) -> None:
    """Emit event NAME with JSON data (default null) and commit; prints how many waiting
    tasks it woke. A wait that begins later still sees it (kept for SLOTD_RETENTION)."""
    if not name:
        raise ConfigError("bad NAME: an event needs a name")
    value: Any = None
    if data is not None:
        try:
            value = json.loads(data)
            json.dumps(value, allow_nan=False)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"bad JSON: {exc.msg} at character {exc.pos}") from None
        except ValueError:
            raise ConfigError("bad JSON: NaN and Infinity are not JSON") from None
    with _repository(ctx, "enqueue") as repo, repo.write.transaction():
        woken = emit_event(repo.write, name, value, schema=repo.schema)
    click.echo(str(woken))


def register(group: click.Group) -> None:
    group.add_command(emit)
