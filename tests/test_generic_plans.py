"""A slot's own sessions plan their prepared statements once, generically (sql/queries.sql,
generic_plans_session): what kept a replica's drain level behind a held xmin and after it.
Real SlotConnections on a real server; the plans counted by PostgreSQL itself."""

from __future__ import annotations

import functools
import logging
from datetime import timedelta
from typing import Any

import psycopg

import slotd
from slotd import db
from slotd.config import Settings
from slotd.registry import Registry
from slotd.repository import Repository
from slotd.slot.candidates import Candidates
from slotd.slot.connections import SlotConnections

CALLS = 30  # psycopg prepares a statement at its 6th execution (prepare_threshold = 5)


def connections(db_url: str, read_url: str | None, prepare: str = "auto") -> SlotConnections:
    return SlotConnections(
        1,
        Settings().with_(prepare=prepare),
        db_url,
        read_url,
        pause=lambda _s: None,
        stopping=lambda: False,
        on_reconnect=lambda: None,
        log=logging.getLogger("test"),
    )


def discovery_plans(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(generic, custom) plans this session ran for its prepared discovery statement."""
    rows = conn.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE statement LIKE '%%served%%' AND statement LIKE '%%slotd_tasks%%'"
    ).fetchall()
    assert len(rows) == 1, rows
    return rows[0]


def busy_table(conn: psycopg.Connection[Any]) -> None:
    """50k due rows of a type this replica does not serve, and one of its own."""
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, run_at, order_at) SELECT 'theirs',"
        " now() - interval '1 hour', now() - interval '1 hour' FROM generate_series(1, 50000)"
    )
    slotd.enqueue(conn, "mine")
    conn.execute("ANALYZE slotd_tasks")


def test_a_slots_discovery_runs_one_generic_plan_on_either_lane(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    busy_table(conn)
    for read_url in (None, db_url):  # the write lane alone, then a read lane of its own
        slot = connections(db_url, read_url)
        repo = slot.connect()
        try:
            assert (repo.read is repo.write) == (read_url is None)
            for _ in range(CALLS):
                assert repo.discover(["mine"], 40)
            generic, custom = discovery_plans(repo.read)
            assert (generic, custom) == (CALLS - 5, 0)
            for lane in {repo.write, repo.read}:
                assert lane.execute("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
        finally:
            for lane in {repo.write, repo.read}:
                lane.close()


def test_a_plain_session_still_plans_per_call(conn: psycopg.Connection[Any], db_url: str) -> None:
    """What the slot's setting changes: PostgreSQL's default tries custom plans first."""
    busy_table(conn)
    plain = db.connect(db_url)
    try:
        repo = Repository(plain)
        for _ in range(CALLS):
            assert repo.discover(["mine"], 40)
        generic, custom = discovery_plans(plain)
        assert custom >= 5 and generic + custom == CALLS - 5
    finally:
        plain.close()


def test_a_session_behind_a_pooler_keeps_the_servers_default(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """SLOTD_PREPARE=off (what a transaction-mode pooler needs) says the session is not
    ours: a session setting would land on whichever server connection ran it."""
    slot = connections(db_url, None, prepare="off")
    repo = slot.connect()
    try:
        assert repo.write.execute("SHOW plan_cache_mode").fetchone() == ("auto",)
    finally:
        repo.write.close()


def prepared(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    return [statement for (statement,) in rows]


def test_a_new_slot_session_prepares_its_discovery_and_claim_before_its_first_task(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """A slot's first claims planned cold were 1.5-3 ms each, on the first task of every
    new slot (#43: the p99 of the start latency at 50 tasks/s). A new session runs both
    until psycopg has prepared them, and claims nothing doing so."""
    slotd.enqueue(conn, "mine")
    registry = Registry()
    registry.register("mine", lambda task, ctx: None, ceiling=timedelta(seconds=30))
    for prepare, expected in (("auto", (1, 1)), ("off", (0, 0))):
        candidates = Candidates(20, 4)
        slot = SlotConnections(
            1,
            Settings().with_(prepare=prepare),
            db_url,
            None,
            pause=lambda _s: None,
            stopping=lambda: False,
            on_reconnect=lambda: None,
            log=logging.getLogger("test"),
            warm=functools.partial(candidates.warm, registry=registry),
        )
        repo = slot.connect()
        try:
            statements = prepared(repo.write)
            discovery = [s for s in statements if "served" in s]
            claim = [s for s in statements if "lease_token" in s and "UPDATE" in s]
            assert (len(discovery), len(claim)) == expected, statements
            assert conn.execute(
                "SELECT lease_token, attempt_count FROM slotd_tasks"
            ).fetchall() == [(None, 0)]
            # The first real claim takes the task, on the prepared statement.
            task = candidates.next_claim(repo, registry, lambda *_: None)
            assert task is not None and task.task_type == "mine"
            assert len(prepared(repo.write)) == len(statements)
            conn.execute(
                "UPDATE slotd_tasks SET lease_token = NULL, lease_expires_at = NULL,"
                " attempt_count = 0"
            )
        finally:
            repo.write.close()
