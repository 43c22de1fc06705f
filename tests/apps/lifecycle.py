"""Handlers for the lease-lifecycle tests (tests/test_lifecycle.py). `rebuild` is the
README's own example, taken from README.md's code block as it is written there (not a copy
that could drift)."""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg

import slotd

registry = slotd.Registry()
PAGES = 4  # cursors 0..3; page 3 is the last (its `next` is None)


def _record(task: slotd.Task, phase: str, note: Any = None) -> None:
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (%s,%s,%s,%s,%s)",
            (task.id, task.attempt, phase, os.getpid(), None if note is None else str(note)),
        )


async def fetch_page(cursor: int) -> SimpleNamespace:
    """The README's `fetch_page`: page `cursor` of PAGES, recorded as it is read."""
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (phase, pid, note) VALUES ('page', %s, %s)",
            (os.getpid(), str(cursor)),
        )
    return SimpleNamespace(next=cursor + 1 if cursor + 1 < PAGES else None)


def _readme_example() -> str:
    # The sliced handler as the docs show it (it lived in README.md before the docs site).
    page = (Path(__file__).resolve().parents[2] / "docs/how-to/handlers.md").read_text()
    for block in re.findall(r"```python[^\n]*\n(.*?)```", page, re.S):
        if "async def rebuild" in block:
            return block
    raise LookupError("docs/how-to/handlers.md has no `async def rebuild` example")


_namespace: dict[str, Any] = {"registry": registry, "slotd": slotd, "timedelta": timedelta}
_namespace["fetch_page"] = fetch_page
exec(compile(_readme_example(), "README.md", "exec"), _namespace)
assert registry.get("rebuild") is not None


@registry.handler("slices.advance_then_raise", ceiling=timedelta(seconds=30), max_attempts=3)
def advance_then_raise(task: slotd.Task, ctx: slotd.Context) -> bool:
    _record(task, "start", task.payload.get("cursor"))
    ctx.advance_cursor({"cursor": task.payload.get("cursor", 0) + 1})
    raise RuntimeError("page read failed after the cursor was saved")


@registry.handler("slices.work_after_advance", ceiling=timedelta(seconds=30))
def work_after_advance(task: slotd.Task, ctx: slotd.Context) -> bool:
    cursor = task.payload.get("cursor", 0)
    _record(task, "start", cursor)
    ctx.advance_cursor({"cursor": cursor + 1})
    time.sleep(float(task.payload.get("after_s", 1.5)))  # the slice's remaining work
    _record(task, "end", cursor)
    return cursor + 1 >= 3


@registry.handler("lifecycle.ordered", ceiling=timedelta(seconds=30))
def ordered(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start", task.payload.get("rank"))
    time.sleep(0.05)  # long enough that the slots' claims take turns
