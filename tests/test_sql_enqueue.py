"""slotd_enqueue() (sql/041): enqueue from SQL, a trigger or any language's transaction,
with the row, the dedupe and the wake of slotd.enqueue; in slotd's schema (SLOTD_SCHEMA).
Called from a trigger here: a commit writes the task and wakes a real `slotd run`, which
runs it; a rollback writes and wakes nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd import repository
from slotd.dev.localpg import LocalPostgres
from tests.daemon import Daemon

TRIGGER = """
CREATE TABLE orders (id int PRIMARY KEY, total numeric NOT NULL);
CREATE FUNCTION orders_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM slotd_enqueue('typed.plain', jsonb_build_object('order', NEW.id),
                          key => 'order:' || NEW.id, tags => ARRAY['orders']);
    RETURN NEW;
END $$;
CREATE TRIGGER orders_enqueue AFTER INSERT ON orders
    FOR EACH ROW EXECUTE FUNCTION orders_enqueue();
"""


def _rows(conn: psycopg.Connection[Any], schema: str = "public") -> list[tuple[Any, ...]]:
    sql = f'SELECT task_type, payload, key, tags FROM "{schema}".slotd_tasks ORDER BY id'
    return conn.execute(sql).fetchall()  # type: ignore[arg-type]


def test_a_trigger_enqueues_on_commit_and_nothing_on_rollback(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    conn.execute(TRIGGER)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN slotd_wake")
        with psycopg.connect(db_url) as tx:
            tx.execute("INSERT INTO orders VALUES (1, 10)")
            tx.rollback()
        assert _rows(conn) == []
        assert list(listener.notifies(timeout=0.5)) == []  # a rollback wakes nobody
        with psycopg.connect(db_url) as tx:
            tx.execute("INSERT INTO orders VALUES (2, 20)")
            assert _rows(conn) == []  # not before the commit
            tx.commit()
        assert [n.channel for n in listener.notifies(timeout=10, stop_after=1)] == ["slotd_wake"]
    assert _rows(conn) == [("typed.plain", {"order": 2}, "order:2", ["orders"])]
    [task] = slotd.tasks(conn)
    # The same key from Python dedupes onto it, as two Python enqueues would.
    again = slotd.enqueue(conn, "typed.plain", {"order": 2}, key="order:2")
    assert again == task.id and not again.created
    daemons.append(Daemon(db_url, app="tests.apps.typed:registry").start())
    done = slotd.wait_result(conn, task.id, timeout=60)
    assert done.state == "succeeded" and done.value == {"class": "dict", "order": 2}


def test_named_arguments_dedupe_and_refusals(conn: psycopg.Connection[Any]) -> None:
    call = "SELECT slotd_enqueue('mail', %s::jsonb, key => %s, priority => 5)"
    first = conn.execute(call, ('{"to": "ada"}', "k")).fetchone()[0]
    assert conn.execute(call, ('{"to": "bob"}', "k")).fetchone()[0] == first
    py = slotd.enqueue(conn, "mail", {}, key="k")
    assert py == first and not py.created
    when = datetime(2031, 1, 1, tzinfo=UTC)
    later = conn.execute(
        "SELECT slotd_enqueue('mail', run_at => %s, max_attempts => 3)", (when,)
    ).fetchone()[0]
    delayed = conn.execute("SELECT slotd_enqueue('mail', delay => '1 hour')").fetchone()[0]
    rows = dict(
        (r[0], r[1:])
        for r in conn.execute(
            "SELECT id, run_at, order_at, max_attempts, max_attempts_explicit, priority,"
            " run_at - now() > interval '59 minutes' FROM slotd_tasks"
        ).fetchall()
    )
    assert rows[first][2:5] == (20, False, 5)  # the claiming worker stamps its threshold
    assert rows[first][1] == rows[first][0] - timedelta(seconds=5)  # the head start
    assert rows[later][:4] == (when, when, 3, True)
    assert rows[delayed][5] is True
    assert {t.state for t in slotd.tasks(conn)} == {"pending", "scheduled"}
    count = len(rows)
    for bad, message in [
        ("SELECT slotd_enqueue('Bad Type')", "invalid task type 'Bad Type'"),
        ("SELECT slotd_enqueue('mail', '[1]')", "payload must be a JSON object, not array"),
        ("SELECT slotd_enqueue('mail', priority => 101)", "priority must be from -100 to 100"),
        (
            "SELECT slotd_enqueue('mail', delay => '1 hour', run_at => now())",
            "give run_at or delay, not both",
        ),
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            conn.execute(bad)
    assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()[0] == count


def test_it_lives_in_SLOTD_SCHEMA_whatever_the_callers_search_path(
    pg_server: LocalPostgres,
) -> None:
    name = f"slotd_sqlenq_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        repository.create_database(admin, name)
    url = str(pg_server.url(name))
    with psycopg.connect(url, autocommit=True) as conn:
        repository.migrate(conn, schema="jobs")
        assert conn.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 'slotd_enqueue'"
            " AND pronamespace = 'jobs'::regnamespace"
        ).fetchone() == (1,)
    with (
        psycopg.connect(url, autocommit=True) as listener,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        listener.execute('LISTEN "slotd_wake.jobs"')
        conn.execute("SET search_path = public")
        tid = conn.execute("SELECT jobs.slotd_enqueue('mail', '{\"n\": 1}')").fetchone()[0]
        notes = list(listener.notifies(timeout=10, stop_after=1))
        assert [n.channel for n in notes] == ["slotd_wake.jobs"]
        assert _rows(conn, "jobs") == [("mail", {"n": 1}, None, None)]
        assert [t.id for t in slotd.tasks(conn, schema="jobs")] == [tid]
