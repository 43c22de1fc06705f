"""A task's result, read or awaited by id (slotd.result, slotd.wait_result).

Waiting is one LISTEN, never a polling loop: every statement that ends a task sends its id
on the result channel (sql `settled_kept`, the dead-lettering `failed_answer` and
`release`, `cancel`, `settle_cancelled`), and the waiter reads the state again only when its
own id arrives. A notification is delivered to a session only between transactions, so
the wait listens on the caller's connection only when that is an idle autocommit session;
otherwise (inside a transaction, or a session that is not autocommit) it opens a dedicated
connection with the same parameters for the wait and closes it after. Behind a
transaction-mode pooler (PgBouncer) LISTEN does not hold: set SLOTD_DATABASE_URL_LISTEN (or
pass listen_url=) to a direct URL, as the daemon's own LISTEN does.

A plain success (a type without keep_result) sends nothing: the notification takes a
cluster-wide lock at commit, which plain tasks do not pay for. Awaiting such a task ends
at the timeout (then None once it is gone)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from slotd.producer.targets import async_target, sync_target
from slotd.repository import results as store
from slotd.repository.named import channel, resolve_schema
from slotd.repository.states import STATES, TERMINAL

__all__ = ["STATES", "TERMINAL", "Attempt", "TaskResult", "result", "wait_result"]


@dataclass(frozen=True)
class Attempt:
    """One attempt of a task (sql/030): its number as its claim counted it (Task.attempt),
    its outcome (slotd_task_outcomes_total's names; None while it runs), its error with the
    traceback (or the reason of a cancel or a lapse), when it started and ended, and the
    worker that ran it ("host:pid:slot", the replica's pid; None when nobody can say)."""

    number: int
    outcome: str | None
    error: str | None
    started_at: datetime | None
    ended_at: datetime | None
    worker: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "outcome": self.outcome,
            "error": self.error,
            "started_at": None if self.started_at is None else self.started_at.isoformat(),
            "ended_at": None if self.ended_at is None else self.ended_at.isoformat(),
            "worker": self.worker,
        }


@dataclass(frozen=True)
class TaskResult:
    state: str
    value: Any = None  # succeeded, with keep_result: the stored return value
    error: str | None = None  # failed: the last error; cancelled / expired: the reason
    # Every attempt that ran, oldest first (the running one last), while it is answerable.
    # Not compared: two answers about the same end are equal whoever ran it.
    attempts: tuple[Attempt, ...] = field(default=(), compare=False)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


def _worker(host: str | None, pid: int | None, slot: int | None) -> str | None:
    if host is None:
        return None
    return ":".join(str(part) for part in (host, pid, slot) if part is not None)


def _attempts(rows: list[store.AttemptRow]) -> tuple[Attempt, ...]:
    return tuple(Attempt(n, o, e, s, d, _worker(h, p, sl)) for n, o, e, s, d, h, p, sl in rows)


def attempts(conn: Any, task_id: int, *, schema: str | None = None) -> tuple[Attempt, ...]:
    """The task's attempts as slotd remembers them, whether or not it is answerable
    (Django's results read them beside their own row)."""
    return _attempts(store.attempts_of(conn, task_id, schema=schema))


def _read(conn: Any, task_id: int, schema: str | None) -> TaskResult | None:
    row = store.result_of(conn, task_id, schema=schema)
    if row is None:
        return None
    return TaskResult(*row, _attempts(store.attempts_of(conn, task_id, schema=schema)))


async def _read_async(conn: Any, task_id: int, schema: str | None) -> TaskResult | None:
    row = await store.result_of_async(conn, task_id, schema=schema)
    if row is None:
        return None
    attempts = await store.attempts_of_async(conn, task_id, schema=schema)
    return TaskResult(*row, _attempts(attempts))


def result(conn: Any, task_id: int, *, schema: str | None = None) -> TaskResult | None:
    """The task's state now; None when there never was such a task or it is gone (a
    success without keep_result, a result past it, a dead letter past retention).
    `schema`: the queue's (None: SLOTD_SCHEMA, else public)."""
    target = sync_target(conn, "slotd.result")
    return _read(target, int(task_id), schema)


async def result_async(conn: Any, task_id: int, *, schema: str | None = None) -> TaskResult | None:
    target = await async_target(conn, "slotd.result_async")
    return await _read_async(target, int(task_id), schema)


def _listen_url(listen_url: str | None) -> str | None:
    return listen_url or os.environ.get("SLOTD_DATABASE_URL_LISTEN") or None


def _own_session(conn: Any) -> bool:
    """LISTEN works here only on an idle autocommit session: in a transaction (or a
    session that opens one implicitly) notifications wait for a commit that is not ours."""
    idle = psycopg.pq.TransactionStatus.IDLE
    return bool(conn.autocommit) and conn.info.transaction_status == idle


def wait_result(
    conn: Any,
    task_id: int,
    timeout: float = 30.0,
    *,
    listen_url: str | None = None,
    schema: str | None = None,
) -> TaskResult | None:
    """Block until the task reaches a terminal state (succeeded, failed, cancelled,
    expired) and return its TaskResult; None when it is gone or never existed. Raises
    TimeoutError when `timeout` seconds pass first. See the module's note on connections."""
    schema = resolve_schema(schema)
    target = sync_target(conn, "slotd.wait_result")
    base = target if isinstance(target, psycopg.Connection) else target.connection
    url = _listen_url(listen_url)
    if url is None and _own_session(base):
        return _wait_on(base, int(task_id), timeout, own=True, schema=schema)
    if url is not None:
        dedicated = psycopg.connect(url, autocommit=True)
    else:
        dedicated = psycopg.connect(base.info.dsn, password=base.info.password, autocommit=True)
    with dedicated:
        return _wait_on(dedicated, int(task_id), timeout, own=False, schema=schema)


def _wait_on(
    conn: psycopg.Connection[Any], task_id: int, timeout: float, *, own: bool, schema: str
) -> TaskResult | None:
    until = time.monotonic() + timeout
    # before the first read: an end between the two is heard
    store.listen_results(conn, schema=schema)
    results = channel(store.RESULT_CHANNEL, schema)
    try:
        current = _read(conn, task_id, schema)
        while current is not None and not current.done:
            left = until - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"task {task_id} is still {current.state} after {timeout}s")
            for note in conn.notifies(timeout=left):
                if note.channel == results and note.payload == str(task_id):
                    break
            current = _read(conn, task_id, schema)
        return current
    finally:
        if own and not conn.closed:
            store.listen_results(conn, on=False, schema=schema)


async def wait_result_async(
    conn: Any,
    task_id: int,
    timeout: float = 30.0,
    *,
    listen_url: str | None = None,
    schema: str | None = None,
) -> TaskResult | None:
    """wait_result for asyncio: the loop runs on meanwhile."""
    schema = resolve_schema(schema)
    target = await async_target(conn, "slotd.wait_result_async")
    base = target if isinstance(target, psycopg.AsyncConnection) else target.connection
    url = _listen_url(listen_url)
    if url is None and _own_session(base):
        return await _wait_on_async(base, int(task_id), timeout, own=True, schema=schema)
    if url is not None:
        dedicated = await psycopg.AsyncConnection.connect(url, autocommit=True)
    else:
        dedicated = await psycopg.AsyncConnection.connect(
            base.info.dsn, password=base.info.password, autocommit=True
        )
    async with dedicated:
        return await _wait_on_async(dedicated, int(task_id), timeout, own=False, schema=schema)


async def _wait_on_async(
    conn: psycopg.AsyncConnection[Any], task_id: int, timeout: float, *, own: bool, schema: str
) -> TaskResult | None:
    until = time.monotonic() + timeout
    await store.listen_results_async(conn, schema=schema)
    results = channel(store.RESULT_CHANNEL, schema)
    try:
        current = await _read_async(conn, task_id, schema)
        while current is not None and not current.done:
            left = until - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"task {task_id} is still {current.state} after {timeout}s")
            async for note in conn.notifies(timeout=left):
                if note.channel == results and note.payload == str(task_id):
                    break
            current = await _read_async(conn, task_id, schema)
        return current
    finally:
        if own and not conn.closed:
            await store.listen_results_async(conn, on=False, schema=schema)
