"""Handlers for the priority and concurrency-limit tests. Each records its start and end in
`runs` on a connection of its runner's own (opened once per runner: thousands of tasks),
with the end of its lease, so a run killed mid-way still has a known last instant."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import psycopg

import slotd

registry = slotd.Registry()

RUNS = """
CREATE TABLE runs (
    task_id bigint, task_type text, task_group text, attempt int, pid int, run_at timestamptz,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    lease_ends_at timestamptz NOT NULL, ended_at timestamptz
)"""

_conn: psycopg.Connection[Any] | None = None
LEASE_MARGIN = timedelta(seconds=3)  # tests.daemon.FAST's SLOTD_LEASE_MARGIN


def _db() -> psycopg.Connection[Any]:
    global _conn
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True)
    return _conn


def _run(task: slotd.Task, ctx: slotd.Context, seconds: float) -> None:
    """Record the start, hold the place for `seconds`, record the end."""
    row = (
        _db()
        .execute(
            "INSERT INTO runs (task_id, task_type, task_group, attempt, pid, run_at, lease_ends_at)"
            " SELECT %s, %s, (SELECT task_group FROM slotd_tasks WHERE id = %s), %s, %s, %s, %s"
            " RETURNING ctid",
            (
                task.id,
                task.type,
                task.id,
                task.attempt,
                os.getpid(),
                task.run_at,
                ctx.deadline + LEASE_MARGIN,
            ),
        )
        .fetchone()
    )
    if task.payload.get("hold"):
        # Hold the place until just before the deadline: a test that kills this run's
        # replica then has most of the ceiling to do it, however loaded the machine.
        seconds = max(seconds, ctx.remaining() - 0.6)
    time.sleep(seconds)
    assert row is not None
    _db().execute("UPDATE runs SET ended_at = clock_timestamp() WHERE ctid = %s", (row[0],))


@registry.handler("lim.two", ceiling=timedelta(seconds=2), max_running=2)
def two(task: slotd.Task, ctx: slotd.Context) -> None:
    _run(task, ctx, float(task.payload.get("sleep", 0.01)))


@registry.handler("lim.group", ceiling=timedelta(seconds=2), max_running_per_group=1)
def per_group(task: slotd.Task, ctx: slotd.Context) -> None:
    _run(task, ctx, float(task.payload.get("sleep", 0.01)))


@registry.handler("lim.one", ceiling=timedelta(seconds=30), max_running=1)
def one(task: slotd.Task, ctx: slotd.Context) -> None:
    _run(task, ctx, float(task.payload.get("sleep", 0.01)))


@registry.handler("lim.free", ceiling=timedelta(seconds=30))
def free(task: slotd.Task, ctx: slotd.Context) -> None:
    _run(task, ctx, float(task.payload.get("sleep", 0.01)))
