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


# handlers that decide (#38)


def _starts(task: slotd.Task) -> int:
    """How many times this task started before (its own record, as an application's)."""
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM executions WHERE task_id = %s AND phase = 'start'", (task.id,)
        ).fetchone()
    return int(row[0]) if row else 0


@registry.handler("dur.snoozer", ceiling=timedelta(seconds=30), max_attempts=2)
def snoozer(task: slotd.Task, ctx: slotd.Context) -> None:
    """Snoozes payload["snoozes"] times (for payload["for_s"] seconds), then succeeds."""
    before = _starts(task)
    _record(task, "start")
    if before < task.payload.get("snoozes", 3):
        raise slotd.Snooze(timedelta(seconds=task.payload.get("for_s", 0.05)))
    _record(task, "done")


@registry.handler("dur.discard", ceiling=timedelta(seconds=30), max_attempts=5)
def discard(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    raise slotd.Discard("customer deleted")


@registry.handler(
    "dur.retry_on",
    ceiling=timedelta(seconds=30),
    max_attempts=5,
    retry_on=(ConnectionError,),
    backoff=lambda attempt, exc: timedelta(0),
)
def retry_on(task: slotd.Task, ctx: slotd.Context) -> None:
    """A ConnectionError (retried) on attempt 1, then a ValueError (not in retry_on)."""
    _record(task, "start")
    if task.attempt == 1:
        raise ConnectionError("upstream reset")
    raise ValueError("bad invoice")


@registry.handler(
    "dur.discard_on", ceiling=timedelta(seconds=30), max_attempts=5, discard_on=(ValueError,)
)
def discard_on(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    raise ValueError("bad invoice")


@registry.handler(
    "dur.backoff",
    ceiling=timedelta(seconds=30),
    max_attempts=3,
    backoff=lambda attempt, exc: timedelta(seconds=100 * attempt),
)
def backoff(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    if task.payload.get("retry_after"):
        raise slotd.RetryAfter(timedelta(seconds=task.payload["retry_after"]))
    raise TimeoutError("slow upstream")


# durable sleeps and events (#38)


@registry.handler("dur.sleeper", ceiling=timedelta(seconds=30), max_attempts=1)
def sleeper(task: slotd.Task, ctx: slotd.Context) -> None:
    """A step, a durable sleep of payload["s"] seconds, then done: one attempt suffices."""
    ctx.step("before", _side, task, "before", 1)
    _record(task, "start")
    ctx.sleep(timedelta(seconds=task.payload.get("s", 2)))
    _record(task, "done")


@registry.handler("dur.approval", ceiling=timedelta(seconds=30), max_attempts=1)
def approval(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    timeout = task.payload.get("timeout_s")
    data = ctx.wait_event(
        task.payload["event"], timeout=None if timeout is None else timedelta(seconds=timeout)
    )
    _record(task, "done", note=None if data is None else str(data["by"]))
