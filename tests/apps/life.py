"""Handlers for the task-life tests (tests/test_task_life.py, #37): a batch member that runs
until its replica is frozen, a sliced member held between its advance and its return, and
a recorder. Each records what it did in `executions` on its own connection."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

import psycopg

import slotd

registry = slotd.Registry()
KEEP = timedelta(hours=1)
GATE = 4343  # an advisory lock the test holds to keep a slice from returning


def _record(task: slotd.Task, phase: str, note: str = "") -> None:
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (%s,%s,%s,%s,%s)",
            (task.id, task.attempt, phase, os.getpid(), note),
        )


@registry.handler("lc.member", ceiling=timedelta(seconds=2), max_attempts=3)
def member(task: slotd.Task, ctx: slotd.Context) -> Any:
    """Runs its payload's `ms` (a frozen replica outlives its lease in it)."""
    _record(task, "start")
    time.sleep(task.payload.get("ms", 0) / 1000)
    if task.payload.get("fail"):
        raise RuntimeError(f"member {task.id} fails")
    return {"n": task.payload.get("n")}


@registry.handler("lc.slice", ceiling=timedelta(seconds=60))
def slice_(task: slotd.Task, ctx: slotd.Context) -> bool:
    """Advances its cursor, then waits for the test's gate and returns False (continue),
    deaf to the cancel's interrupt: whatever the slot heard decides how it settles."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    cursor = task.payload.get("cursor", 0)
    ctx.advance_cursor({"cursor": cursor + 1})
    _record(task, "advanced", str(cursor + 1))
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        conn.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
    return cursor + 1 >= 3


@registry.handler("lc.record", ceiling=timedelta(seconds=30), keep_result=KEEP)
def record(task: slotd.Task, ctx: slotd.Context) -> Any:
    _record(task, "start", str(task.payload.get("n", "")))
    return task.payload


@registry.handler("lc.fail", ceiling=timedelta(seconds=30), max_attempts=1)
def fail(task: slotd.Task, ctx: slotd.Context) -> Any:
    _record(task, "start")
    raise RuntimeError("lc.fail fails")


@registry.handler("lc.fail_once", ceiling=timedelta(seconds=30), max_attempts=1, keep_result=KEEP)
def fail_once(task: slotd.Task, ctx: slotd.Context) -> Any:
    """Fails its first run only (a retried dead letter then succeeds)."""
    _record(task, "start")
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM executions WHERE task_id = %s AND phase = 'start'", (task.id,)
        ).fetchone()
    if row is not None and row[0] == 1:
        raise RuntimeError("lc.fail_once fails the first time")
    return {"ran": int(row[0]) if row else 0}


@registry.handler(
    "lc.retry_later",
    ceiling=timedelta(seconds=30),
    max_attempts=3,
    backoff_base=timedelta(hours=1),
)
def retry_later(task: slotd.Task, ctx: slotd.Context) -> Any:
    """Fails, its next attempt an hour away: the task is `retrying` meanwhile."""
    _record(task, "start")
    raise RuntimeError(f"attempt {task.attempt} fails")


@registry.handler("lc.gated", ceiling=timedelta(seconds=60), keep_result=KEEP)
def gated(task: slotd.Task, ctx: slotd.Context) -> Any:
    """Runs until the test lets go of GATE."""
    _record(task, "start")
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        conn.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
    return {"gated": task.id}


@registry.handler(
    "lc.flaky",
    ceiling=timedelta(seconds=30),
    max_attempts=3,
    backoff_base=timedelta(milliseconds=10),
    backoff_cap=timedelta(milliseconds=20),
    keep_history=KEEP,
)
def flaky(task: slotd.Task, ctx: slotd.Context) -> Any:
    """Fails its first attempt, succeeds its second: its history is kept, not its value."""
    _record(task, "start")
    if task.attempt == 1:
        raise ValueError(f"first attempt of {task.id} fails")
    return {"not": "kept"}


@registry.handler(
    "lc.plain_flaky",
    ceiling=timedelta(seconds=30),
    max_attempts=3,
    backoff_base=timedelta(milliseconds=10),
    backoff_cap=timedelta(milliseconds=20),
)
def plain_flaky(task: slotd.Task, ctx: slotd.Context) -> Any:
    """lc.flaky without history: gone once it succeeds."""
    _record(task, "start")
    if task.attempt == 1:
        raise ValueError("first attempt fails")


@registry.handler(
    "lc.killed",
    ceiling=timedelta(seconds=30),
    max_attempts=3,
    backoff_base=timedelta(milliseconds=10),
    backoff_cap=timedelta(milliseconds=20),
    keep_history=KEEP,
)
def killed(task: slotd.Task, ctx: slotd.Context) -> Any:
    """Its first attempt waits to be killed (the test kills its runner); the second ends."""
    _record(task, "start")
    if task.attempt == 1:
        time.sleep(60)


@registry.handler(
    "lc.frozen_once",
    ceiling=timedelta(seconds=2),
    max_attempts=3,
    keep_history=KEEP,
)
def frozen_once(task: slotd.Task, ctx: slotd.Context) -> Any:
    """Its first attempt outlives its lease (the test freezes its replica); the second ends."""
    _record(task, "start")
    if task.attempt == 1:
        time.sleep(60)
