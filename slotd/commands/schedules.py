"""`slotd schedules`: the fleet's periodic schedules as their rows and declarations say."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import click

from slotd.commands.ops import _ago, _dump, _duration, _repository, _table
from slotd.errors import ConfigError
from slotd.producer.schedules import delete_schedule, put_schedule
from slotd.repository import runtime_schedules
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
        "kind": "code",
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


def _runtime(row: dict[str, Any]) -> dict[str, Any]:
    """A runtime schedule (slotd.put_schedule) as the listing shows it."""
    late = (row["db_now"] - row["next_fire_at"]).total_seconds()
    return {
        "name": row["name"],
        "task_type": row["task_type"],
        "expression": row["expression"],
        "timezone": row["timezone"],
        "catch_up": "latest",
        "last_fire": row["last_fire_at"],
        "next_fire": row["next_fire_at"],
        "lag_seconds": round(max(late, 0.0), 3),
        "declared_by": [],
        "orphaned": False,
        "kind": "runtime",
        "payload": row["payload"],
    }


@click.group("schedules", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON array, for scripts.")
@click.option("--prune", is_flag=True, help="Delete the schedules no live replica declares.")
@click.pass_context
def schedules(ctx: click.Context, as_json: bool, prune: bool) -> None:
    """Periodic schedules: last and next fire, lag, and the live replicas declaring each
    (RUNTIME: added with `slotd schedules add` or slotd.put_schedule)."""
    if ctx.invoked_subcommand is not None:
        return
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
        reports += [_runtime(r) for r in runtime_schedules.listed(repo.write, repo.schema)]
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
            "RUNTIME"
            if r["kind"] == "runtime"
            else ", ".join(f"{d['hostname']}:{d['pid']}" for d in r["declared_by"]) or "ORPHANED",
        )
        for r in reports
    ]
    header = ("NAME", "TYPE", "EXPRESSION", "ZONE", "LAST FIRE", "NEXT FIRE", "LAG", "DECLARED BY")
    click.echo(_table(header, rows))
    orphans = sum(1 for r in reports if r["orphaned"])
    if orphans:
        click.echo(f"{orphans} orphaned (no live replica declares them): slotd schedules --prune")


@schedules.command("add")
@click.argument("name")
@click.option("--type", "task_type", required=True, help="The task type each fire enqueues.")
@click.option("--cron", help="A 5-field cron expression, e.g. '0 3 * * *'.")
@click.option("--every", help="A period instead of cron, e.g. 5m, 1h30m.")
@click.option("--timezone", default="UTC", show_default=True, help="The cron's time zone.")
@click.option("--payload", default="{}", help="The tasks' payload, a JSON object.")
@click.pass_context
def schedules_add(
    ctx: click.Context,
    name: str,
    task_type: str,
    cron: str | None,
    every: str | None,
    timezone: str,
    payload: str,
) -> None:
    """Create or replace the runtime schedule NAME (committed; fired by any replica)."""
    period: timedelta | None = _duration(every, "--every")
    try:
        body = json.loads(payload)
    except ValueError as exc:
        raise ConfigError(f"schedules add: --payload is not JSON: {exc}") from None
    with _repository(ctx, "schedules add") as repo, repo.write.transaction():
        try:
            created = put_schedule(
                repo.write,
                name,
                task_type=task_type,
                cron=cron,
                every=period,
                timezone=timezone,
                payload=body,
                schema=repo.schema,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    click.echo(f"{'added' if created else 'replaced'} runtime schedule {name}")


@schedules.command("delete")
@click.argument("name")
@click.pass_context
def schedules_delete(ctx: click.Context, name: str) -> None:
    """Delete the runtime schedule NAME (exit 1 when there is none)."""
    with _repository(ctx, "schedules delete") as repo, repo.write.transaction():
        gone = delete_schedule(repo.write, name, schema=repo.schema)
    if not gone:
        raise click.ClickException(f"no runtime schedule named {name!r}")
    click.echo(f"deleted runtime schedule {name}")


def register(group: click.Group) -> None:
    group.add_command(schedules)
