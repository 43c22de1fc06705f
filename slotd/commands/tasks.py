"""`slotd tasks`: list tasks by type, state, key or tag (slotd.tasks on the command line)."""

from __future__ import annotations

import dataclasses

import click

from slotd.commands.ops import _dump, _repository, _table, _task_type
from slotd.errors import ConfigError
from slotd.producer.admin import tasks as list_tasks
from slotd.repository.admin import LIMIT_MAX, STATES


@click.command("tasks")
@click.option("--type", "task_type", help="Only this task type.")
@click.option("--state", type=click.Choice(STATES), help="Only tasks in this state.")
@click.option("--key", help="Only the task(s) with this key.")
@click.option("--tag", help="Only tasks carrying this tag.")
@click.option("--limit", type=click.IntRange(min=1, max=LIMIT_MAX), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON array, for scripts.")
@click.pass_context
def tasks(
    ctx: click.Context,
    task_type: str | None,
    state: str | None,
    key: str | None,
    tag: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Tasks in the queue (live ones and dead letters), newest first."""
    name = _task_type(task_type)
    if tag == "" or key == "":
        raise ConfigError("tasks: --tag and --key take a non-empty value")
    with _repository(ctx, "tasks") as repo:
        found = list_tasks(
            repo.write, type=name, state=state, key=key, tag=tag, limit=limit, schema=repo.schema
        )
    if as_json:
        click.echo(_dump([dataclasses.asdict(t) for t in found]))
        return
    if not found:
        click.echo("no tasks")
        return
    rows = [
        (
            t.id,
            t.type,
            t.state,
            t.attempts,
            t.run_at.isoformat(timespec="seconds") if t.run_at else None,
            t.key,
            ",".join(t.tags) or None,
        )
        for t in found
    ]
    click.echo(_table(("ID", "TYPE", "STATE", "ATTEMPTS", "RUN_AT", "KEY", "TAGS"), rows))


def register(group: click.Group) -> None:
    group.add_command(tasks)
