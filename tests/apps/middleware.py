"""Middleware around real attempts, for tests/test_middleware.py: each attempt's chain notes
what it saw (in order) and the outermost writes the notes in one `executions` row (phase
"chain") on its own connection, as the attempt ends, whatever way it ends."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import slotd
from tests.apps.runtime import _record

registry = slotd.Registry()
NOTES: list[str] = []
TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


@registry.middleware
def outer(task: slotd.Task, ctx: slotd.Context, call_next: Callable[[], Any]) -> Any:
    NOTES.clear()
    NOTES.append("outer>")
    try:
        value = call_next()
    except BaseException as exc:
        NOTES.append(f"outer!{type(exc).__name__}")
        raise
    else:
        NOTES.append(f"outer<{value!r}")
        return value
    finally:
        otel = "opentelemetry" in sys.modules or "slotd.integrations.otel" in sys.modules
        _record(task, "chain", note=json.dumps({"notes": NOTES, "otel": otel}))


@registry.middleware
def inner(task: slotd.Task, ctx: slotd.Context, call_next: Callable[[], Any]) -> Any:
    NOTES.append("inner>")
    if task.type == "mw.bad_mw":
        raise RuntimeError("middleware broke")
    try:
        value = call_next()
    except ValueError as exc:
        if task.type != "mw.swallow":
            raise
        NOTES.append(f"inner swallowed {exc}")
        return None  # the middleware's value is the attempt's: a success
    NOTES.append(f"inner<{value!r}")
    return value


@registry.middleware
def tenant(task: slotd.Task, ctx: slotd.Context, call_next: Callable[[], Any]) -> Any:
    """The README's tenant recipe: a contextvar set around the attempt."""
    token = TENANT.set(task.payload.get("tenant"))
    try:
        return call_next()
    finally:
        TENANT.reset(token)


@registry.middleware
async def async_outer(
    task: slotd.Task, ctx: slotd.Context, call_next: Callable[[], Awaitable[Any]]
) -> Any:
    NOTES.append("async_outer>")
    value = await call_next()
    NOTES.append(f"async_outer<{value!r}")
    return value


@registry.middleware
async def async_inner(
    task: slotd.Task, ctx: slotd.Context, call_next: Callable[[], Awaitable[Any]]
) -> Any:
    NOTES.append("async_inner>")
    value = await call_next()
    NOTES.append(f"async_inner<{value!r}")
    return value


CEILING = timedelta(seconds=30)


@registry.handler("mw.value", ceiling=CEILING)
def value(task: slotd.Task, ctx: slotd.Context) -> Any:
    NOTES.append(f"handler pid={os.getpid()}")
    return task.payload.get("value", 42)


@registry.handler("mw.swallow", ceiling=CEILING)
def swallow(task: slotd.Task, ctx: slotd.Context) -> None:
    NOTES.append("handler")
    raise ValueError("handler broke")


@registry.handler("mw.bad_mw", ceiling=CEILING)
def bad_mw(task: slotd.Task, ctx: slotd.Context) -> None:
    NOTES.append("handler")  # never: the middleware outside it raised first


@registry.handler("mw.deadline", ceiling=timedelta(seconds=1))
def deadline(task: slotd.Task, ctx: slotd.Context) -> None:
    NOTES.append("handler")
    # Never ctx.check(): its own DeadlineExceeded could come first, and the slot's interrupt
    # then land in the middleware's note-writing on the way out. The interrupt alone: once.
    while True:
        time.sleep(0.01)


@registry.handler("mw.cancel", ceiling=CEILING)
def cancel(task: slotd.Task, ctx: slotd.Context) -> None:
    NOTES.append("handler")
    _record(task, "start")
    while True:
        ctx.check()
        time.sleep(0.01)


@registry.handler("mw.async_value", ceiling=CEILING)
async def async_value(task: slotd.Task, ctx: slotd.Context) -> int:
    await asyncio.sleep(0)
    NOTES.append(f"handler tenant={TENANT.get()}")
    return 7
