"""The admin API of #40 against a real PostgreSQL: slotd.tasks (and `slotd tasks`) by type,
state, key and tag; retry and purge of dead letters from Python; the _async variants of
these and of cancel, pause and resume, each in the caller's transaction."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.repository import admin
from tests.daemon import ROOT


def _states(conn: psycopg.Connection[Any], **filters: Any) -> dict[int, str]:
    return {t.id: t.state for t in slotd.tasks(conn, **filters)}


def test_tasks_lists_by_type_state_key_and_tag(conn: psycopg.Connection[Any]) -> None:
    due = slotd.enqueue(conn, "mail", {"n": 1}, tags=["tenant:7"], key="m:1")
    later = slotd.enqueue(conn, "mail", {"n": 2}, delay=timedelta(hours=1), tags=["tenant:8"])
    other = slotd.enqueue(conn, "sms", {"n": 3}, tags=["tenant:7", "vip"])
    waiting = slotd.enqueue(conn, "sms", {"n": 4}, after=[other])
    gone = slotd.enqueue(conn, "mail", {"n": 5})
    assert slotd.cancel(conn, gone)

    assert _states(conn) == {
        gone: "cancelled",
        waiting: "waiting",
        other: "pending",
        later: "scheduled",
        due: "pending",
    }
    assert [t.id for t in slotd.tasks(conn)] == [gone, waiting, other, later, due]  # newest first
    assert set(_states(conn, tag="tenant:7")) == {due, other}
    assert set(_states(conn, type="mail", state="pending")) == {due}
    assert set(_states(conn, state="cancelled")) == {gone}
    assert set(_states(conn, key="m:1")) == {due}
    assert _states(conn, tag="nobody") == {}
    assert len(slotd.tasks(conn, limit=2)) == 2
    [info] = slotd.tasks(conn, tag="vip")
    assert (info.type, info.payload, info.tags, info.attempts, info.key) == (
        "sms",
        {"n": 3},
        ["tenant:7", "vip"],
        0,
        None,
    )
    assert slotd.tasks(conn, type="sms", state="waiting")[0].run_at is None
    with pytest.raises(ValueError, match=r"state must be one of scheduled, pending"):
        slotd.tasks(conn, state="done")
    with pytest.raises(ValueError, match=r"limit must be a whole number"):
        slotd.tasks(conn, limit=0)


def test_the_dashboards_search_by_tag_pages_newest_first(conn: psycopg.Connection[Any]) -> None:
    # slotd.repository.admin.tasks_tagged: the query the dashboard's tag search calls.
    ids = [slotd.enqueue(conn, "mail", {"n": n}, tags=["tenant:7"]) for n in range(5)]
    slotd.enqueue(conn, "mail", {"n": 9}, tags=["tenant:8"])
    first = admin.tasks_tagged(conn, "tenant:7", limit=2)
    assert [t.id for t in first] == [ids[4], ids[3]]
    rest = admin.tasks_tagged(conn, "tenant:7", before=first[-1].id, limit=10)
    assert [t.id for t in rest] == [ids[2], ids[1], ids[0]]
    assert admin.tasks_tagged(conn, "tenant:7", before=ids[0]) == []
    assert [t.id for t in slotd.tasks(conn, tag="tenant:7", before=ids[2])] == ids[1::-1]
    slotd.cancel(conn, ids[1])
    assert [t.id for t in admin.tasks_tagged(conn, "tenant:7", state="cancelled")] == [ids[1]]
    with pytest.raises(ValueError, match=r"give the tag"):
        admin.tasks_tagged(conn, "")
    with pytest.raises(TypeError, match=r"before must be a task id"):
        slotd.tasks(conn, before="7")  # type: ignore[arg-type]


def test_retry_and_purge_a_dead_letter_in_the_callers_transaction(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    tid = slotd.enqueue(conn, "mail", {}, key="k")
    assert not slotd.retry(conn, tid) and not slotd.purge(conn, tid)  # live: neither
    slotd.cancel(conn, tid)
    with psycopg.connect(db_url) as tx:  # rolled back: nothing happened
        assert slotd.retry(tx, tid)
        tx.rollback()
    assert _states(conn) == {tid: "cancelled"}
    assert slotd.retry(conn, tid)
    assert _states(conn) == {tid: "pending"}
    assert slotd.cancel(conn, tid)
    assert slotd.purge(conn, tid)
    assert slotd.tasks(conn) == [] and not slotd.purge(conn, tid)


def test_the_async_variants(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as aconn:
            tid = await slotd.enqueue_async(aconn, "mail", {}, tags=["a"])
            assert await slotd.cancel_async(aconn, tid)
            await slotd.pause_async(aconn, "mail", timedelta(minutes=5))
            await aconn.commit()
            [info] = await slotd.tasks_async(aconn, tag="a")
            assert info.state == "cancelled"
            assert await slotd.retry_async(aconn, tid)
            assert [t.state for t in await slotd.tasks_async(aconn)] == ["pending"]
            assert await slotd.cancel_async(aconn, tid)
            assert await slotd.purge_async(aconn, tid)
            assert await slotd.resume_async(aconn, "mail")
            await aconn.commit()

    asyncio.run(main())
    assert slotd.tasks(conn) == []
    assert conn.execute("SELECT count(*) FROM slotd_paused_types").fetchone()[0] == 0


def test_slotd_tasks_on_the_command_line(conn: psycopg.Connection[Any], db_url: str) -> None:
    tid = slotd.enqueue(conn, "mail", {"to": "ada"}, tags=["tenant:7"])
    slotd.enqueue(conn, "mail", {"to": "bob"})
    env = {**os.environ, "SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "slotd", "tasks", *args],
            env=env,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )

    listed = run("--tag", "tenant:7", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert (row["id"], row["state"], row["tags"], row["payload"]) == (
        tid,
        "pending",
        ["tenant:7"],
        {"to": "ada"},
    )
    table = run("--type", "mail")
    assert table.returncode == 0 and "STATE" in table.stdout and "tenant:7" in table.stdout
    bad = run("--state", "done")
    assert bad.returncode == 2 and "done" in bad.stderr
