"""The operator's control of live work: `slotd cancel`, `slotd pause`, `slotd resume`.

Each change is committed in a short transaction of its own and recorded with who made it
(the OS user and host of this command); the replicas log it as they act on it."""

from __future__ import annotations

import sys

import click

from slotd.commands.ops import TASK_ID, _duration, _repository, _task_type, warn_unhandled
from slotd.config import format_duration
from slotd.errors import ConfigError
from slotd.producer.control import cancel_matching, operator
from slotd.repository import pause_type, resume_type


@click.command("cancel")
@click.option("--id", "ids", type=TASK_ID, multiple=True, help="This task (repeatable).")
@click.option("--type", "task_type", help="Every live task of this type.")
@click.option("--key", help="With --type: only the task with this key.")
@click.pass_context
def cancel(
    ctx: click.Context, ids: tuple[int, ...], task_type: str | None, key: str | None
) -> None:
    """Cancel pending or running tasks: a pending one never runs, a running one is stopped
    by its replica. Neither is retried; `slotd dead list` shows them until retention."""
    if bool(ids) == (task_type is not None):
        raise ConfigError("cancel: say which: --id N ... or --type T [--key K] (just one)")
    if key is not None and task_type is None:
        raise ConfigError("cancel: --key needs --type")
    name = _task_type(task_type)
    with _repository(ctx, "cancel") as repo:
        done = cancel_matching(repo.write, ids=ids, task_type=name, key=key, by=operator())
    running = [t.id for t in done if t.running]
    click.echo(
        f"cancelled {len(done)} task{'s' if len(done) != 1 else ''}"
        + (f" ({len(running)} running: their replicas stop them)" if running else "")
    )
    for task in done:
        click.echo(f"  {task.id} {task.task_type} {'running' if task.running else 'pending'}")
    # Nothing matched is exit 1 whichever selector said what to cancel.
    missing = sorted(set(ids) - {t.id for t in done})
    if missing:
        listed = ", ".join(str(i) for i in missing)
        click.echo(
            f"slotd: no live task with id {listed} (finished, dead, already cancelled, "
            "or never existed)",
            err=True,
        )
        sys.exit(1)
    if not ids and not done:
        with_key = f" with key {key!r}" if key is not None else ""
        click.echo(
            f"slotd: no live task of type {name}{with_key} (finished, dead, already "
            "cancelled, or never existed)",
            err=True,
        )
        sys.exit(1)


@click.command("pause")
@click.argument("task_type", metavar="TYPE")
@click.option("--until", "until", help="Resume by itself after this long, like 30m.")
@click.pass_context
def pause(ctx: click.Context, task_type: str, until: str | None) -> None:
    """Stop claims of TYPE on every replica (running tasks finish) until `slotd resume`."""
    name = _task_type(task_type) or task_type
    span = _duration(until, "--until")
    if span is not None and span.total_seconds() <= 0:
        raise ConfigError("bad --until: it must be longer than 0s")
    with _repository(ctx, "pause") as repo:
        with repo.write.transaction():
            row = pause_type(
                repo.write, name, by=operator(), for_seconds=span.total_seconds() if span else None
            )
        ends = ""
        if span is not None:
            until_at = row["until"].isoformat(timespec="seconds")
            ends = f" for {format_duration(span)} (until {until_at})"
        click.echo(f"paused {name}{ends}")
        warn_unhandled(repo, name, "paused anyway: the pause holds for a replica that adds it")


@click.command("resume")
@click.argument("task_type", metavar="TYPE")
@click.pass_context
def resume(ctx: click.Context, task_type: str) -> None:
    """Let claims of TYPE go on."""
    name = _task_type(task_type) or task_type
    with _repository(ctx, "resume") as repo, repo.write.transaction():
        was = resume_type(repo.write, name, by=operator())
    if was is None:
        click.echo(f"{name} was not paused")
    elif not was:
        click.echo(f"{name} was not paused (its pause had already ended)")
    else:
        click.echo(f"resumed {name}")


def register(group: click.Group) -> None:
    for command in (cancel, pause, resume):
        group.add_command(command)
