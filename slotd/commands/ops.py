"""The operator's commands: status and enqueue (the dead letters and cleanup are
slotd/commands/dead.py), and the steps every operator command shares: its connection
(`_repository`), its input (`_duration`, `_task_type`) and its output (`_dump`, `_table`).

Input is validated before the database is touched, so bad usage exits 2 even when the
database is down. Every write is its own short transaction (the repository's), so a purge
of a million rows interrupted with Ctrl-C keeps the batches it finished and nothing else."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import click
import psycopg

from slotd import db
from slotd.config import Settings, format_duration, parse_duration
from slotd.errors import ConfigError, SlotdError
from slotd.ops.history import ALARM_REASONS, recent_outcomes
from slotd.payload import encode
from slotd.producer.enqueue import enqueue as enqueue_task
from slotd.registry import validate_type_name
from slotd.repository import Repository, UnknownParents, paused_types
from slotd.repository.batches import batches_in_flight
from slotd.repository.sequences import sequences
from slotd.repository.states import DEAD, State, state_counts
from slotd.supervisor.horizon import Holder, status_line


@contextmanager
def _repository(ctx: click.Context, role: str) -> Iterator[Repository]:
    """Every command here but enqueue works on what is already there: it never starts the
    embedded server (see db.existing_url)."""
    settings: Settings = ctx.obj
    url = db.primary_url(settings) if role == "enqueue" else db.existing_url(settings)
    with db.connect(url, role=f"slotd {role}", prepare=settings.prepare) as conn:
        yield Repository.from_settings(settings, conn)


def _duration(value: str | None, name: str) -> timedelta | None:
    return None if value is None else parse_duration(value, name=name)


def _task_type(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return validate_type_name(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


class TaskId(click.ParamType):
    """A task's id: the whole number `slotd enqueue` printed. Said as such, rather than
    click's "'abc' is not a valid integer range"."""

    name = "id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        text = str(value).strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
        self.fail(f"{value!r} is not a task id (the number `slotd enqueue` printed, like 42)")


TASK_ID = TaskId()


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _dump(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, sort_keys=True)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        # Numbers right-aligned, text left, the last column unpadded.
        parts = [
            cell.rjust(widths[i]) if _numeric(cell) and i else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _numeric(cell: str) -> bool:
    return cell.replace(".", "", 1).isdigit()


def _ago(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    # Whole seconds: a table of "0.0135s ago" reads as noise.
    return format_duration(max(round(seconds), 0))


def served_types(replicas: Sequence[dict[str, Any]]) -> set[str]:
    """The types the live replicas declared in their last heartbeat."""
    return {t for r in replicas for t in (r.get("task_types") or ())}


def _tasks(n: int) -> str:
    return f"{n} task{'s' if n != 1 else ''}"


def warn_unhandled(repo: Repository, task_type: str, then: str) -> None:
    """One line on stderr when live replicas heartbeat and none declares `task_type` (a
    typo, or a handler not deployed yet); nothing when no replica is live, since then no
    type is handled and the fleet, not the type, is what is missing."""
    try:
        replicas = repo.replicas()
    except psycopg.Error:
        return  # a look at the fleet, never a reason to fail what was already done
    served = served_types(replicas)
    if not replicas or task_type in served:
        return
    known = ", ".join(sorted(served)) or "nothing"
    click.echo(
        f"slotd: warning: no live replica handles {task_type} (the fleet handles: {known}); {then}",
        err=True,
    )


# status

# The oldest batches in flight shown (a sealed batch not yet complete); "N+" past it.
BATCHES_SHOWN = 20
HALTED_SHOWN = 20  # halted sequences named by `slotd status`


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Pending, running and dead tasks per type, the oldest due, and the live replicas."""
    with _repository(ctx, "status") as repo:
        replicas = repo.replicas()
        limits = declared_limits(replicas)
        gauges = repo.gauges(limits)
        states = state_counts(repo.read, schema=repo.schema)
        by_type = repo.oldest_due_by_type()
        paused = paused_types(repo.read, schema=repo.schema)
        recent = recent_outcomes(repo.read, schema=repo.schema)
        halted = sequences(repo.read, halted=True, limit=HALTED_SHOWN, schema=repo.schema)
        schema = repo.schema
        batches = batches_in_flight(repo.read, limit=BATCHES_SHOWN, schema=repo.schema)
        holder = Holder.from_row(repo.horizon_holder())
    warn_after = ctx.obj.horizon_warn
    types = sorted(
        set(gauges["pending"]) | set(gauges["running"]) | set(gauges["dead"]) | set(states)
    )
    served = served_types(replicas)
    unhandled = [t for t in types if gauges["pending"].get(t) and t not in served]
    if as_json:
        report = {
            "schema": schema,
            # pending / running / dead: the gauges' (pending counts running tasks too);
            # states: each task in exactly one state (slotd/repository/states.py).
            **gauges,
            "states": states,
            "paused": {p.pop("task_type"): p for p in paused},
            "limits": {
                t: {"max_running": most, "max_running_per_group": per_group}
                for t, (most, per_group) in limits.items()
            },
            "oldest_due_by_type": by_type,
            "rates": gauges["rates"],
            "replicas": replicas,
            # Types with pending work that no live replica declares a handler for.
            "unhandled": unhandled,
            "slots": sum(r["slots"] for r in replicas),
            "outcomes": recent.as_json(),
            "batches": [
                {
                    "id": b.id,
                    "on_complete": b.callback_type,
                    "done": b.done,
                    "total": b.total,
                    "age_seconds": b.age_s,
                }
                for b in batches
            ],
            # Sequences a failed task halted (sql/080): {name: the task that failed}.
            "halted_sequences": {q.name: q.halted_by for q in halted},
            # Whatever holds the horizon the longest, shown or not: scripts decide.
            "vacuum_horizon": None if holder is None else holder.as_json(),
        }
        click.echo(_dump(report))
        return
    if schema != "public":
        click.echo(f"schema: {schema}")
    if types:
        # One column per live state and one for the dead letters: each task is counted in
        # exactly one, so a row adds up to the type's tasks (a running task is not pending).
        rows = []
        for t in types:
            n = states.get(t, {})
            rows.append(
                (
                    t,
                    n.get(State.SCHEDULED, 0),
                    n.get(State.PENDING, 0),
                    _running(n.get(State.RUNNING, 0), limits.get(t)),
                    n.get(State.RETRYING, 0),
                    n.get(State.WAITING, 0),
                    sum(n.get(s, 0) for s in DEAD),
                    _ago(by_type.get(t)),
                )
            )
        heads = ("TYPE", "SCHEDULED", "PENDING", "RUNNING", "RETRYING", "WAITING", "DEAD")
        click.echo(_table((*heads, "OLDEST DUE"), rows))
    else:
        click.echo("no tasks")
    if replicas and unhandled:
        # What the dashboard flags: work that no live replica has a handler for.
        listed = ", ".join(f"{t} ({_tasks(gauges['pending'].get(t, 0))})" for t in unhandled)
        click.echo(f"! no live replica handles {listed}: a typo, or a handler not deployed")
    click.echo(f"oldest due: {_ago(gauges['oldest_due_seconds']) or '0s'}")
    _echo_outcomes(recent)
    _echo_rates(gauges["rates"])
    if paused:
        # Their due work is left out of the oldest-due figure: it waits on purpose.
        rows = [
            (
                p["task_type"],
                p["paused_by"],
                p["paused_at"].isoformat(timespec="seconds"),
                # Open-ended: "UNTIL resumed" read as "already resumed".
                f"{_ago(p['remaining_s'])} left" if p["until"] else "slotd resume",
            )
            for p in paused
        ]
        click.echo(f"paused: {len(paused)} type{'s' if len(paused) != 1 else ''}")
        table = _table(("TYPE", "BY", "SINCE", "UNTIL"), rows)
        click.echo("\n".join("  " + line for line in table.splitlines()))
    if halted:
        # Their tasks wait until an operator acts: the one line that says so.
        more = "+" if len(halted) >= HALTED_SHOWN else ""
        listed = ", ".join(f"{q.name} (task {q.halted_by} failed)" for q in halted)
        click.echo(
            f"! sequences halted: {len(halted)}{more}: {listed}; slotd sequences resume NAME"
        )
    if batches:
        more = "+" if len(batches) >= BATCHES_SHOWN else ""
        click.echo(f"batches in flight: {len(batches)}{more}")
        rows = [(b.id, b.callback_type, f"{b.done}/{b.total}", _ago(b.age_s)) for b in batches]
        table = _table(("BATCH", "ON COMPLETE", "DONE", "AGE"), rows)
        click.echo("\n".join("  " + line for line in table.splitlines()))
    click.echo(status_line(holder, warn_after))
    slots = sum(r["slots"] for r in replicas)
    click.echo(f"replicas: {len(replicas)} live, {slots} slots{fleet_versions(replicas)}")
    if replicas:
        rows = [
            (
                r["hostname"],
                r["pid"],
                r["version"] or OLDEST,
                r["slots"],
                _ago(r["seen_ago_s"]) + " ago",
                ",".join(r["task_types"]),
            )
            for r in replicas
        ]
        table = _table(("HOST", "PID", "VERSION", "SLOTS", "SEEN", "TYPES"), rows)
        click.echo("\n".join("  " + line for line in table.splitlines()))


def _span(seconds: float) -> str:
    """A rate's window or wait: tenths below a minute (a 2 s window's wait is 0.4 s)."""
    return f"{round(seconds, 1):g}s" if seconds < 60 else str(_ago(seconds))


def _echo_rates(rates: dict[str, dict[str, float]]) -> None:
    """Each rated type's window as the database has it: starts used / allowed in its own
    window, when the next start may come, and how many groups' windows are full."""
    if not rates:
        return
    rows = []
    for task_type in sorted(rates):
        r = rates[task_type]
        if "allowed" in r:
            window = f"{int(r['used'])}/{int(r['allowed'])} per {_span(r['window_s'])}"
            free = "now" if r["free_s"] <= 0 else f"in {_span(r['free_s'])}"
        else:
            window, free = "-", "-"
        full = int(r.get("groups_full", 0))
        rows.append((task_type, window, free, full))
    click.echo("rates:")
    table = _table(("TYPE", "STARTS", "NEXT START", "GROUPS FULL"), rows)
    click.echo("\n".join("  " + line for line in table.splitlines()))


def _echo_outcomes(recent: Any) -> None:
    counts = sorted(recent.by_outcome.items(), key=lambda kv: -kv[1])
    listed = ", ".join(f"{n} {outcome}" for outcome, n in counts) or "none"
    click.echo(f"attempts in the last {recent.minutes}m: {listed}")
    for outcome, n in recent.alarming.items():
        click.echo(f"  ! {n} {outcome}: {ALARM_REASONS[outcome]}")


# A replica of a release before sql/013 heartbeats no version.
OLDEST = "0.1.x"


def fleet_versions(replicas: Sequence[dict[str, Any]]) -> str:
    """ ", versions: 0.2.0 x2, 0.1.x x1" while a rollout runs two releases at once (newest
    code first: by the newest migration each carries), else the one version."""
    counts = collections.Counter(r.get("version") or OLDEST for r in replicas)
    if len(counts) <= 1:
        return f", version {next(iter(counts))}" if counts else ""
    level = {(r.get("version") or OLDEST): r.get("migration") or 0 for r in replicas}
    newest = sorted(counts.items(), key=lambda kv: level[kv[0]], reverse=True)
    return ", versions: " + ", ".join(f"{v} x{n}" for v, n in newest)


def declared_limits(replicas: Sequence[dict[str, Any]]) -> dict[str, tuple[int | None, int | None]]:
    """The limits the live replicas declare per type; where they differ (a rollout), the
    lowest, which is the one a claim would meet first."""
    merged: dict[str, tuple[int | None, int | None]] = {}
    for replica in replicas:
        for task_type, (most, per_group) in (replica.get("limits") or {}).items():
            old_most, old_group = merged.get(task_type, (None, None))
            merged[task_type] = (_lowest(old_most, most), _lowest(old_group, per_group))
    return merged


def _lowest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _running(count: int, limit: tuple[int | None, int | None] | None) -> str | int:
    """RUNNING as n/limit for a type with max_running, n/g:limit per group only."""
    if limit is None:
        return count
    most, per_group = limit
    return f"{count}/{most}" if most is not None else f"{count} (per group {per_group})"


# enqueue


@click.command("enqueue")
@click.argument("task_type", metavar="TYPE")
@click.argument("payload", metavar="[PAYLOAD_JSON]", required=False)
@click.option("--delay", help="Due after this long, like 30s, 10m, 1h30m.")
@click.option("--key", help="Dedupe key: a live task with the same type and key wins.")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    help="Pin this task's dead-letter threshold (else the claiming worker's).",
)
@click.option(
    "--priority",
    type=click.IntRange(-100, 100),
    default=0,
    help="-100..100, higher sooner: a head start of priority x SLOTD_PRIORITY_STEP.",
)
@click.option("--group", help="What the type's max_running_per_group counts (e.g. org:42).")
@click.option(
    "--unique",
    type=click.Choice(["live", "pending"]),
    default="live",
    show_default=True,
    help="With --key: dedupe against a live task (pending or running), or a pending one only.",
)
@click.option(
    "--after", type=TASK_ID, multiple=True, help="Run once this task succeeded (repeatable)."
)
@click.option(
    "--expires-in",
    help="Not started within this long (e.g. 1h): never runs, ends an 'expired' dead letter.",
)
@click.pass_context
def enqueue(
    ctx: click.Context,
    task_type: str,
    payload: str | None,
    delay: str | None,
    key: str | None,
    max_attempts: int | None,
    priority: int,
    group: str | None,
    unique: str,
    after: tuple[int, ...],
    expires_in: str | None,
) -> None:
    """Add one task and commit it; prints its id (or the live task's id with that key)."""
    name = _task_type(task_type) or task_type
    body: dict[str, Any] = {}
    if payload is not None:
        try:
            body = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"bad payload: not JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(body, dict):
            raise ConfigError(f"bad payload: a JSON object is required, not {type(body).__name__}")
        try:
            # Python's json reads NaN and Infinity; PostgreSQL's jsonb does not.
            json.dumps(body, allow_nan=False)
        except ValueError:
            raise ConfigError("bad payload: NaN and Infinity are not JSON") from None
        try:
            encode(body, "payload")  # nor a NUL character, which jsonb cannot store
        except TypeError as exc:
            raise ConfigError(f"bad {exc}") from None
    wait = _duration(delay, "--delay")
    if group is not None and not group.strip():
        raise ConfigError("bad --group: empty (leave it out for a task without a group)")
    if unique == "pending" and key is None:
        raise ConfigError("bad --unique pending: it needs a --key")
    if after and (key is not None or wait):
        raise ConfigError("bad --after: it cannot be combined with --key or --delay")
    expiry = _duration(expires_in, "--expires-in")
    if expiry is not None and expiry <= (wait or timedelta(0)):
        raise ConfigError("bad --expires-in: it must be longer than --delay, or it never runs")
    with _repository(ctx, "enqueue") as repo:
        with repo.write.transaction():
            try:
                task_id = enqueue_task(
                    repo.write,
                    name,
                    body,
                    delay=wait,
                    key=key,
                    max_attempts=max_attempts,
                    priority=priority,
                    group=group,
                    unique=unique,
                    after=list(after) or None,
                    expires_in=expiry,
                )
            except UnknownParents as exc:
                raise SlotdError(str(exc)) from None
        click.echo(str(task_id))
        # After the commit: the task is in, whatever the fleet looks like.
        warn_unhandled(repo, name, "it waits until a replica with its handler starts")


def register(group: click.Group) -> None:
    for command in (status, enqueue):
        group.add_command(command)
