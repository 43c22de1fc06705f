"""The hourly retention chore: one replica per hour, only dead letters past retention."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from slotd.repository import Repository
from slotd.supervisor.maintenance import hourly_cleanup

WEEK = timedelta(days=7)


def add(conn: psycopg.Connection[Any], **cols: str) -> int:
    names = ["task_type", *cols]
    values = ["'audit'", *cols.values()]
    sql = f"INSERT INTO slotd_tasks ({', '.join(names)}) VALUES ({', '.join(values)}) RETURNING id"
    return conn.execute(sql).fetchone()[0]  # type: ignore[arg-type,index]


def ids(conn: psycopg.Connection[Any]) -> set[int]:
    return {row[0] for row in conn.execute("SELECT id FROM slotd_tasks")}


def old_dead(conn: psycopg.Connection[Any], n: int) -> set[int]:
    return {
        add(conn, attempt_count="20", last_attempted_at="now() - interval '8 days'")
        for _ in range(n)
    }


def test_prunes_only_dead_rows_past_retention(
    conn: psycopg.Connection[Any], repo: Repository, caplog: pytest.LogCaptureFixture
) -> None:
    doomed = old_dead(conn, 3)
    kept = {
        # dead, but inside the window
        add(conn, attempt_count="20", last_attempted_at="now() - interval '6 days'"),
        # old, but retryable: not a dead letter
        add(conn, attempt_count="19", last_attempted_at="now() - interval '30 days'"),
        # final attempt under a live lease: a worker is on it, never pruned
        add(
            conn,
            attempt_count="20",
            last_attempted_at="now() - interval '8 days'",
            lease_token="gen_random_uuid()",
            lease_expires_at="now() + interval '1 hour'",
        ),
        # old and never attempted
        add(conn, created_at="now() - interval '30 days'"),
    }
    log = logging.getLogger("slotd.test.maintenance")
    with caplog.at_level(logging.INFO, logger=log.name):
        assert hourly_cleanup(repo, WEEK, log) == 3
    assert ids(conn) == kept
    assert not ids(conn) & doomed
    (record,) = caplog.records
    assert "pruned 3 dead letters older than 7d" in record.getMessage()
    assert record.pruned == 3  # type: ignore[attr-defined]

    # Elected for this hour already: the next call on any replica does nothing.
    old_dead(conn, 1)
    assert hourly_cleanup(repo, WEEK, log) is None


def test_prunes_in_batches(conn: psycopg.Connection[Any], repo: Repository) -> None:
    old_dead(conn, 7)
    assert hourly_cleanup(repo, WEEK, logging.getLogger("t"), batch=3) == 7
    assert ids(conn) == set()


def test_two_replicas_racing_only_one_prunes(db_url: str, conn: psycopg.Connection[Any]) -> None:
    old_dead(conn, 5)
    start = threading.Barrier(2)
    results: list[int | None] = []
    errors: list[BaseException] = []

    def replica() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as own:
                repo = Repository(own)
                start.wait(timeout=30)
                results.append(hourly_cleanup(repo, WEEK, logging.getLogger("t")))
        except BaseException as exc:  # surfaced below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert sorted(results, key=lambda r: r is not None) == [None, 5]
    assert ids(conn) == set()


def test_an_hour_later_the_chore_runs_again(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    log = logging.getLogger("t")
    assert hourly_cleanup(repo, WEEK, log) == 0
    conn.execute("UPDATE slotd_maintenance SET last_run_at = last_run_at - interval '61 minutes'")
    old_dead(conn, 2)
    assert hourly_cleanup(repo, WEEK, log) == 2
