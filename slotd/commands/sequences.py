"""`slotd sequences`: the sequences (enqueue(..., sequence=NAME)), the halted first, and
`slotd sequences resume NAME` for one that a failed task halted."""

from __future__ import annotations

import sys

import click

from slotd.commands.ops import _dump, _repository, _table
from slotd.producer.control import operator
from slotd.repository import sequences as stored


@click.group("sequences", invoke_without_command=True)
@click.option("--halted", is_flag=True, help="Only the sequences a failed task halted.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def sequences(ctx: click.Context, halted: bool, as_json: bool) -> None:
    """Sequences with tasks left or a halt: the head (the task that runs now or next), how
    many tasks hold it, and for a halted one the task that failed."""
    if ctx.invoked_subcommand is not None:
        return
    with _repository(ctx, "sequences") as repo:
        found = stored.sequences(repo.read, halted=halted, limit=1000, schema=repo.schema)
    if as_json:
        click.echo(
            _dump(
                {
                    s.name: {
                        "halted_by": s.halted_by,
                        "halted_at": s.halted_at.isoformat() if s.halted_at else None,
                        "error": s.halted_error,
                        "tasks": s.holding,
                        "head": s.head,
                    }
                    for s in found
                }
            )
        )
        return
    if not found:
        click.echo("no halted sequences" if halted else "no sequences")
        return
    rows = [
        (
            s.name,
            f"HALTED by {s.halted_by} ({s.halted_type})" if s.halted else "running",
            s.holding,
            s.head or "-",
        )
        for s in found
    ]
    click.echo(_table(("SEQUENCE", "STATE", "TASKS", "HEAD"), rows))
    if any(s.halted for s in found):
        click.echo("resume one with: slotd sequences resume NAME")


@sequences.command("resume")
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    """Let a halted sequence go on: its next task becomes due; the task that failed stays a
    dead letter (`slotd dead retry` runs it again instead, before the rest)."""
    with _repository(ctx, "sequences resume") as repo, repo.write.transaction():
        resumed = stored.resume(repo.write, [name], schema=repo.schema)
    if not resumed:
        click.echo(f"slotd: sequence {name!r} is not halted", err=True)
        sys.exit(1)
    click.echo(f"resumed sequence {name} (by {operator()})")


def register(group: click.Group) -> None:
    group.add_command(sequences)
