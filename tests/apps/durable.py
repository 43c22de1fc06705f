"""Handlers that take durable steps (#38), for tests/test_durable_steps.py. Each step's side
effect is a row in `executions` (phase "side:NAME"), written on the handler's own connection
as an application's charge or e-mail would be; what the attempt does after its first step
(crash its runner, raise, wait to be killed) is the payload's "then", on attempt 1 only."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import psycopg

import slotd

registry = slotd.Registry()
QUICK = timedelta(milliseconds=100)  # backoff: the retry comes at once


def _record(task: slotd.Task, phase: str, note: str | None = None) -> None:
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (%s,%s,%s,%s,%s)",
            (task.id, task.attempt, phase, os.getpid(), note),
        )


def _side(task: slotd.Task, name: str, value: Any) -> Any:
    _record(task, f"side:{name}")
    return value


def _then(task: slotd.Task) -> None:
    """What attempt 1 does right after its first step."""
    then = task.payload.get("then")
    if task.attempt != 1 or then is None:
        return
    _record(task, f"then:{then}")
    if then == "crash":
        os._exit(3)  # the runner dies under the handler
    if then == "raise":
        raise RuntimeError("failed after its first step")
    if then == "hang":  # the test kills the slot (kill -9) while this waits
        time.sleep(60)


@registry.handler("dur.order", ceiling=timedelta(seconds=30), backoff_base=QUICK, backoff_cap=QUICK)
def order(task: slotd.Task, ctx: slotd.Context) -> Any:
    charge = ctx.step("charge", _side, task, "charge", {"charged": task.payload.get("amount", 1)})
    _then(task)
    shipped = ctx.step("ship", _side, task, "ship", ["parcel", 7])
    _record(task, "done", note=f"{charge['charged']}:{shipped[1]}")
    return None


@registry.handler("dur.order_async", ceiling=timedelta(seconds=30), backoff_base=QUICK)
async def order_async(task: slotd.Task, ctx: slotd.Context) -> None:
    async def charge() -> dict[str, int]:
        _record(task, "side:charge")
        return {"charged": 5}

    value = await ctx.step_async("charge", charge)
    _then(task)
    shipped = await ctx.step_async("ship", _side, task, "ship", "box")
    _record(task, "done", note=f"{value['charged']}:{shipped}")


@registry.handler("dur.repeat", ceiling=timedelta(seconds=30), max_attempts=1)
def repeat(task: slotd.Task, ctx: slotd.Context) -> None:
    ctx.step("a", _side, task, "a", 1)
    ctx.step("a", _side, task, "a", 2)


@registry.handler("dur.not_json", ceiling=timedelta(seconds=30), max_attempts=1)
def not_json(task: slotd.Task, ctx: slotd.Context) -> None:
    ctx.step("a", lambda: {1, 2})


@registry.handler("dur.changed", ceiling=timedelta(seconds=30), backoff_base=QUICK, max_attempts=2)
def changed(task: slotd.Task, ctx: slotd.Context) -> None:
    """Its first attempt takes "charge" and fails; the second (new code) starts with
    "reserve" where "charge" was stored."""
    if task.attempt == 1:
        ctx.step("charge", _side, task, "charge", 1)
        raise RuntimeError("deploy came")
    ctx.step("reserve", _side, task, "reserve", 1)
