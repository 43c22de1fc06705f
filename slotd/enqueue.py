"""The producer's API: tasks written inside the caller's own transaction, from sync code or
from asyncio, on psycopg or on a SQLAlchemy session (see slotd.targets)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from slotd import repository
from slotd.repository import NewTask
from slotd.targets import async_target, sync_target

# Eager mode (slotd.testing) swaps this for a function that also runs the handler inline;
# everything else goes straight to the repository. It gets the psycopg connection or
# cursor the rows were written on.
_hook: Any = None


def _max_attempts() -> int:
    raw = os.environ.get("SLOTD_MAX_ATTEMPTS")
    return int(raw) if raw and raw.isdigit() and int(raw) > 0 else 20


def enqueue_many(
    conn: Any, items: Iterable[NewTask | tuple[Any, ...]], *, max_attempts: int | None = None
) -> list[int]:
    """Write tasks in the caller's transaction; slotd never commits it. The wake is sent by
    the same statement, so it reaches the workers only if the transaction commits.

    `conn`: a psycopg Connection or Cursor, or a SQLAlchemy Session or Connection on the
    psycopg driver (the rows join the session's transaction: its commit commits them)."""
    target = sync_target(conn, "slotd.enqueue_many")
    ids = repository.enqueue_many(target, items, max_attempts=max_attempts or _max_attempts())
    if _hook is not None:
        _hook(target, ids)
    return ids


def enqueue(
    conn: Any,
    task_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    delay: timedelta | float | None = None,
    key: str | None = None,
    max_attempts: int | None = None,
) -> int:
    """Write one task and return its id, or the id of the live row with the same key."""
    target = sync_target(conn, "slotd.enqueue")
    new = NewTask(task_type, payload, delay, key)
    return enqueue_many(target, [new], max_attempts=max_attempts)[0]


async def enqueue_many_async(
    conn: Any, items: Iterable[NewTask | tuple[Any, ...]], *, max_attempts: int | None = None
) -> list[int]:
    """enqueue_many from asyncio: a psycopg AsyncConnection or AsyncCursor, or a SQLAlchemy
    AsyncSession or AsyncConnection on the psycopg driver. Same statement, same rules."""
    target = await async_target(conn, "slotd.enqueue_many_async")
    attempts = max_attempts or _max_attempts()
    ids = await repository.enqueue_many_async(target, items, max_attempts=attempts)
    if _hook is not None:
        _hook(target, ids)
    return ids


async def enqueue_async(
    conn: Any,
    task_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    delay: timedelta | float | None = None,
    key: str | None = None,
    max_attempts: int | None = None,
) -> int:
    """enqueue from asyncio; see enqueue_many_async."""
    target = await async_target(conn, "slotd.enqueue_async")
    new = NewTask(task_type, payload, delay, key)
    return (await enqueue_many_async(target, [new], max_attempts=max_attempts))[0]
