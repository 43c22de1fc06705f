"""The producer's API: tasks written inside the caller's own transaction, from sync code or
from asyncio, on psycopg or on a SQLAlchemy session (see slotd.targets)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from slotd import integrations, repository
from slotd.config import max_attempts_from_env, max_attempts_value, priority_step
from slotd.producer import debounce as debouncing
from slotd.producer import sequences
from slotd.producer.targets import (
    async_target,
    held_async,
    savepoint,
    savepoint_async,
    sync_target,
)
from slotd.repository import NewTask
from slotd.repository.batches import join_batch, join_batch_async
from slotd.repository.dependencies import (
    mark_parents,
    mark_parents_async,
    parent_ids,
    wait_on,
    wait_on_async,
)
from slotd.repository.named import resolve_schema
from slotd.typed.ids import EnqueuedId
from slotd.upgrade import guard as upgrades

# Eager mode (slotd.testing) swaps this for a function that also runs the handler inline;
# everything else goes straight to the repository. It gets the psycopg connection or
# cursor the rows were written on.
_hook: Any = None
_held: list[tuple[Any, list[int], str]] | None = None


def _announce(target: Any, ids: list[int], schema: str) -> None:
    if _hook is None:
        return
    if _held is not None:
        _held.append((target, ids, schema))
    else:
        _hook(target, ids, schema)


def test_mode_active() -> bool:
    """A test mode (slotd.testing) hooks enqueue: eager mode has run the task by the time
    enqueue returns, so an integration returns what it reads then (Django's TaskResult)."""
    return _hook is not None


@contextmanager
def hooks_held() -> Iterator[None]:
    """Hold the test modes' enqueue hook until the block ends without an error: for an
    integration whose task needs rows it writes after the queue row (slotd.contrib.django's
    result row), so eager mode runs the task only once they exist."""
    global _held
    outer, _held = _held, []
    try:
        yield
        held = _held
    finally:
        _held = outer
    for target, ids, schema in held:
        _announce(target, ids, schema)


def _attempts(max_attempts: int | None) -> dict[str, Any]:
    """The threshold stamped at enqueue. An explicit max_attempts= is kept for good; without
    one the stamp is provisional (this process's SLOTD_MAX_ATTEMPTS, read and refused the
    same way the worker reads it) and the claiming worker stamps its own."""
    if max_attempts is None:
        return {"max_attempts": max_attempts_from_env(), "explicit": False}
    return {"max_attempts": max_attempts_value(max_attempts), "explicit": True}


def _rows(
    items: Iterable[NewTask | tuple[Any, ...]], parents: list[int] | None = None
) -> list[NewTask]:
    """The items as NewTask rows. With after= (`parents`), refused in the caller's frame
    where a dependant cannot be what it asks: a key (a live task found by its key would be
    made to wait on parents it never had) or a delay (a dependant is due when its last
    parent succeeds; see README, Dependencies)."""
    rows = [item if isinstance(item, NewTask) else NewTask(*item) for item in items]
    for row in rows if parents else ():
        if row.key is not None:
            raise ValueError(
                f"task {row.task_type!r}: after= cannot be combined with key= (enqueue the"
                " dependant without a key)"
            )
        if row.delay:
            raise ValueError(
                f"task {row.task_type!r}: after= cannot be combined with delay= (a dependant"
                " is due when its last parent succeeds)"
            )
    return rows


def _sending(rows: list[NewTask]) -> AbstractContextManager[Any]:
    """The enqueue's PRODUCER span and the trace context its rows carry (slotd.tracing):
    None (nothing stored) without opentelemetry-api or an active span."""
    tracing = integrations.tracing() if rows else None
    return nullcontext() if tracing is None else tracing.sending(rows)


def _expiring(rows: list[NewTask], expires_in: timedelta | float | None) -> list[NewTask]:
    """The call's expires_in on each row that has none of its own."""
    if expires_in is None:
        return rows
    return [r if r.expires_in is not None else replace(r, expires_in=expires_in) for r in rows]


def enqueue_many(
    conn: Any,
    items: Iterable[NewTask | tuple[Any, ...]],
    *,
    max_attempts: int | None = None,
    unique: str = "live",
    schema: str | None = None,
    after: Sequence[int] | None = None,
    expires_in: timedelta | float | None = None,
) -> list[EnqueuedId]:
    """Write tasks in the caller's transaction; slotd never commits it. The wake is sent by
    the same statement, so it reaches the workers only if the transaction commits.

    `schema`: the queue's schema (None: SLOTD_SCHEMA, else public).

    `conn`: a psycopg Connection or Cursor, or a SQLAlchemy Session or Connection on the
    psycopg driver (the rows join the session's transaction: its commit commits them).

    `unique` (for keyed items; a NewTask's own `unique` wins): "live" dedupes against a
    pending or running task with the key, "pending" only against one not started yet.

    `after`: task ids that must all succeed before these run (UnknownParents when one is
    not live; see README, Dependencies).

    `expires_in` (a NewTask's own wins): a task not started within this long of the
    enqueue never starts; it ends a dead letter with reason "expired"."""
    target = sync_target(conn, "slotd.enqueue_many")
    parents = parent_ids(after)
    rows = _expiring(_rows(items, parents), expires_in)
    return write_many(target, rows, parents, max_attempts, unique, resolve_schema(schema))


def write_many(
    target: Any,
    rows: list[NewTask],
    parents: list[int],
    max_attempts: int | None,
    unique: str,
    schema: str,
    batch_id: int | None = None,
) -> list[EnqueuedId]:
    """enqueue_many's writes, on a target and schema already resolved; `batch_id`: the rows
    join that batch (slotd.batch, whose block holds the transaction)."""
    names = sequences.names_of(rows, parents)
    marks = debouncing.checked(rows, parents, batch_id)
    with upgrades.migrated(), _sending(rows) as send:
        trace = send.context if send else None
        insert = {
            **_attempts(max_attempts),
            "priority_step": priority_step(),
            "trace": trace,
            "unique": unique,
            "schema": schema,
        }
        if any(marks):  # under each debounced key's lock (slotd/producer/debounce.py)
            ids = debouncing.write(target, rows, marks, insert, schema)
        elif not parents and any(names):
            # Sequences (sql/080): their rows locked and places drawn before the insert.
            with sequences.entered(target, names, schema) as place:
                ids = repository.enqueue_many(target, rows, **insert)
                place(ids)
        elif not parents:
            ids = repository.enqueue_many(target, rows, **insert)
        else:
            # One savepoint inside the caller's transaction: the parents are marked and
            # locked first, and a dependant is never seen due.
            with savepoint(target):
                mark_parents(target, parents, schema=schema)
                ids = repository.enqueue_many(target, rows, **insert)
                wait_on(target, ids, parents, schema=schema)
        if batch_id is not None:
            join_batch(target, batch_id, ids, schema=schema)
        if send:
            send.sent(ids)
    if not parents:  # a dependant is run by its last parent's success, never at enqueue
        _announce(target, ids, schema)
    return ids


def enqueue(
    conn: Any,
    task_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    delay: timedelta | float | None = None,
    key: str | None = None,
    max_attempts: int | None = None,
    priority: int = 0,
    group: str | None = None,
    unique: str = "live",
    schema: str | None = None,
    after: Sequence[int] | None = None,
    expires_in: timedelta | float | None = None,
    run_at: datetime | None = None,
    tags: Sequence[str] | None = None,
    sequence: str | None = None,
    debounce: timedelta | float | None = None,
    debounce_max: timedelta | float | None = None,
    debounce_keep: str = "last",
) -> EnqueuedId:
    """Write one task and return its id, or the id of the live row with the same key
    (unique="pending": of the row with the key that has not started; a running one lets
    this one queue behind it); the id's `.created` is False in that case. `priority`
    (-100..100, higher sooner) is a head start of priority x SLOTD_PRIORITY_STEP; `group`
    is what max_running_per_group and rate_per_group count; `expires_in`: see
    enqueue_many. `after`: task ids that must all succeed first (see enqueue_many).
    `run_at`: due at this aware datetime (not with `delay`; naive is a ValueError);
    `tags`: strings to find it by (slotd.tasks(tag=...)). `sequence`: the tasks of one
    sequence run one at a time, across the fleet, in the order their enqueues committed
    (docs/how-to/order.md). `debounce` (with `key`): one run, this long after the key's
    last enqueue, with the last payload (`debounce_keep="first"`: the first), at most
    `debounce_max` after the burst's first enqueue; every enqueue of the burst returns the
    same id, one while it runs queues one more (docs/how-to/order.md)."""
    target = sync_target(conn, "slotd.enqueue")
    new = NewTask(
        task_type,
        payload,
        delay,
        key,
        priority,
        group,
        unique,
        expires_in,
        run_at,
        tags,
        sequence,
        debounce,
        debounce_max,
        debounce_keep,
    )
    return enqueue_many(target, [new], max_attempts=max_attempts, schema=schema, after=after)[0]


async def enqueue_many_async(
    conn: Any,
    items: Iterable[NewTask | tuple[Any, ...]],
    *,
    max_attempts: int | None = None,
    unique: str = "live",
    schema: str | None = None,
    after: Sequence[int] | None = None,
    expires_in: timedelta | float | None = None,
) -> list[EnqueuedId]:
    """enqueue_many from asyncio: a psycopg AsyncConnection or AsyncCursor, or a SQLAlchemy
    AsyncSession or AsyncConnection on the psycopg driver. Same statement, same rules."""
    target = await async_target(conn, "slotd.enqueue_many_async")
    parents = parent_ids(after)
    rows = _expiring(_rows(items, parents), expires_in)
    schema = resolve_schema(schema)
    return await write_many_async(target, rows, parents, max_attempts, unique, schema)


async def write_many_async(
    target: Any,
    rows: list[NewTask],
    parents: list[int],
    max_attempts: int | None,
    unique: str,
    schema: str,
    batch_id: int | None = None,
) -> list[EnqueuedId]:
    """write_many from asyncio."""
    names = sequences.names_of(rows, parents)
    marks = debouncing.checked(rows, parents, batch_id)
    with upgrades.migrated(), _sending(rows) as send:
        trace = send.context if send else None
        insert = {
            **_attempts(max_attempts),
            "priority_step": priority_step(),
            "trace": trace,
            "unique": unique,
            "schema": schema,
        }
        if any(marks):
            ids = await debouncing.write_async(target, rows, marks, insert, schema)
        elif not parents and any(names):
            async with held_async(target):
                places = await sequences.enter_async(target, names, schema)
                ids = await repository.enqueue_many_async(target, rows, **insert)
                await sequences.join_async(target, ids, names, places, schema)
        elif not parents:
            ids = await repository.enqueue_many_async(target, rows, **insert)
        else:
            async with await savepoint_async(target):
                await mark_parents_async(target, parents, schema=schema)
                ids = await repository.enqueue_many_async(target, rows, **insert)
                await wait_on_async(target, ids, parents, schema=schema)
        if batch_id is not None:
            await join_batch_async(target, batch_id, ids, schema=schema)
        if send:
            send.sent(ids)
    if not parents:
        _announce(target, ids, schema)
    return ids


async def enqueue_async(
    conn: Any,
    task_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    delay: timedelta | float | None = None,
    key: str | None = None,
    max_attempts: int | None = None,
    priority: int = 0,
    group: str | None = None,
    unique: str = "live",
    schema: str | None = None,
    after: Sequence[int] | None = None,
    expires_in: timedelta | float | None = None,
    run_at: datetime | None = None,
    tags: Sequence[str] | None = None,
    sequence: str | None = None,
    debounce: timedelta | float | None = None,
    debounce_max: timedelta | float | None = None,
    debounce_keep: str = "last",
) -> EnqueuedId:
    """enqueue from asyncio; see enqueue and enqueue_many_async."""
    target = await async_target(conn, "slotd.enqueue_async")
    new = NewTask(
        task_type,
        payload,
        delay,
        key,
        priority,
        group,
        unique,
        expires_in,
        run_at,
        tags,
        sequence,
        debounce,
        debounce_max,
        debounce_keep,
    )
    many = enqueue_many_async(target, [new], max_attempts=max_attempts, schema=schema, after=after)
    return (await many)[0]
