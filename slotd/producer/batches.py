"""Batches: tasks enqueued together, and a callback task enqueued once every one of them
ended, with their counts (see README, Workflows: batches).

    with slotd.batch(conn, on_complete=("report", {"order": 7})) as b:
        b.enqueue("resize", {"image": 1})
        b.enqueue_many([("resize", {"image": n}) for n in range(2, 100)])

The block is one transaction (a savepoint inside the caller's, or the block's own on an
autocommit connection): the batch and its tasks become visible together when it commits,
sealed, so no task of it can end before the batch knows all of them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

from slotd.payload import encode
from slotd.producer import enqueue as producing
from slotd.producer.targets import async_target, savepoint, savepoint_async, sync_target
from slotd.registry import validate_type_name
from slotd.repository import NewTask
from slotd.repository.batches import (
    open_batch,
    open_batch_async,
    seal_batch,
    seal_batch_async,
)
from slotd.repository.dependencies import parent_ids
from slotd.repository.named import resolve_schema


def _callback(on_complete: object) -> tuple[str, str]:
    """on_complete as (type, payload JSON), refused in the caller's frame in one line."""
    if not isinstance(on_complete, tuple) or len(on_complete) != 2:
        raise TypeError("on_complete= takes a (task type, payload) pair")
    task_type, payload = on_complete
    validate_type_name(task_type)
    if payload is not None and not isinstance(payload, Mapping):
        raise TypeError(f"on_complete=: the payload of {task_type!r} must be a dict or None")
    if payload is not None and "batch" in payload:
        raise ValueError(
            f"on_complete=: the payload of {task_type!r} has a 'batch' key: slotd sets it"
            " to the batch's counts"
        )
    return task_type, encode(payload, f"task {task_type!r}")


def _members(items: Iterable[NewTask | tuple[Any, ...]], parents: list[int]) -> list[NewTask]:
    rows = producing._rows(items, parents)
    for row in rows:
        if row.key is not None:
            raise ValueError(
                f"task {row.task_type!r}: a batch's tasks take no key= (a key could return a"
                " task that is not the batch's)"
            )
    return rows


class _Members:
    def __init__(self, target: Any, batch_id: int, schema: str) -> None:
        self._target = target
        self.id = batch_id
        self._schema = schema
        self._open = True

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError(f"batch {self.id} is sealed: its block has ended")

    @staticmethod
    def _one(
        task_type: str,
        payload: Mapping[str, Any] | None,
        delay: timedelta | float | None,
        priority: int,
        group: str | None,
        key: str | None,
    ) -> NewTask:
        return NewTask(task_type, payload, delay, key, priority, group)


class Batch(_Members):
    """The tasks enqueued through it belong to batch `id`."""

    def enqueue(
        self,
        task_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        priority: int = 0,
        group: str | None = None,
        after: Sequence[int] | None = None,
        key: str | None = None,
    ) -> int:
        # key= is taken only to be refused as enqueue_many refuses it (a batch's task takes
        # none), rather than as Python's bare "unexpected keyword argument".
        new = self._one(task_type, payload, delay, priority, group, key)
        return self.enqueue_many([new], max_attempts=max_attempts, after=after)[0]

    def enqueue_many(
        self,
        items: Iterable[NewTask | tuple[Any, ...]],
        *,
        max_attempts: int | None = None,
        after: Sequence[int] | None = None,
    ) -> list[int]:
        self._check_open()
        parents = parent_ids(after)
        rows = _members(items, parents)
        return producing.write_many(
            self._target, rows, parents, max_attempts, "live", self._schema, self.id
        )


class AsyncBatch(_Members):
    """Batch from asyncio (slotd.batch_async)."""

    async def enqueue(
        self,
        task_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        priority: int = 0,
        group: str | None = None,
        after: Sequence[int] | None = None,
        key: str | None = None,
    ) -> int:
        new = self._one(task_type, payload, delay, priority, group, key)  # key=: refused
        return (await self.enqueue_many([new], max_attempts=max_attempts, after=after))[0]

    async def enqueue_many(
        self,
        items: Iterable[NewTask | tuple[Any, ...]],
        *,
        max_attempts: int | None = None,
        after: Sequence[int] | None = None,
    ) -> list[int]:
        self._check_open()
        parents = parent_ids(after)
        rows = _members(items, parents)
        return await producing.write_many_async(
            self._target, rows, parents, max_attempts, "live", self._schema, self.id
        )


@contextmanager
def batch(
    conn: Any,
    on_complete: tuple[str, Mapping[str, Any] | None],
    *,
    max_attempts: int | None = None,
    schema: str | None = None,
) -> Iterator[Batch]:
    """Tasks enqueued through the block's Batch belong to it; once the last of them ended
    (succeeded, failed, cancelled or expired) the `on_complete` task is enqueued, exactly
    once, in the transaction that settled that last task, with payload["batch"] =
    {"id", "succeeded", "failed", "cancelled", "expired"}. `max_attempts`: the callback's.
    An error in the block rolls the batch and its tasks back; the test modes' enqueue hook
    (eager mode) runs the tasks once the block has sealed it. `schema`: the queue's (None:
    SLOTD_SCHEMA, else public)."""
    task_type, payload = _callback(on_complete)
    schema = resolve_schema(schema)
    target = sync_target(conn, "slotd.batch")
    attempts = producing._attempts(max_attempts)
    with savepoint(target), producing.hooks_held():
        with producing.upgrades.migrated():
            batch_id = open_batch(target, task_type, payload, **attempts, schema=schema)
        members = Batch(target, batch_id, schema)
        try:
            yield members
        finally:
            members._open = False
        seal_batch(target, batch_id, schema=schema)


@asynccontextmanager
async def batch_async(
    conn: Any,
    on_complete: tuple[str, Mapping[str, Any] | None],
    *,
    max_attempts: int | None = None,
    schema: str | None = None,
) -> AsyncIterator[AsyncBatch]:
    """batch from asyncio: `async with slotd.batch_async(aconn, on_complete=...) as b:`
    then `await b.enqueue(...)`."""
    task_type, payload = _callback(on_complete)
    schema = resolve_schema(schema)
    target = await async_target(conn, "slotd.batch_async")
    attempts = producing._attempts(max_attempts)
    async with await savepoint_async(target):
        with producing.upgrades.migrated():
            batch_id = await open_batch_async(target, task_type, payload, **attempts, schema=schema)
        members = AsyncBatch(target, batch_id, schema)
        try:
            yield members
        finally:
            members._open = False
        await seal_batch_async(target, batch_id, schema=schema)
