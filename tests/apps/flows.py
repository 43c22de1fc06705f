"""Handlers for the workflow tests: stored results (keep_result). Each records its start in
`executions` on its own connection, with its slot's pid (the runner's parent) as the note."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import psycopg

import slotd

registry = slotd.Registry()
KEEP = timedelta(hours=1)
GATE = 4242  # an advisory lock the test holds to keep a handler from returning


def _record(task: slotd.Task, phase: str) -> None:
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (%s,%s,%s,%s,%s)",
            (task.id, task.attempt, phase, os.getpid(), str(os.getppid())),
        )


@registry.handler("fl.keep", ceiling=timedelta(seconds=30), keep_result=KEEP)
def keep(task: slotd.Task, ctx: slotd.Context) -> Any:
    _record(task, "start")
    return {"doubled": task.payload.get("n", 0) * 2, "id": task.id}


@registry.handler("fl.keep_async", ceiling=timedelta(seconds=30), keep_result=KEEP)
async def keep_async(task: slotd.Task, ctx: slotd.Context) -> Any:
    return [task.payload.get("n", 0), "async"]


@registry.handler("fl.none", ceiling=timedelta(seconds=30), keep_result=KEEP)
def none(task: slotd.Task, ctx: slotd.Context) -> None:
    return None


@registry.handler("fl.not_json", ceiling=timedelta(seconds=30), keep_result=KEEP, max_attempts=1)
def not_json(task: slotd.Task, ctx: slotd.Context) -> Any:
    return {"when": object()}


@registry.handler("fl.fails", ceiling=timedelta(seconds=30), keep_result=KEEP, max_attempts=1)
def fails(task: slotd.Task, ctx: slotd.Context) -> Any:
    raise RuntimeError(f"no luck for {task.payload.get('n')}")


@registry.handler("fl.plain", ceiling=timedelta(seconds=30))
def plain(task: slotd.Task, ctx: slotd.Context) -> Any:
    return {"dropped": True}  # no keep_result: the value is not stored


@registry.handler("fl.gated", ceiling=timedelta(seconds=60), keep_result=KEEP)
def gated(task: slotd.Task, ctx: slotd.Context) -> Any:
    _record(task, "start")
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (GATE,))  # until the test lets go
        conn.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
    return {"answer": 42, "payload": task.payload}


@registry.handler("fl.parent", ceiling=timedelta(seconds=30))
def parent(task: slotd.Task, ctx: slotd.Context) -> Any:
    _record(task, "start")  # no keep_result: its value reaches its dependants all the same
    return {"from": task.id, "n": task.payload.get("n")}


@registry.handler("fl.child", ceiling=timedelta(seconds=30), keep_result=KEEP)
def child(task: slotd.Task, ctx: slotd.Context) -> Any:
    _record(task, "start")
    return {str(k): v for k, v in sorted(task.parent_results.items())}


# Batches. A member sleeps its payload's `ms`, then fails when asked to (every attempt, so
# it ends a dead letter after its three); attempts enough that a run killed with its replica
# is run again elsewhere once its lease lapses, rather than left a dead letter unseen.
@registry.handler(
    "fl.member",
    ceiling=timedelta(seconds=2),
    max_attempts=3,
    backoff_base=timedelta(milliseconds=50),
    backoff_cap=timedelta(milliseconds=200),
)
def member(task: slotd.Task, ctx: slotd.Context) -> Any:
    if task.payload.get("ms"):
        time.sleep(task.payload["ms"] / 1000)
    if task.payload.get("fail"):
        raise RuntimeError(f"member {task.payload.get('n')} fails")
    return {"n": task.payload.get("n")}


@registry.handler("fl.report", ceiling=timedelta(seconds=30), keep_result=KEEP)
def report(task: slotd.Task, ctx: slotd.Context) -> Any:
    _record(task, "start")
    return task.payload
