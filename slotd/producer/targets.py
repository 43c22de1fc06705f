"""What a producer may hand to enqueue: a psycopg connection or cursor, or a SQLAlchemy 2
session or connection on the psycopg driver, which is unwrapped to the psycopg connection
inside its transaction. SQLAlchemy is recognised by the module of the object's type, so it
is never imported here unless the caller already uses it."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from typing import Any

import psycopg

from slotd.repository import AsyncExecutor, Executor

SYNC_ACCEPTED = (
    "a psycopg Connection or Cursor, or a SQLAlchemy Session or Connection "
    "on the psycopg driver (postgresql+psycopg://)"
)
ASYNC_ACCEPTED = (
    "a psycopg AsyncConnection or AsyncCursor, or a SQLAlchemy AsyncSession or "
    "AsyncConnection on the psycopg driver (postgresql+psycopg://)"
)


def _name(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _from(obj: object, package: str) -> bool:
    # The MRO, so that a project's own Session subclass is recognised too.
    return any(
        cls.__module__ == package or cls.__module__.startswith(package + ".")
        for cls in type(obj).__mro__
    )


def sync_target(obj: Any, api: str = "slotd.enqueue") -> Executor:
    """The psycopg connection or cursor to run the enqueue statement on."""
    if isinstance(obj, psycopg.Connection | psycopg.Cursor):
        return obj
    if isinstance(obj, psycopg.AsyncConnection | psycopg.AsyncCursor):
        raise TypeError(f"{api} got {_name(obj)}: use `await {api}_async(...)` on asyncio")
    if _from(obj, "sqlalchemy.ext.asyncio"):
        raise TypeError(f"{api} got {_name(obj)}: use `await {api}_async(...)` on asyncio")
    if _from(obj, "sqlalchemy"):
        return _sqlalchemy_sync(obj, api)
    raise TypeError(f"{api} takes {SYNC_ACCEPTED}; got {_name(obj)}")


async def async_target(obj: Any, api: str = "slotd.enqueue_async") -> AsyncExecutor:
    """The psycopg AsyncConnection or AsyncCursor to run the enqueue statement on."""
    if isinstance(obj, psycopg.AsyncConnection | psycopg.AsyncCursor):
        return obj
    sync_api = api.removesuffix("_async")
    if isinstance(obj, psycopg.Connection | psycopg.Cursor):
        raise TypeError(f"{api} got {_name(obj)}: use {sync_api}(...) on a sync connection")
    if _from(obj, "sqlalchemy"):
        return await _sqlalchemy_async(obj, api)
    raise TypeError(f"{api} takes {ASYNC_ACCEPTED}; got {_name(obj)}")


def _sqlalchemy_sync(obj: Any, api: str) -> Executor:
    # Not sqlalchemy.ext.asyncio: it needs greenlet, which sync-only projects lack.
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session, scoped_session

    if isinstance(obj, scoped_session):
        obj = obj()  # the registry's current Session
    if isinstance(obj, Session):
        # Begins the session's transaction if none is open (as session.execute would) and
        # returns the Connection it runs on.
        obj = obj.connection()
    if not isinstance(obj, Connection):
        raise TypeError(f"{api} takes {SYNC_ACCEPTED}; got {_name(obj)}")
    _check_driver(obj.dialect, api)
    if not obj.in_transaction():
        obj.begin()  # SQLAlchemy's autobegin, so the caller's commit() commits the task
    raw = obj.connection.dbapi_connection
    assert isinstance(raw, psycopg.Connection)
    return raw


async def _sqlalchemy_async(obj: Any, api: str) -> AsyncExecutor:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    if isinstance(obj, async_scoped_session):
        obj = obj()
    if isinstance(obj, AsyncSession):
        obj = await obj.connection()
    if not isinstance(obj, AsyncConnection):
        sync_api = api.removesuffix("_async")
        raise TypeError(
            f"{api} takes {ASYNC_ACCEPTED}; got {_name(obj)} (a sync SQLAlchemy object "
            f"goes to {sync_api})"
        )
    _check_driver(obj.dialect, api)
    if not obj.in_transaction():
        await obj.begin()
    raw = (await obj.get_raw_connection()).driver_connection
    assert isinstance(raw, psycopg.AsyncConnection)
    return raw


def _check_driver(dialect: Any, api: str) -> None:
    # The asyncio dialect is named psycopg too (dialect.is_async tells them apart).
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        raise TypeError(
            f"{api} needs SQLAlchemy's psycopg driver (postgresql+psycopg://); this engine "
            f"uses {dialect.name}+{dialect.driver}"
        )


def held(target: Executor) -> AbstractContextManager[Any]:
    """Around statements that must share one transaction (a lock taken by the first held to
    the commit): the caller's own, as it is; a transaction of its own on an autocommit
    connection. Never `transaction()` on a connection in a transaction's mode: with no
    statement run yet it would BEGIN and COMMIT the caller's transaction itself."""
    conn = target if isinstance(target, psycopg.Connection) else target.connection
    return conn.transaction() if conn.autocommit else nullcontext()


def held_async(target: AsyncExecutor) -> AbstractAsyncContextManager[Any]:
    conn = target if isinstance(target, psycopg.AsyncConnection) else target.connection
    return conn.transaction() if conn.autocommit else nullcontext()


def savepoint(target: Executor) -> AbstractContextManager[Any]:
    """Around statements that stand or fall together (an after= enqueue's marks, insert and
    waits; a batch's block): a savepoint in the caller's transaction, so an error undoes
    these alone and leaves the caller's transaction usable; on an autocommit connection, a
    transaction of their own. psycopg's `transaction()` on a connection in a transaction's
    mode with nothing run yet would BEGIN and COMMIT by itself, so the task would exist
    whatever the caller then does: the caller's transaction is opened first (any statement
    opens it), and the savepoint nests in it, committed or rolled back with it."""
    conn = target if isinstance(target, psycopg.Connection) else target.connection
    if not conn.autocommit and conn.info.transaction_status == _IDLE:
        conn.execute("SELECT 1")
    return conn.transaction()


async def savepoint_async(target: AsyncExecutor) -> AbstractAsyncContextManager[Any]:
    """`savepoint` on an asyncio connection: awaited for the context manager."""
    conn = target if isinstance(target, psycopg.AsyncConnection) else target.connection
    if not conn.autocommit and conn.info.transaction_status == _IDLE:
        await conn.execute("SELECT 1")
    return conn.transaction()


_IDLE = psycopg.pq.TransactionStatus.IDLE
