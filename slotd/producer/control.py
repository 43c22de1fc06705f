"""Operator control of live work, from Python: cancel a task, pause and resume a task type.

Each call runs in the caller's transaction (a psycopg 3 Connection or Cursor) and never
commits it, like enqueue: a cancel or a pause takes effect, and its notification reaches
the replicas, only if that transaction commits. Who acted (the OS user and host, unless
`by` says otherwise) is written with the change and logged here and by every replica."""

from __future__ import annotations

import getpass
import logging
import os
import socket
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from slotd import repository
from slotd.producer.targets import async_target
from slotd.registry import validate_type_name
from slotd.repository import CancelledTask, Executor
from slotd.repository.control import cancel_tasks_async, pause_type_async, resume_type_async

log = logging.getLogger("slotd.control")

CANCEL_BATCH = 1000


def operator() -> str:
    """`user@host` of this process: who a cancel or a pause is recorded as coming from."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user with no passwd entry
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def cancel(
    conn: Executor, task_id: int, *, by: str | None = None, schema: str | None = None
) -> bool:
    """Cancel one task. A pending one never runs; a running one is stopped by the replica
    holding it (ctx.cancelled, then the kill after the kill grace) and settled `cancelled`.
    Either way it is never retried and stays listed by `slotd dead list` until retention.
    False when there was no live task with that id (finished, dead, already cancelled)."""
    _task_id(task_id)
    who = by or operator()
    done = repository.cancel_tasks(conn, ids=[task_id], by=who, batch=1, schema=schema)
    _cancelled(done, who)
    return bool(done)


async def cancel_async(
    conn: Any, task_id: int, *, by: str | None = None, schema: str | None = None
) -> bool:
    """cancel from asyncio: a psycopg AsyncConnection or AsyncCursor, or a SQLAlchemy
    AsyncSession or AsyncConnection; in its transaction."""
    _task_id(task_id)
    target = await async_target(conn, "slotd.cancel_async")
    who = by or operator()
    done = await cancel_tasks_async(target, ids=[task_id], by=who, batch=1, schema=schema)
    _cancelled(done, who)
    return bool(done)


def _task_id(task_id: object) -> None:
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise TypeError(f"task_id must be an int, not {type(task_id).__name__}")


def _cancelled(done: list[CancelledTask], who: str) -> None:
    for task in done:
        log.info(
            "cancelled task %s#%s%s by %s",
            task.task_type,
            task.id,
            " (running: its replica stops it)" if task.running else "",
            who,
            extra={"task_id": task.id, "task_type": task.task_type, "by": who},
        )


def cancel_matching(
    conn: psycopg.Connection[Any],
    *,
    ids: Sequence[int] | None = None,
    task_type: str | None = None,
    key: str | None = None,
    by: str | None = None,
    batch: int = CANCEL_BATCH,
    first: Callable[[psycopg.Connection[Any]], Any] | None = None,
    schema: str | None = None,
) -> list[CancelledTask]:
    """Cancel every live task with these ids, or of this type (and key), for an operator's
    command (`slotd cancel`, the dashboard): on an autocommit connection, in batches that
    each commit, so cancelling a huge backlog never holds its row locks in one long
    transaction. `first` runs first in each batch's transaction (the dashboard's bounds).
    Returns what was cancelled."""
    if bool(ids) == (task_type is not None):
        raise ValueError("cancel: say which: ids, or a task type (and a key)")
    if key is not None and task_type is None:
        raise ValueError("cancel: a key needs its task type")
    who = by or operator()
    done: list[CancelledTask] = []
    while True:
        with conn.transaction():
            if first is not None:
                first(conn)
            found = repository.cancel_tasks(
                conn,
                ids=list(ids) if ids else None,
                task_type=task_type,
                key=key,
                by=who,
                batch=len(ids) if ids else batch,
                schema=schema,
            )
        done += found
        if ids or len(found) < batch:
            break
    if done:
        log.info(
            "cancelled %d task(s)%s by %s",
            len(done),
            f" of type {task_type}" + (f" with key {key}" if key is not None else "")
            if task_type
            else "",
            who,
            extra={"task_type": task_type, "by": who},
        )
    return done


def pause(
    conn: Executor,
    task_type: str,
    until: datetime | timedelta | None = None,
    *,
    by: str | None = None,
    schema: str | None = None,
) -> None:
    """Stop claims of `task_type` on every replica, until resumed or until `until` (a
    moment, or a duration from now). Running tasks of the type finish normally."""
    validate_type_name(task_type)
    at, for_seconds = _until(until)
    who = by or operator()
    repository.pause_type(conn, task_type, by=who, until=at, for_seconds=for_seconds, schema=schema)
    _paused(task_type, until, who)


async def pause_async(
    conn: Any,
    task_type: str,
    until: datetime | timedelta | None = None,
    *,
    by: str | None = None,
    schema: str | None = None,
) -> None:
    """pause from asyncio (see cancel_async)."""
    validate_type_name(task_type)
    at, for_seconds = _until(until)
    target = await async_target(conn, "slotd.pause_async")
    who = by or operator()
    await pause_type_async(
        target, task_type, by=who, until=at, for_seconds=for_seconds, schema=schema
    )
    _paused(task_type, until, who)


def _paused(task_type: str, until: datetime | timedelta | None, who: str) -> None:
    log.info(
        "paused task type %s%s by %s",
        task_type,
        f" until {until}" if until is not None else "",
        who,
        extra={"task_type": task_type, "by": who},
    )


def resume(
    conn: Executor, task_type: str, *, by: str | None = None, schema: str | None = None
) -> bool:
    """Let claims of `task_type` go on; True when it was paused."""
    validate_type_name(task_type)
    who = by or operator()
    was = repository.resume_type(conn, task_type, by=who, schema=schema)
    if was:
        log.info("resumed task type %s by %s", task_type, who, extra={"task_type": task_type})
    return bool(was)


async def resume_async(
    conn: Any, task_type: str, *, by: str | None = None, schema: str | None = None
) -> bool:
    """resume from asyncio (see cancel_async)."""
    validate_type_name(task_type)
    target = await async_target(conn, "slotd.resume_async")
    who = by or operator()
    was = await resume_type_async(target, task_type, by=who, schema=schema)
    if was:
        log.info("resumed task type %s by %s", task_type, who, extra={"task_type": task_type})
    return bool(was)


def _until(until: datetime | timedelta | None) -> tuple[datetime | None, float | None]:
    if until is None:
        return None, None
    if isinstance(until, timedelta):
        if until <= timedelta(0):
            raise ValueError("pause: until must lie in the future")
        return None, until.total_seconds()
    if isinstance(until, datetime):
        if until.tzinfo is None:
            raise ValueError("pause: until must be timezone-aware (a naive time is ambiguous)")
        return until, None
    raise TypeError(f"pause: until must be a datetime or a timedelta, not {type(until).__name__}")
