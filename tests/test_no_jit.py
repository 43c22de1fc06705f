"""slotd's statements never pay PostgreSQL's JIT (sql/queries.sql, read_committed_session):
a queue table behind a held xmin, or bloated after one, has plan estimates past
jit_above_cost, and every discovery then spent seconds compiling. Here the database is told
to JIT everything (jit_above_cost = 0) and slotd's sessions and writes must not."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd import db
from slotd.repository import Repository


def _jit_everything(conn: psycopg.Connection[Any]) -> None:
    name = conn.info.dbname
    conn.execute(f"ALTER DATABASE {name} SET jit = on")
    conn.execute(f"ALTER DATABASE {name} SET jit_above_cost = 0")


def _jitted(conn: psycopg.Connection[Any], sql: str) -> bool:
    (plan,) = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}").fetchone()  # type: ignore[misc]
    doc = plan if isinstance(plan, list) else json.loads(plan)
    return "JIT" in doc[0]


def test_a_slotd_session_never_jits_where_the_database_jits_everything(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as admin:
        _jit_everything(admin)
    with psycopg.connect(db_url, autocommit=True) as plain:
        assert plain.execute("SHOW jit").fetchone() == ("on",)
        if not _jitted(plain, "SELECT count(*) FROM slotd_tasks"):
            pytest.skip("this PostgreSQL has no JIT provider (llvmjit) installed")
    with db.connect(db_url) as ours:  # a slot's, a supervisor's, a command's connection
        assert ours.execute("SHOW jit").fetchone() == ("off",)
        assert not _jitted(ours, "SELECT count(*) FROM slotd_tasks")


def test_a_write_carries_jit_off_in_its_own_bound_behind_a_pooler(db_url: str) -> None:
    """Behind a transaction-mode pooler no session setting is ours: the write's own SET
    LOCAL (sql `bound`) carries it, so a claim does not JIT there either."""
    with psycopg.connect(db_url, autocommit=True) as admin:
        _jit_everything(admin)
    with psycopg.connect(db_url, autocommit=True) as pooled_like:  # a session never bound
        repo = Repository(pooled_like)
        with repo._bounded() as conn:
            assert conn.execute("SHOW jit").fetchone() == ("off",)
        assert pooled_like.execute("SHOW jit").fetchone() == ("on",)  # only that write's
    reg = slotd.Registry()
    reg.register("work", lambda task, ctx: None, ceiling=timedelta(minutes=1))
    with psycopg.connect(db_url, autocommit=True) as c:
        task_id = slotd.enqueue(c, "work", {})
        assert Repository(c).claim([task_id], reg) is not None
