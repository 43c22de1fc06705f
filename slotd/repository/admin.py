"""An application's look at and hand on its tasks (slotd.tasks, slotd.retry, slotd.purge),
in the caller's transaction, from sync code or asyncio: the statements `task_list`,
`dead_retry`, `dead_purge` (sql/queries.sql) and what their rows become."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slotd.config import priority_step
from slotd.repository.named import AsyncExecutor, Executor, _sql, resolve_schema
from slotd.repository.states import STATES as ALL_STATES
from slotd.repository.states import State

# The states a queue row can be in (sql `task_state`): a succeeded task has no row.
STATES = tuple(s for s in ALL_STATES if s != State.SUCCEEDED)
LIMIT_MAX = 10_000


@dataclass(frozen=True)
class TaskInfo:
    """One task as slotd.tasks lists it. `attempts`: the attempts it really ran;
    `run_at`: when it is (was) due, None while it waits on parents; `dead_reason`: why a
    dead letter stopped (exhausted, cancelled, expired, parent_failed, discarded)."""

    id: int
    type: str
    key: str | None
    state: str
    payload: dict[str, Any]
    tags: list[str]
    priority: int
    group: str | None
    attempts: int
    max_attempts: int
    run_at: datetime | None
    created_at: datetime
    last_error: str | None
    dead_reason: str | None


def list_params(
    task_type: str | None,
    state: str | None,
    key: str | None,
    tag: str | None,
    limit: int,
    before: int | None = None,
) -> dict[str, Any]:
    """The filters, checked before anything is sent."""
    if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
        raise TypeError("tasks: before must be a task id (an int)")
    if state is not None and state not in STATES:
        raise ValueError(f"tasks: state must be one of {', '.join(STATES)}; not {state!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIMIT_MAX:
        raise ValueError(f"tasks: limit must be a whole number from 1 to {LIMIT_MAX}")
    for name, value in (("type", task_type), ("key", key), ("tag", tag)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"tasks: {name} must be a string")
    return {
        "task_type": task_type,
        "state": state,
        "key": key,
        "tag": tag,
        "limit": limit,
        "before": before,
    }


def _info(row: tuple[Any, ...]) -> TaskInfo:
    fields = list(row)
    fields[5] = list(fields[5] or [])  # tags: [] for none
    return TaskInfo(*fields)


def task_list(target: Executor, params: dict[str, Any], schema: str) -> list[TaskInfo]:
    return [_info(r) for r in target.execute(_sql("task_list", schema), params).fetchall()]


def tasks_tagged(
    conn: Executor,
    tag: str,
    *,
    task_type: str | None = None,
    state: str | None = None,
    before: int | None = None,
    limit: int = 50,
    schema: str | None = None,
) -> list[TaskInfo]:
    """The dashboard's search by tag: one page of the tasks carrying `tag` (live ones and
    dead letters), newest first, found through the tags index (sql/040); the next page is
    `before=` the last one's id. `conn`: a psycopg Connection or Cursor (a read replica
    will do: it only reads)."""
    if not isinstance(tag, str) or not tag:
        raise ValueError("tasks_tagged: give the tag to search for")
    params = list_params(task_type, state, None, tag, limit, before)
    return task_list(conn, params, resolve_schema(schema))


async def task_list_async(
    target: AsyncExecutor, params: dict[str, Any], schema: str
) -> list[TaskInfo]:
    cur = await target.execute(_sql("task_list", schema), params)
    return [_info(r) for r in await cur.fetchall()]


def _one(task_id: int) -> dict[str, Any]:
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise TypeError(f"task_id must be an int, not {type(task_id).__name__}")
    return {"task_type": None, "ids": [int(task_id)], "batch": 1, "older_than_s": None}


def retry_one(target: Executor, task_id: int, schema: str) -> bool:
    """A dead letter back to the start (sql `dead_retry`); False: no dead letter with that
    id, or a live task holds its key."""
    params, lock = _purge(task_id)  # the sequence's lock first, as for a purge
    target.execute(_sql("sequence_lock_targets", schema), lock)
    return bool(target.execute(_sql("dead_retry", schema), params).fetchall())


async def retry_one_async(target: AsyncExecutor, task_id: int, schema: str) -> bool:
    params, lock = _purge(task_id)
    await target.execute(_sql("sequence_lock_targets", schema), lock)
    cur = await target.execute(_sql("dead_retry", schema), params)
    return bool(await cur.fetchall())


def _purge(task_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """dead_purge's parameters, and those of the sequence lock taken before it (sql/080:
    a purged member that halted its sequence lets it go on)."""
    params = {**_one(task_id), "step_s": priority_step().total_seconds()}
    return params, {"ids": params["ids"], "task_type": None, "key": None, "dead": True}


def purge_one(target: Executor, task_id: int, schema: str) -> bool:
    """A dead letter deleted (sql `dead_purge`); False: no dead letter with that id."""
    params, lock = _purge(task_id)
    target.execute(_sql("sequence_lock_targets", schema), lock)
    return int(target.execute(_sql("dead_purge", schema), params).fetchall()[0][0]) == 1


async def purge_one_async(target: AsyncExecutor, task_id: int, schema: str) -> bool:
    params, lock = _purge(task_id)
    await target.execute(_sql("sequence_lock_targets", schema), lock)
    cur = await target.execute(_sql("dead_purge", schema), params)
    return int((await cur.fetchall())[0][0]) == 1
