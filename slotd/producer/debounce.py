"""Debounce (enqueue(..., key=K, debounce=td), #39): one run, `td` after the key's last
enqueue, with the last payload (or the first: debounce_keep="first"), at most
`debounce_max` after the burst's first enqueue. Every enqueue of a burst returns the same
id; an enqueue while the run runs queues one more (the row is unique="pending").

Each debounced row is written under its key's lock (sql `debounce_lock`), in the caller's
transaction: the key's task that has not started is pushed back (`debounce_push`), else one
is inserted by the ordinary enqueue, due `td` from now."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from slotd import repository
from slotd.payload import encode
from slotd.producer.targets import held, held_async
from slotd.repository import NewTask
from slotd.repository.named import _sql
from slotd.typed.ids import EnqueuedId

KEEP = ("last", "first")


def _seconds(value: object, what: str, task_type: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise TypeError(f"task {task_type!r}: {what} must be a timedelta or seconds")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds <= 0:
        raise ValueError(f"task {task_type!r}: {what} must be positive, got {value!r}")
    return seconds


def checked(rows: list[NewTask], parents: list[int], batch_id: int | None) -> list[bool]:
    """Which rows are debounced, each checked in the caller's frame before anything is
    written: a key is required; no delay, run_at, sequence, after= or batch beside it."""
    marks = []
    for row in rows:
        delay = _seconds(row.debounce, "debounce", row.task_type)
        most = _seconds(row.debounce_max, "debounce_max", row.task_type)
        if delay is None:
            if most is not None or row.debounce_keep != "last":
                raise ValueError(
                    f"task {row.task_type!r}: debounce_max and debounce_keep need debounce"
                )
            marks.append(False)
            continue
        problem = (
            "debounce needs a key"
            if row.key is None
            else "debounce_max is shorter than debounce"
            if most is not None and most < delay
            else f"debounce_keep must be 'last' or 'first', got {row.debounce_keep!r}"
            if row.debounce_keep not in KEEP
            else "debounce cannot be combined with delay or run_at (it is the delay)"
            if row.delay or row.run_at is not None
            else "debounce cannot be combined with sequence"
            if row.sequence is not None
            else "debounce cannot be combined with after="
            if parents
            else "debounce cannot be used in a batch"
            if batch_id is not None
            else None
        )
        if problem:
            raise ValueError(f"task {row.task_type!r}: {problem}")
        marks.append(True)
    return marks


def _push(row: NewTask) -> dict[str, Any]:
    return {
        "task_type": row.task_type,
        "key": row.key,
        "payload": encode(row.payload, f"task {row.task_type!r}"),
        "delay_s": _seconds(row.debounce, "debounce", row.task_type),
        "max_s": _seconds(row.debounce_max, "debounce_max", row.task_type),
        "keep_first": row.debounce_keep == "first",
    }


def _inserted(row: NewTask) -> NewTask:
    """The row a burst's first enqueue inserts: unique="pending", due `debounce` from now."""
    return replace(row, unique="pending", delay=row.debounce, debounce=None, debounce_max=None)


def write(
    target: Any, rows: list[NewTask], marks: list[bool], insert: dict[str, Any], schema: str
) -> list[EnqueuedId]:
    """Every row, debounced or not, in input order, in the caller's transaction (one of
    its own on an autocommit connection: the key's lock must last to the commit)."""
    plain = [r for r, debounced in zip(rows, marks, strict=True) if not debounced]
    with held(target):
        plain_ids = iter(repository.enqueue_many(target, plain, **insert) if plain else [])
        ids: list[EnqueuedId] = []
        for row, debounced in zip(rows, marks, strict=True):
            if not debounced:
                ids.append(next(plain_ids))
                continue
            params = _push(row)
            target.execute(_sql("debounce_lock", schema), params)
            pushed = target.execute(_sql("debounce_push", schema), params).fetchone()
            if pushed is not None:
                ids.append(EnqueuedId(pushed[0], created=False))
            else:
                ids.extend(repository.enqueue_many(target, [_inserted(row)], **insert))
    return ids


async def write_async(
    target: Any, rows: list[NewTask], marks: list[bool], insert: dict[str, Any], schema: str
) -> list[EnqueuedId]:
    """write() from asyncio."""
    plain = [r for r, debounced in zip(rows, marks, strict=True) if not debounced]
    async with held_async(target):
        done = await repository.enqueue_many_async(target, plain, **insert) if plain else []
        plain_ids = iter(done)
        ids: list[EnqueuedId] = []
        for row, debounced in zip(rows, marks, strict=True):
            if not debounced:
                ids.append(next(plain_ids))
                continue
            params = _push(row)
            await target.execute(_sql("debounce_lock", schema), params)
            cur = await target.execute(_sql("debounce_push", schema), params)
            pushed = await cur.fetchone()
            if pushed is not None:
                ids.append(EnqueuedId(pushed[0], created=False))
            else:
                ids.extend(await repository.enqueue_many_async(target, [_inserted(row)], **insert))
    return ids
