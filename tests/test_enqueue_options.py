"""Enqueue options of #40 against a real PostgreSQL: run_at (an absolute, aware start),
tags (stored, indexed), and the returned id's `.created` (False when the enqueue deduped)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import slotd


def _row(conn: psycopg.Connection[Any], task_id: int) -> tuple[Any, ...]:
    sql = "SELECT run_at, order_at, tags FROM slotd_tasks WHERE id = %s"
    return conn.execute(sql, (task_id,)).fetchone()


def test_run_at_is_the_due_time_and_a_naive_one_is_refused(conn: psycopg.Connection[Any]) -> None:
    berlin = timezone(timedelta(hours=1))
    when = datetime(2031, 5, 1, 9, 30, tzinfo=berlin)
    tid = slotd.enqueue(conn, "report", {}, run_at=when, priority=10)
    run_at, order_at, _ = _row(conn, tid)
    assert run_at == when
    assert order_at == when - timedelta(seconds=10)  # the priority's head start, as with delay
    past = datetime.now(UTC) - timedelta(hours=1)
    early = slotd.enqueue(conn, "report", {}, run_at=past)
    assert _row(conn, early)[0] == past  # due at once, and keeps its place in order
    count = conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()[0]
    with pytest.raises(ValueError, match=r"run_at must be an aware datetime"):
        slotd.enqueue(conn, "report", {}, run_at=datetime(2031, 5, 1, 9, 30))
    with pytest.raises(ValueError, match=r"give run_at or delay, not both"):
        slotd.enqueue(conn, "report", {}, run_at=when, delay=timedelta(minutes=1))
    with pytest.raises(TypeError, match=r"run_at must be a datetime"):
        slotd.enqueue(conn, "report", {}, run_at="2031-05-01")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"expires_in .* must be longer than the delay"):
        slotd.enqueue(conn, "report", {}, run_at=when, expires_in=timedelta(hours=1))
    assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()[0] == count


def test_created_tells_a_new_task_from_a_deduped_one(conn: psycopg.Connection[Any]) -> None:
    first = slotd.enqueue(conn, "sync", {}, key="user:7")
    again = slotd.enqueue(conn, "sync", {"n": 2}, key="user:7")
    assert isinstance(first, int) and first.created
    assert again == first and not again.created
    assert f"{again}" == str(int(first)) and again + 0 == first  # still a plain int to use
    many = slotd.enqueue_many(conn, [("sync", {}, None, "user:7"), ("sync", {}, None, "user:8")])
    assert [m.created for m in many] == [False, True] and many[0] == first
    # within one statement: the second row with a key dedupes onto the first
    both = slotd.enqueue_many(conn, [("sync", {}, None, "user:9"), ("sync", {}, None, "user:9")])
    assert both[0] == both[1] and [b.created for b in both] == [True, False]

    async def main() -> list[bool]:
        async with await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True) as a:
            one = await slotd.enqueue_async(a, "sync", {}, key="user:7")
            two = await slotd.enqueue_async(a, "sync", {}, key="user:10")
            return [one.created, two.created]

    assert asyncio.run(main()) == [False, True]


def test_tags_are_stored_deduplicated_and_checked(conn: psycopg.Connection[Any]) -> None:
    tid = slotd.enqueue(conn, "mail", {}, tags=["tenant:7", "signup", "tenant:7"])
    assert _row(conn, tid)[2] == ["tenant:7", "signup"]
    untagged = slotd.enqueue(conn, "mail", {})
    assert _row(conn, untagged)[2] is None
    with pytest.raises(TypeError, match=r"tags must be a list of strings"):
        slotd.enqueue(conn, "mail", {}, tags="tenant:7")
    with pytest.raises(ValueError, match=r"tag '' must be a non-empty string"):
        slotd.enqueue(conn, "mail", {}, tags=[""])
    with pytest.raises(ValueError, match=r"at most 32 tags"):
        slotd.enqueue(conn, "mail", {}, tags=[f"t{n}" for n in range(33)])
    found = conn.execute(
        "SELECT id FROM slotd_tasks WHERE tags @> ARRAY['tenant:7']::text[]"
    ).fetchall()
    assert found == [(tid,)]
