"""Producers as Python users write them: psycopg's asyncio connections and cursors, and
SQLAlchemy 2 sessions and connections (sync and asyncio) on the psycopg driver. Every path
writes through the same statement inside the caller's transaction, and anything else is
refused with a TypeError that says what is accepted."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest

import slotd
from tests.daemon import ROOT


def rows(db_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        sql = "SELECT id, task_type, payload, key FROM slotd_tasks ORDER BY id"
        return conn.execute(sql).fetchall()


def sa_url(db_url: str) -> str:
    return db_url.replace("postgresql://", "postgresql+psycopg://", 1)


# psycopg asyncio


def test_enqueue_async_writes_in_the_callers_transaction(db_url: str) -> None:
    async def main() -> tuple[int, list[int], int]:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            one = await slotd.enqueue_async(conn, "mail", {"to": "ada"}, key="ada")
            again = await slotd.enqueue_async(conn, "mail", {"to": "ada"}, key="ada")
            assert again == one  # the live row with the same key, as in the sync path
            async with conn.cursor() as cur:
                many = await slotd.enqueue_many_async(cur, [("mail", {"n": 1}), ("mail", {})])
            assert rows(db_url) == []  # not committed yet: invisible to others
            await conn.commit()
            await slotd.enqueue_async(conn, "mail", {"rolled": "back"})
            await conn.rollback()
            return one, many, len(rows(db_url))

    one, many, count = asyncio.run(main())
    assert count == 3
    assert [r[0] for r in rows(db_url)] == [one, *many]
    assert rows(db_url)[0][1:] == ("mail", {"to": "ada"}, "ada")


def test_enqueue_async_validates_before_anything_is_sent(db_url: str) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            with pytest.raises(TypeError, match="not JSON-serializable"):
                await slotd.enqueue_many_async(conn, [("ok", {}), ("bad", {"at": object()})])
            with pytest.raises(ValueError, match="invalid task type"):
                await slotd.enqueue_async(conn, "Bad Name")
            with pytest.raises(TypeError, match="key must be a string"):
                await slotd.enqueue_async(conn, "ok", key=42)  # type: ignore[arg-type]

    asyncio.run(main())
    assert rows(db_url) == []


def test_enqueue_async_wakes_workers_only_on_commit(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN slotd_wake")

        async def main(commit: bool) -> None:
            async with await psycopg.AsyncConnection.connect(db_url) as conn:
                await slotd.enqueue_async(conn, "mail")
                await (conn.commit() if commit else conn.rollback())

        asyncio.run(main(commit=False))
        assert list(listener.notifies(timeout=0.2)) == []
        asyncio.run(main(commit=True))
        assert [n.channel for n in listener.notifies(timeout=10, stop_after=1)] == ["slotd_wake"]


def test_sync_enqueue_refuses_an_async_connection_and_names_the_async_api(db_url: str) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            with pytest.raises(TypeError, match=r"await slotd\.enqueue_async"):
                slotd.enqueue(conn, "mail")
        with (
            psycopg.connect(db_url) as sync_conn,
            pytest.raises(TypeError, match=r"use slotd\.enqueue\(\.\.\.\)"),
        ):
            await slotd.enqueue_async(sync_conn, "mail")

    asyncio.run(main())


def test_anything_else_is_a_type_error_naming_what_is_accepted() -> None:
    for thing in (None, "postgresql:///x", object()):
        with pytest.raises(TypeError, match="psycopg Connection or Cursor, or a SQLAlchemy"):
            slotd.enqueue(thing, "mail")
        with pytest.raises(TypeError, match="psycopg AsyncConnection or AsyncCursor"):
            asyncio.run(slotd.enqueue_async(thing, "mail"))


def test_sqlalchemy_is_never_imported_by_a_psycopg_producer(db_url: str) -> None:
    code = (
        "import sys, psycopg, slotd\n"
        f"with psycopg.connect({db_url!r}) as c:\n"
        "    slotd.enqueue(c, 'mail')\n"
        "    try:\n"
        "        slotd.enqueue(object(), 'mail')\n"
        "    except TypeError:\n"
        "        pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('sqlalchemy')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.replace("'", '"')) == []


# SQLAlchemy 2, sync


def test_sqlalchemy_session_enqueues_inside_the_sessions_transaction(db_url: str) -> None:
    pytest.importorskip("sqlalchemy", minversion="2.0")
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session, scoped_session, sessionmaker

    engine = create_engine(sa_url(db_url))
    try:
        with Session(engine) as session:
            session.execute(text("CREATE TABLE signups (email text)"))
            session.execute(text("INSERT INTO signups VALUES ('ada@example.com')"))
            task_id = slotd.enqueue(session, "send_welcome", {"email": "ada@example.com"})
            assert rows(db_url) == []
            session.commit()
        assert [r[0] for r in rows(db_url)] == [task_id]

        with Session(engine) as session:  # a session that has not begun anything yet
            slotd.enqueue(session, "send_welcome", {"email": "bob@example.com"})
            session.rollback()
        assert len(rows(db_url)) == 1

        scoped = scoped_session(sessionmaker(engine))
        slotd.enqueue_many(scoped, [("send_welcome", {"n": 1}), ("send_welcome", {"n": 2})])
        scoped.commit()
        scoped.remove()
        assert len(rows(db_url)) == 3
    finally:
        engine.dispose()


def test_sqlalchemy_connection_enqueues_and_its_commit_commits(db_url: str) -> None:
    pytest.importorskip("sqlalchemy", minversion="2.0")
    from sqlalchemy import create_engine

    engine = create_engine(sa_url(db_url))
    try:
        with engine.connect() as conn:  # nothing begun: the enqueue begins, as execute does
            slotd.enqueue(conn, "mail", {"n": 1})
            conn.commit()
            slotd.enqueue(conn, "mail", {"n": 2})
            conn.rollback()
        with engine.begin() as conn:
            slotd.enqueue(conn, "mail", {"n": 3})
        assert [r[2] for r in rows(db_url)] == [{"n": 1}, {"n": 3}]
        with pytest.raises(TypeError, match="SQLAlchemy Session or Connection"):
            slotd.enqueue(engine, "mail")  # an Engine has no transaction to join
    finally:
        engine.dispose()


def test_sqlalchemy_on_another_driver_is_refused(tmp_path: Any) -> None:
    pytest.importorskip("sqlalchemy", minversion="2.0")
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with Session(engine) as session, pytest.raises(TypeError, match=r"psycopg driver.*sqlite"):
        slotd.enqueue(session, "mail")


# SQLAlchemy 2, asyncio


def test_sqlalchemy_async_session_and_connection(db_url: str) -> None:
    pytest.importorskip("sqlalchemy", minversion="2.0")
    pytest.importorskip("greenlet")
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

    async def main() -> list[int]:
        engine = create_async_engine(sa_url(db_url))
        try:
            made = async_sessionmaker(engine, class_=AsyncSession)
            async with made() as session:
                first = await slotd.enqueue_async(session, "mail", {"via": "session"})
                await session.commit()
            async with made() as session:
                await slotd.enqueue_async(session, "mail", {"via": "rolled back"})
                await session.rollback()
            async with engine.connect() as conn:
                many = await slotd.enqueue_many_async(conn, [("mail", {"via": "conn"})])
                await conn.commit()
            async with made() as session:
                with pytest.raises(TypeError, match=r"await slotd\.enqueue_async"):
                    slotd.enqueue(session, "mail")
            return [first, *many]
        finally:
            await engine.dispose()

    ids = asyncio.run(main())
    assert [(r[0], r[2]["via"]) for r in rows(db_url)] == [(ids[0], "session"), (ids[1], "conn")]


def test_the_docs_asyncio_and_sqlalchemy_snippet_runs_as_written(db_url: str) -> None:
    pytest.importorskip("sqlalchemy", minversion="2.0")
    pytest.importorskip("greenlet")
    import re
    import textwrap

    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
    from sqlalchemy.orm import Session

    from examples.fastapi_app.models import Base, Signup

    readme = (ROOT / "docs/how-to/enqueue.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "aconn" in b]
    source = "async def snippet():\n" + textwrap.indent(block, "    ")
    engine = create_engine(sa_url(db_url))
    Base.metadata.create_all(engine)

    async def main() -> None:
        aengine = create_async_engine(sa_url(db_url))
        namespace: dict[str, Any] = {
            "slotd": slotd,
            "Session": Session,
            "engine": engine,
            "signup": Signup(email="ada@example.com"),
            "async_session": async_sessionmaker(aengine),
        }
        try:
            async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
                namespace["aconn"] = aconn
                exec(source, namespace)  # noqa: S102 - the docs page's own code
                await namespace["snippet"]()
        finally:
            await aengine.dispose()

    try:
        asyncio.run(main())
    finally:
        engine.dispose()
    assert [r[2] for r in rows(db_url)] == [
        {"signup_id": 7},
        {"signup_id": 8},
        {"signup_id": 1},
        {"signup_id": 7},
    ]
