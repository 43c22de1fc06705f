"""`slotd schedules`: the fleet's periodic schedules as their rows and declarations say."""

from __future__ import annotations

from typing import Any

import click

from slotd.commands.ops import _ago, _dump, _repository, _table
from slotd.schedule import from_row, lag_seconds


def _report(row: dict[str, Any]) -> dict[str, Any]:
    now = row["db_now"]
    out: dict[str, Any] = {
        "name": row["name"],
        "task_type": row["task_type"],
        "expression": row["expression"],
        "timezone": row["timezone"],
        "catch_up": row["catch_up"],
        "last_fire": row["last_fire_at"],
        "next_fire": None,
        "lag_seconds": None,
        "declared_by": row["declared_by"],
        "orphaned": not row["declared_by"],
    }
    try:
        schedule = from_row(
            row["name"], row["task_type"], row["expression"], row["timezone"], row["catch_up"]
        )
    except ValueError:
        return out  # e.g. a cron row read where cronsim is not installed: no next fire
    base = row["last_fire_at"] or row["anchor_at"]
    out["next_fire"] = schedule.next_after(base)
    out["lag_seconds"] = round(lag_seconds(schedule, row["last_fire_at"], row["anchor_at"], now), 3)
    return out


def _stamp(value: Any) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


@click.command("schedules")
@click.option("--json", "as_json", is_flag=True, help="A JSON array, for scripts.")
@click.option("--prune", is_flag=True, help="Delete the schedules no live replica declares.")
@click.pass_context
def schedules(ctx: click.Context, as_json: bool, prune: bool) -> None:
    """Periodic schedules: last and next fire, lag, and the live replicas declaring each."""
    with _repository(ctx, "schedules") as repo:
        if prune:
            pruned = repo.prune_schedules()
            if as_json:
                click.echo(_dump({"pruned": pruned}))
            else:
                listed = f": {', '.join(pruned)}" if pruned else ""
                plural = "" if len(pruned) == 1 else "s"
                click.echo(f"pruned {len(pruned)} orphaned schedule{plural}{listed}")
            return
        reports = [_report(row) for row in repo.schedules_overview()]
    if as_json:
        click.echo(_dump(reports))
        return
    if not reports:
        click.echo("no schedules")
        return
    rows = [
        (
            r["name"],
            r["task_type"],
            r["expression"],
            r["timezone"],
            _stamp(r["last_fire"]),
            _stamp(r["next_fire"]),
            _ago(r["lag_seconds"]),
            ", ".join(f"{d['hostname']}:{d['pid']}" for d in r["declared_by"]) or "ORPHANED",
        )
        for r in reports
    ]
    header = ("NAME", "TYPE", "EXPRESSION", "ZONE", "LAST FIRE", "NEXT FIRE", "LAG", "DECLARED BY")
    click.echo(_table(header, rows))
    orphans = sum(1 for r in reports if r["orphaned"])
    if orphans:
        click.echo(f"{orphans} orphaned (no live replica declares them): slotd schedules --prune")


def register(group: click.Group) -> None:
    group.add_command(schedules)
