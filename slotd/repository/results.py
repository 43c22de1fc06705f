"""Stored results: a task's state read for slotd.result, the result notifications it waits
on, and the retention chore's prune of results past their keep_result."""

from __future__ import annotations

from typing import Any

from slotd.repository.lanes import Lanes
from slotd.repository.named import AsyncExecutor, Executor, _sql

RESULT_CHANNEL = "slotd_result"  # public's; named schemas: named.channel

Row = tuple[str, Any, str | None]  # state, value, error
# number, outcome (None: running now), error, started_at, ended_at, host, pid, slot
AttemptRow = tuple[int, str | None, str | None, Any, Any, str | None, int | None, int | None]


def result_of(target: Executor, task_id: int, *, schema: str | None = None) -> Row | None:
    row = target.execute(_sql("result_of", schema), {"id": task_id}).fetchone()
    return None if row is None else (row[0], row[1], row[2])


async def result_of_async(
    target: AsyncExecutor, task_id: int, *, schema: str | None = None
) -> Row | None:
    cur = await target.execute(_sql("result_of", schema), {"id": task_id})
    row = await cur.fetchone()
    return None if row is None else (row[0], row[1], row[2])


def attempts_of(target: Executor, task_id: int, *, schema: str | None = None) -> list[AttemptRow]:
    rows = target.execute(_sql("attempts_of", schema), {"id": task_id}).fetchall()
    return [tuple(row) for row in rows]  # type: ignore[misc]


async def attempts_of_async(
    target: AsyncExecutor, task_id: int, *, schema: str | None = None
) -> list[AttemptRow]:
    cur = await target.execute(_sql("attempts_of", schema), {"id": task_id})
    return [tuple(row) for row in await cur.fetchall()]  # type: ignore[misc]


def listen_results(target: Executor, on: bool = True, *, schema: str | None = None) -> None:
    target.execute(_sql("listen_results" if on else "unlisten_results", schema))


async def listen_results_async(
    target: AsyncExecutor, on: bool = True, *, schema: str | None = None
) -> None:
    await target.execute(_sql("listen_results" if on else "unlisten_results", schema))


class ResultStore(Lanes):
    """The retention chore's side of the result store."""

    def prune_results_batch(self, batch: int = 5000) -> int:
        count, _ = self._write("results_prune", {"batch": batch})
        return count

    def prune_attempts_batch(self, batch: int = 5000) -> int:
        """Attempts of tasks no longer answerable (sql `attempts_prune`)."""
        count, _ = self._write("attempts_prune", {"batch": batch})
        return count
