"""Runtime schedules (sql/042): put and delete in the caller's transaction, and the fire
step a replica's runtime-schedule thread runs: the due rows locked, the tasks inserted and
the rows advanced in one transaction (sql/queries_schedules.sql `runtime_schedules_*`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg

from slotd.repository.named import Executor, _sql

# (name, task_type, expression, timezone, next_fire_at) -> (fire_at, next_at): the
# latest due fire time and the first one after the database's clock.
Planner = Callable[[str, str, str, str, datetime, datetime], tuple[datetime, datetime]]


def clock(target: Executor, schema: str) -> datetime:
    return target.execute(_sql("runtime_schedule_clock", schema)).fetchone()[0]  # type: ignore[index]


def put(target: Executor, params: dict[str, Any], schema: str) -> bool | None:
    """True: created; False: replaced; None: a schedule declared in code holds the name."""
    row = target.execute(_sql("runtime_schedule_put", schema), params).fetchone()
    return None if row is None else bool(row[0])


def delete(target: Executor, name: str, schema: str) -> bool:
    return target.execute(_sql("runtime_schedule_delete", schema), {"name": name}).rowcount == 1


def listed(target: Executor, schema: str) -> list[dict[str, Any]]:
    cur = target.execute(_sql("runtime_schedules_list", schema))
    names = [col.name for col in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def next_fire(conn: psycopg.Connection[Any], schema: str) -> tuple[datetime | None, datetime]:
    """The soonest next fire time (None: no runtime schedule) and the database's clock: an
    idle look is this one statement, no transaction (`fire_due` only once one is due)."""
    return conn.execute(_sql("runtime_schedules_next", schema)).fetchone()  # type: ignore[return-value]


def fire_due(
    conn: psycopg.Connection[Any],
    schema: str,
    planner: Planner,
    *,
    batch: int,
    max_attempts: int,
) -> tuple[int, int, datetime | None, datetime]:
    """One batch: the due rows this replica could lock, fired. Returns (schedules advanced,
    tasks enqueued, the soonest next fire time, the database's clock)."""
    advanced = enqueued = 0
    with conn.transaction():
        rows = conn.execute(_sql("runtime_schedules_due", schema), {"batch": batch}).fetchall()
        if rows:
            db_now = rows[0][5]
            names, expected, fire_at, next_at = [], [], [], []
            for name, task_type, expression, timezone, due, _ in rows:
                fire, nxt = planner(name, task_type, expression, timezone, due, db_now)
                names.append(name)
                expected.append(due)
                fire_at.append(fire)
                next_at.append(nxt)
            params = {
                "names": names,
                "expected": expected,
                "fire_at": fire_at,
                "next_at": next_at,
                "max_attempts": max_attempts,
            }
            done = conn.execute(_sql("runtime_schedules_fire", schema), params).fetchall()
            advanced = len(done)
            enqueued = sum(1 for _, task_id in done if task_id is not None)
    next_at_, db_now = next_fire(conn, schema)
    return advanced, enqueued, next_at_, db_now
