"""An enqueue is the caller's: in a connection in a transaction's mode (psycopg's default)
the task exists exactly when the caller commits, whatever the enqueue does inside (after=,
a batch, a sequence), even as the first statement of the caller's transaction."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

import slotd


def _count(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as other:
        return int(other.execute("SELECT count(*) FROM slotd_tasks").fetchone()[0])  # type: ignore[index]


def test_an_enqueue_after_parents_first_in_a_transaction_is_rolled_back_with_it(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    parent = slotd.enqueue(conn, "tx.parent", {})  # committed: an autocommit connection
    with psycopg.connect(db_url) as caller:  # a transaction's mode
        slotd.enqueue(caller, "tx.child", {}, after=[parent])  # its transaction's first
        assert caller.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert _count(db_url) == 1  # not visible before the caller commits
        caller.rollback()
    assert _count(db_url) == 1  # rolled back with the caller's transaction
    with psycopg.connect(db_url) as caller:
        slotd.enqueue(caller, "tx.child", {}, after=[parent])
        caller.commit()
    assert _count(db_url) == 2


def test_a_batch_first_in_a_transaction_is_rolled_back_with_it(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    slotd.enqueue(conn, "tx.parent", {})  # the schema migrated
    with psycopg.connect(db_url) as caller:
        with slotd.batch(caller, on_complete=("tx.done", {})) as members:
            members.enqueue("tx.member", {})
        assert _count(db_url) == 1
        caller.rollback()
    assert _count(db_url) == 1


def test_an_async_enqueue_after_parents_first_in_a_transaction_is_rolled_back_with_it(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    parent = slotd.enqueue(conn, "tx.parent", {})

    async def main(commit: bool) -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as caller:
            await slotd.enqueue_async(caller, "tx.child", {}, after=[parent])
            assert _count(db_url) == 1
            await (caller.commit() if commit else caller.rollback())

    asyncio.run(main(commit=False))
    assert _count(db_url) == 1
    asyncio.run(main(commit=True))
    assert _count(db_url) == 2
