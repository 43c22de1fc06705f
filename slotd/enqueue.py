"""The producer's API: tasks written inside the caller's own transaction."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from slotd import repository
from slotd.repository import Executor, NewTask

# Eager mode (slotd.testing) swaps this for a function that also runs the handler inline;
# everything else goes straight to the repository.
_hook: Any = None


def _max_attempts() -> int:
    raw = os.environ.get("SLOTD_MAX_ATTEMPTS")
    return int(raw) if raw and raw.isdigit() and int(raw) > 0 else 20


def enqueue_many(
    conn: Executor, items: Iterable[NewTask | tuple[Any, ...]], *, max_attempts: int | None = None
) -> list[int]:
    """Write tasks in the caller's transaction; slotd never commits it. The wake is sent by
    the same statement, so it reaches the workers only if the transaction commits."""
    attempts = max_attempts or _max_attempts()
    ids = repository.enqueue_many(conn, items, max_attempts=attempts)
    if _hook is not None:
        _hook(conn, ids)
    return ids


def enqueue(
    conn: Executor,
    task_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    delay: timedelta | float | None = None,
    key: str | None = None,
    max_attempts: int | None = None,
) -> int:
    """Write one task and return its id, or the id of the live row with the same key."""
    return enqueue_many(conn, [NewTask(task_type, payload, delay, key)], max_attempts=max_attempts)[
        0
    ]
