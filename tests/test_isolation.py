"""Limits under any isolation level (#25): the limited claim needs READ COMMITTED's fresh
snapshot after its lock, so every queue write runs at READ COMMITTED whatever the database's,
role's or pooler's default says. Real `slotd run` replicas, direct and behind PgBouncer."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import slotd
from slotd import db
from slotd.repository import Repository
from tests.apps.limits import RUNS
from tests.daemon import Daemon, wait_for
from tests.pgbouncer import binary, pgbouncer
from tests.test_priority_limits import max_overlap, remaining, runs

APP = "tests.apps.limits:registry"
LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('slotd.limit:lim.one', 0))"
WAITING = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event = 'advisory'"
)


def repeatable_read_by_default(conn: psycopg.Connection[Any]) -> None:
    name = conn.info.dbname
    conn.execute(f"ALTER DATABASE {name} SET default_transaction_isolation = 'repeatable read'")
    with psycopg.connect(conn.info.dsn, autocommit=True) as fresh:  # new sessions get it
        assert fresh.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)


@pytest.mark.parametrize("path", ["direct", "pgbouncer-transaction"])
def test_max_running_1_holds_under_a_repeatable_read_default(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], pg_server: Any, path: str
) -> None:
    """Three replicas' slots wait on the limit's lock together (the test holds it, so they
    all do), then it is released: each claim must see the lease the one before it took.
    Under REPEATABLE READ each would keep the snapshot taken before its wait, and all of
    them saw the place free."""
    if path != "direct" and binary() is None:
        pytest.skip("pgbouncer is not installed (apt-get install -y pgbouncer)")
    conn.execute(RUNS)
    repeatable_read_by_default(conn)
    with pgbouncer(pg_server, "transaction", pool_size=8) if path != "direct" else _none() as pool:
        url = pool.url_for(db_url) if pool else db_url
        env = {"SLOTD_LOCK_TIMEOUT": "60s"}
        if pool:
            env["SLOTD_DATABASE_URL_LISTEN"] = db_url  # LISTEN needs a direct connection
        for _ in range(3):
            d = Daemon(url, slots=2, app=APP, env=env)
            daemons.append(d)
            d.start()
        with psycopg.connect(db_url) as holder:
            holder.execute(LOCK)
            slotd.enqueue_many(conn, [("lim.one", {"sleep": 0.3})] * 4)
            wait_for(
                lambda: conn.execute(WAITING).fetchone()[0] >= 3,  # type: ignore[index]
                timeout=60,
                what="three claims waiting on the limit's lock",
            )
            holder.rollback()  # released: the waiters go one after the other
        wait_for(lambda: remaining(conn, "lim.one") == 0, timeout=120, what="the drain")
    done = runs(conn, "lim.one")
    assert len(done) == 4
    assert max_overlap((r["started_at"], r["until"]) for r in done) == 1, done


class _none:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_every_connection_and_write_runs_at_read_committed(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    repeatable_read_by_default(conn)
    with db.connect(db_url) as direct:
        assert direct.execute("SHOW transaction_isolation").fetchone() == ("read committed",)
        with direct.transaction():  # an explicit one says so in its BEGIN too
            level = direct.execute("SHOW transaction_isolation").fetchone()
        assert level == ("read committed",)
    # A connection whose session is not ours (as behind a pooler): each write sets its own.
    with psycopg.connect(db_url, autocommit=True) as plain:
        repo = Repository(plain)
        with repo._bounded() as bounded:
            level = bounded.execute("SHOW transaction_isolation").fetchone()
        assert level == ("read committed",)
        # ...and the session default is left as the database says.
        assert plain.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
