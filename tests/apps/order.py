"""Handlers for the order tests (#39: sequences, debounce, fair turns, shared limits). Each
records its start and end in `order_runs` on a connection of its runner's own, with the
payload, so a test reads the order things ran in and whether any two overlapped."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import psycopg

import slotd

registry = slotd.Registry()

RUNS = """
CREATE TABLE order_runs (
    task_id bigint, task_type text, attempt int, payload jsonb, pid int,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz
)"""

_conn: psycopg.Connection[Any] | None = None


def _db() -> psycopg.Connection[Any]:
    global _conn
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True)
    return _conn


def _run(task: slotd.Task, ctx: slotd.Context) -> None:
    """Record the start, sleep payload["sleep"] seconds, fail while the attempt is below
    payload["fail_until"] (or always with payload["fail"]), record the end."""
    row = (
        _db()
        .execute(
            "INSERT INTO order_runs (task_id, task_type, attempt, payload, pid)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING ctid",
            (task.id, task.type, task.attempt, psycopg.types.json.Jsonb(task.payload), os.getpid()),
        )
        .fetchone()
    )
    assert row is not None
    time.sleep(float(task.payload.get("sleep", 0.02)))
    _db().execute("UPDATE order_runs SET ended_at = clock_timestamp() WHERE ctid = %s", (row[0],))
    if task.payload.get("fail") or task.attempt < int(task.payload.get("fail_until", 0)):
        raise RuntimeError(f"failing on purpose (attempt {task.attempt})")


@registry.handler(
    "ord.step",
    ceiling=timedelta(seconds=10),
    max_attempts=3,
    backoff_base=timedelta(milliseconds=300),
    backoff_cap=timedelta(seconds=1),
)
def step(task: slotd.Task, ctx: slotd.Context) -> None:
    _run(task, ctx)


@registry.handler("ord.once", ceiling=timedelta(seconds=10), max_attempts=1)
def once(task: slotd.Task, ctx: slotd.Context) -> None:
    """A sequence halts when one of these ends failed (the default)."""
    _run(task, ctx)


@registry.handler(
    "ord.onward", ceiling=timedelta(seconds=10), max_attempts=1, sequence_on_failure="continue"
)
def onward(task: slotd.Task, ctx: slotd.Context) -> None:
    """A sequence goes on past one of these that ended failed."""
    _run(task, ctx)


# Shared limits: at most one of ord.model_a / ord.model_b at once, fleet-wide; at most two
# starts of ord.rated_a / ord.rated_b in any 60 s; one per group of ord.grouped_*.
registry.limit("model", max_running=1)
registry.limit("burst", rate=(2, timedelta(seconds=60)))
registry.limit("tenant", max_running_per_group=1)


for name, shared in (
    ("ord.model_a", "model"),
    ("ord.model_b", "model"),
    ("ord.rated_a", "burst"),
    ("ord.rated_b", "burst"),
    ("ord.grouped_a", "tenant"),
    ("ord.grouped_b", "tenant"),
):
    registry.register(name, _run, ceiling=timedelta(seconds=10), limits=[shared])


@registry.handler("ord.fair", ceiling=timedelta(seconds=10), fair=True)
def fair(task: slotd.Task, ctx: slotd.Context) -> None:
    """A type whose groups take turns."""
    _run(task, ctx)


@registry.handler(
    "ord.burst", ceiling=timedelta(seconds=10), max_running_per_group=1, group_burst=2
)
def burst(task: slotd.Task, ctx: slotd.Context) -> None:
    """One per group, up to three while no other group has a due task (group_burst)."""
    _run(task, ctx)
