"""Runtime schedules from Python: `put_schedule` and `delete_schedule`, in the caller's
transaction (a psycopg Connection or Cursor, or a SQLAlchemy Session or Connection), beside
the schedules declared in code (Registry.schedule). Fired by every replica's runtime-schedule
thread (slotd/supervisor/runtime_schedules.py): each fire time once across the fleet."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from slotd import schedule as schedules
from slotd.producer.targets import sync_target
from slotd.registry import TYPE_NAME, validate_type_name
from slotd.repository import runtime_schedules as store
from slotd.repository.named import resolve_schema


class ScheduleNameTaken(ValueError):
    """put_schedule of a name a schedule declared in code holds."""


def build(
    name: str,
    *,
    task_type: str,
    cron: str | None = None,
    every: timedelta | None = None,
    timezone: str = "UTC",
    payload: Mapping[str, Any] | None = None,
) -> schedules.Schedule:
    """The schedule, checked as Registry.schedule checks one (ValueError naming it)."""
    if not isinstance(name, str) or not TYPE_NAME.match(name):
        raise ValueError(
            f"invalid schedule name {name!r}: the task type name rule applies (lower case "
            "letters, digits and _ . : -, starting with a letter, at most 128 characters)"
        )
    validate_type_name(task_type)
    return schedules.build(
        name,
        task_type=task_type,
        cron=cron,
        every=every,
        payload=payload,
        timezone=timezone,
        catch_up="latest",
        overlap="skip",
    )


def put_schedule(
    conn: Any,
    name: str,
    *,
    task_type: str,
    cron: str | None = None,
    every: timedelta | None = None,
    timezone: str = "UTC",
    payload: Mapping[str, Any] | None = None,
    schema: str | None = None,
) -> bool:
    """Create or replace the runtime schedule `name`: a `task_type` task at every fire time
    of `cron` (5 fields, in `timezone`) or `every`, once for the whole fleet, from the
    first fire time after this call (a replaced schedule with other fire times starts
    afresh; one with the same times keeps its next fire). Missed fire times fold into the
    latest (catch-up "latest"); a fire while the previous task is live enqueues nothing
    (overlap "skip"). In the caller's transaction: it takes effect when that commits.
    True when it was created. A name held by a schedule declared in code is refused
    (ScheduleNameTaken, a ValueError): the two kinds live apart and never overwrite each
    other."""
    sc = build(
        name, task_type=task_type, cron=cron, every=every, timezone=timezone, payload=payload
    )
    target = sync_target(conn, "slotd.put_schedule")
    schema = resolve_schema(schema)
    now: datetime = store.clock(target, schema)
    params = {
        "name": sc.name,
        "task_type": sc.task_type,
        "expression": sc.expression,
        "timezone": sc.timezone,
        "payload": json.dumps(sc.payload),
        "next_at": sc.next_after(now),
    }
    created = store.put(target, params, schema)
    if created is None:
        raise ScheduleNameTaken(
            f"schedule {name!r} is declared in code (Registry.schedule); a runtime schedule"
            " needs another name"
        )
    return created


def delete_schedule(conn: Any, name: str, *, schema: str | None = None) -> bool:
    """Delete the runtime schedule `name` in the caller's transaction; False when there is
    none (a schedule declared in code is not deleted here: remove its declaration)."""
    if not isinstance(name, str):
        raise TypeError("delete_schedule: name must be a string")
    target = sync_target(conn, "slotd.delete_schedule")
    return store.delete(target, name, resolve_schema(schema))


def plan(
    name: str, task_type: str, expression: str, timezone: str, due: datetime, now: datetime
) -> tuple[datetime, datetime]:
    """A due row's fire time (the latest at or before `now`, never before `due`) and its
    next one (the first after `now`)."""
    sc = _evaluable(expression, timezone)
    fire = max(due, sc.last_at_or_before(now))
    return fire, sc.next_after(max(now, fire))


_CACHE: dict[tuple[str, str], schedules.Schedule] = {}


def _evaluable(expression: str, timezone: str) -> schedules.Schedule:
    """The fire-time arithmetic of an expression, parsed once per (expression, zone)."""
    key = (expression, timezone)
    found = _CACHE.get(key)
    if found is None:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        found = _CACHE[key] = schedules.from_row("runtime", "runtime", expression, timezone, "")
    return found
