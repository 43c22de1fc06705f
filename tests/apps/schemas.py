"""Handlers for the schema tests: each run is recorded with the fleet its payload names and
the process that ran it, in the application's own table (`executions`, in public)."""

from __future__ import annotations

import os
from datetime import timedelta

import psycopg

import slotd

registry = slotd.Registry()


@registry.handler("sc.mark", ceiling=timedelta(seconds=30))
def mark(task: slotd.Task, ctx: slotd.Context) -> None:
    with psycopg.connect(os.environ["SLOTD_TEST_DIRECT_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (%s,%s,%s,%s,%s)",
            (task.id, task.attempt, "end", os.getpid(), task.payload["fleet"]),
        )
