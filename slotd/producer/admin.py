"""An application's look at and hand on its tasks, from Python: list them (`tasks`), send a
dead letter back to the start (`retry`) or delete it (`purge`). Each runs in the caller's
transaction (a psycopg Connection or Cursor, or a SQLAlchemy Session or Connection; the
`_async` variants take their asyncio counterparts) and never commits it."""

from __future__ import annotations

from typing import Any

from slotd.producer.targets import async_target, sync_target
from slotd.repository import admin
from slotd.repository.admin import TaskInfo
from slotd.repository.named import resolve_schema


def tasks(
    conn: Any,
    *,
    type: str | None = None,  # noqa: A002 - the contract's name, as in `slotd tasks --type`
    state: str | None = None,
    key: str | None = None,
    tag: str | None = None,
    limit: int = 100,
    before: int | None = None,
    schema: str | None = None,
) -> list[TaskInfo]:
    """Tasks matching every filter given, newest first, at most `limit`: live ones and dead
    letters (a succeeded task is gone from the queue; see slotd.result). `state`: one of
    scheduled, pending, running, retrying, waiting, failed, cancelled, expired. `before`:
    only ids below it, for the next page (the last id of this one)."""
    params = admin.list_params(type, state, key, tag, limit, before)
    return admin.task_list(sync_target(conn, "slotd.tasks"), params, resolve_schema(schema))


async def tasks_async(
    conn: Any,
    *,
    type: str | None = None,  # noqa: A002
    state: str | None = None,
    key: str | None = None,
    tag: str | None = None,
    limit: int = 100,
    before: int | None = None,
    schema: str | None = None,
) -> list[TaskInfo]:
    """tasks from asyncio."""
    params = admin.list_params(type, state, key, tag, limit, before)
    target = await async_target(conn, "slotd.tasks_async")
    return await admin.task_list_async(target, params, resolve_schema(schema))


def retry(conn: Any, task_id: int, *, schema: str | None = None) -> bool:
    """A dead letter (failed, cancelled, expired, discarded) back to the start: attempts
    reset, due now. False when there is no dead letter with that id, or a live task holds
    its key (the live one wins: reviving both would run the key twice)."""
    return admin.retry_one(sync_target(conn, "slotd.retry"), task_id, resolve_schema(schema))


async def retry_async(conn: Any, task_id: int, *, schema: str | None = None) -> bool:
    target = await async_target(conn, "slotd.retry_async")
    return await admin.retry_one_async(target, task_id, resolve_schema(schema))


def purge(conn: Any, task_id: int, *, schema: str | None = None) -> bool:
    """Delete a dead letter now, rather than at retention. False when there is none with
    that id (a live task is never purged: cancel it first)."""
    return admin.purge_one(sync_target(conn, "slotd.purge"), task_id, resolve_schema(schema))


async def purge_async(conn: Any, task_id: int, *, schema: str | None = None) -> bool:
    target = await async_target(conn, "slotd.purge_async")
    return await admin.purge_one_async(target, task_id, resolve_schema(schema))
