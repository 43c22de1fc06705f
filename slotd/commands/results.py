"""`slotd result ID [--wait 30s] [--json]`: a task's state, stored result or error, attempts."""

from __future__ import annotations

import json
import sys

import click

from slotd import db
from slotd.commands.ops import TASK_ID
from slotd.config import Settings, format_duration, parse_duration
from slotd.producer.results import Attempt, TaskResult, result, wait_result


@click.command("result")
@click.argument("task_id", metavar="ID", type=TASK_ID)
@click.option("--wait", "wait", help="Wait this long for it to end, like 30s (else now).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@click.pass_context
def result_command(ctx: click.Context, task_id: int, wait: str | None, as_json: bool) -> None:
    """A task's state (scheduled, pending, running, retrying, waiting, succeeded with its
    stored result, failed, cancelled or expired with the error) and its attempts. Exit 1
    when there is no such task (never one, or gone: a success without keep_result or
    keep_history) or --wait ran out."""
    settings: Settings = ctx.obj
    timeout = None if wait is None else parse_duration(wait, name="--wait").total_seconds()
    url = db.existing_url(settings)
    with db.connect(url, role="slotd result", prepare=settings.prepare) as conn:
        if timeout is None:
            found = result(conn, task_id)
        else:
            try:
                found = wait_result(conn, task_id, timeout, listen_url=settings.database_url_listen)
            except TimeoutError as exc:
                click.echo(f"slotd: {exc}", err=True)
                sys.exit(1)
    if found is None:
        click.echo(f"slotd: no task {task_id} (never enqueued, or gone)", err=True)
        sys.exit(1)
    click.echo(_render(task_id, found, as_json))


def _render(task_id: int, found: TaskResult, as_json: bool) -> str:
    if as_json:
        body = {
            "id": task_id,
            "state": found.state,
            "value": found.value,
            "error": found.error,
            "attempts": [a.as_json() for a in found.attempts],
        }
        return json.dumps(body, sort_keys=True)
    lines = [f"task {task_id}: {found.state}"]
    if found.state == "succeeded":
        lines.append(json.dumps(found.value))
    if found.error:
        lines.append(found.error)
    if found.attempts:
        lines.append("attempts:")
    for a in found.attempts:
        took = "" if a.started_at is None or a.ended_at is None else f" in {_took(a)}"
        lines.append(f"  #{a.number} {a.outcome or 'running'}{took} on {a.worker or 'unknown'}")
        if a.error:
            lines.append(f"    {a.error.strip().splitlines()[-1]}")
    return "\n".join(lines)


def _took(attempt: Attempt) -> str:
    assert attempt.started_at is not None and attempt.ended_at is not None
    return format_duration(attempt.ended_at - attempt.started_at)


def register(group: click.Group) -> None:
    group.add_command(result_command)
