"""The operator's dead-letter commands: `slotd dead list`, `dead retry`, `dead purge`, and
`slotd cleanup` (the retention's prune, which the supervisor also runs hourly).

As every operator command (slotd/commands/ops.py): input is validated before the database
is touched, and every write is its own short transaction, so a purge of a million rows
interrupted with Ctrl-C keeps the batches it finished and nothing else."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from slotd.commands.ops import TASK_ID, _dump, _duration, _repository, _table, _task_type
from slotd.config import Settings, format_duration
from slotd.errors import ConfigError, SlotdError
from slotd.repository import Repository
from slotd.supervisor.maintenance import prune

RETRY_BATCH = 1000
PURGE_BATCH = 5000


class UnknownIds(SlotdError):
    """Ids that name no dead letter: exit 1, nothing changed."""


def _dead_selector(ids: tuple[int, ...], task_type: str | None, all_: bool, verb: str) -> None:
    chosen = sum((bool(ids), task_type is not None, all_))
    if chosen != 1:
        # ConfigError, not click.UsageError: one line on stderr rather than a usage block.
        raise ConfigError(f"dead {verb}: say which: --id N ..., --type T or --all (just one)")


def _check_ids(repo: Repository, ids: Sequence[int]) -> None:
    found = {row["id"] for row in repo.dead_list(ids=ids, limit=len(ids))}
    missing = [i for i in ids if i not in found]
    if missing:
        listed = ", ".join(str(i) for i in missing)
        raise UnknownIds(
            f"no dead letter with id {listed} (never existed, finished, still live, "
            "or already purged); nothing changed"
        )


@click.group("dead")
def dead() -> None:
    """Dead letters: tasks out of attempts, kept for debugging until retention."""


@dead.command("list")
@click.option("--type", "task_type", help="Only this task type.")
@click.option("--id", "ids", type=TASK_ID, multiple=True, help="Only these ids (repeatable).")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="At most this many, newest first.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="A JSON array, for scripts.")
@click.pass_context
def dead_list(
    ctx: click.Context, task_type: str | None, ids: tuple[int, ...], limit: int, as_json: bool
) -> None:
    """The most recent dead letters first."""
    name = _task_type(task_type)
    with _repository(ctx, "dead list") as repo:
        rows = repo.dead_list(task_type=name, ids=list(ids) or None, limit=limit)
        total = repo.dead_count(task_type=name, ids=list(ids) or None)
    if as_json:
        click.echo(_dump(rows))
    elif rows:
        table = [
            (
                r["id"],
                r["task_type"],
                r["dead_reason"],
                r["attempt_count"],
                r["last_attempted_at"].isoformat(timespec="seconds")
                if r["last_attempted_at"]
                else None,
                r["key"],
                _one_line(r["last_error"]),
            )
            for r in rows
        ]
        click.echo(
            _table(("ID", "TYPE", "REASON", "ATTEMPTS", "LAST ATTEMPT", "KEY", "LAST ERROR"), table)
        )
        if total > len(rows):
            click.echo(f"({len(rows)} of {total}; --limit shows more)")
    else:
        click.echo("no dead letters")
    found = {r["id"] for r in rows}
    missing = [i for i in ids if i not in found]
    if missing and len(rows) < limit:
        click.echo(f"slotd: no dead letter with id {', '.join(map(str, missing))}", err=True)
        sys.exit(1)


def _one_line(text: str | None, width: int = 80) -> str | None:
    if not text:
        return None
    line = text.strip().splitlines()[-1] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


@dead.command("retry")
@click.option("--id", "ids", type=TASK_ID, multiple=True, help="These ids (repeatable).")
@click.option("--type", "task_type", help="Every dead letter of this type.")
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@click.pass_context
def dead_retry(ctx: click.Context, ids: tuple[int, ...], task_type: str | None, all_: bool) -> None:
    """Make dead letters due now with their attempts reset."""
    _dead_selector(ids, task_type, all_, "retry")
    name = _task_type(task_type)
    id_list = list(ids) or None
    with _repository(ctx, "dead retry") as repo:
        if id_list:
            _check_ids(repo, id_list)
        retried = 0
        while True:
            batch = repo.dead_retry_batch(task_type=name, ids=id_list, batch=RETRY_BATCH)
            retried += len(batch)
            if not batch:
                break
        # The statement leaves a keyed dead letter alone when a live task has its key:
        # reviving it would duplicate that work (and break the dedupe index).
        stuck = repo.dead_count(task_type=name, ids=id_list)
    click.echo(f"retried {retried} dead letter{'s' if retried != 1 else ''}")
    if stuck:
        click.echo(f"{stuck} left dead: a live task with the same key already exists", err=True)


@dead.command("purge")
@click.option("--id", "ids", type=TASK_ID, multiple=True, help="These ids (repeatable).")
@click.option("--type", "task_type", help="Every dead letter of this type.")
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@click.option("--older-than", help="Only those whose last attempt is older, like 7d.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def dead_purge(
    ctx: click.Context,
    ids: tuple[int, ...],
    task_type: str | None,
    all_: bool,
    older_than: str | None,
    yes: bool,
) -> None:
    """Delete dead letters, in batches that each commit (safe to interrupt)."""
    _dead_selector(ids, task_type, all_, "purge")
    name = _task_type(task_type)
    age = _duration(older_than, "--older-than")
    id_list = list(ids) or None
    with _repository(ctx, "dead purge") as repo:
        if id_list:
            _check_ids(repo, id_list)
        total = repo.dead_count(task_type=name, ids=id_list, older_than=age)
        if total == 0:
            click.echo("purged 0 dead letters")
            return
        if not yes:
            click.confirm(f"purge {total} dead letter{'s' if total != 1 else ''}?", abort=True)
        purged = 0
        try:
            # The bar draws only on a terminal; stdout stays a single result line.
            with click.progressbar(length=total, label="purging", file=sys.stderr) as bar:
                while True:
                    count = repo.dead_purge_batch(
                        task_type=name, ids=id_list, older_than=age, batch=PURGE_BATCH
                    )
                    purged += count
                    bar.update(count)
                    if count < PURGE_BATCH:
                        break
        except KeyboardInterrupt:
            click.echo(
                f"\nslotd: interrupted: purged {purged} of {total}; those batches are committed, "
                "the rest are untouched",
                err=True,
            )
            sys.exit(130)
    click.echo(f"purged {purged} dead letter{'s' if purged != 1 else ''}")


# cleanup


@click.command("cleanup")
@click.option("--retention", help="Prune dead letters older than this (default SLOTD_RETENTION).")
@click.pass_context
def cleanup(ctx: click.Context, retention: str | None) -> None:
    """Prune dead letters past retention now (the supervisor also does it hourly)."""
    settings: Settings = ctx.obj
    window = _duration(retention, "--retention") or settings.retention
    with _repository(ctx, "cleanup") as repo:
        pruned, error = prune(repo, window)
    if error is not None:
        if pruned:
            click.echo(f"pruned {pruned} dead letters before the error", err=True)
        raise error
    click.echo(f"pruned {pruned} dead letters older than {format_duration(window)}")


def register(group: click.Group) -> None:
    for command in (dead, cleanup):
        group.add_command(command)
