"""`slotd migrate` under a live fleet: a step that queues for a table lock behind a long
transaction would hold every enqueue behind it; bounded, it gives up, rolls back whole and
tries again, and the fleet keeps working meanwhile. Real `slotd migrate` processes, a real
server, a real transaction held open (what a report or a forgotten psql session does)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import slotd
from slotd.repository import migrate
from tests.daemon import ROOT, wait_for

STEP = "023_expiry"  # idempotent (IF NOT EXISTS), and its ALTER TABLE locks slotd_tasks


@pytest.fixture
def one_step_behind(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """A database that lacks the newest step, as before an upgrade's `slotd migrate`."""
    conn.execute("DELETE FROM slotd_schema_migrations WHERE name = %s", (STEP,))
    return conn


@pytest.fixture
def holder(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A transaction left open on the queue table: it holds ACCESS SHARE on slotd_tasks."""
    with psycopg.connect(db_url, application_name="nightly-report") as conn:
        conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()
        yield conn


def migrate_cli(db_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "slotd", "migrate", *args],
        env={**os.environ, "SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def applied(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT 1 FROM slotd_schema_migrations WHERE name = %s", (STEP,))
    return row.fetchone() is not None


def test_an_unbounded_step_stops_every_enqueue_behind_one_open_transaction(
    one_step_behind: psycopg.Connection[Any], holder: psycopg.Connection[Any], db_url: str
) -> None:
    """The hazard itself, with the plain migrate() and no bound: what the CLI avoids."""
    with psycopg.connect(db_url, autocommit=True) as mig_conn:
        waiting = threading.Thread(target=migrate, args=(mig_conn,), daemon=True)
        waiting.start()
        with psycopg.connect(db_url, autocommit=True) as producer:
            # Wait for the migration to queue for its lock (a row, not a sleep).
            wait_for(
                lambda: producer.execute(
                    "SELECT 1 FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock'"
                ).fetchone(),
                what="the migration to queue for its lock",
            )
            producer.execute("SET lock_timeout = '1s'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                slotd.enqueue(producer, "t")
        holder.commit()  # the migration goes through once the holder ends
        waiting.join(30)
    assert applied(one_step_behind)


def test_migrate_keeps_the_fleet_enqueueing_while_it_waits_and_lands_after(
    one_step_behind: psycopg.Connection[Any], holder: psycopg.Connection[Any], db_url: str
) -> None:
    proc = migrate_cli(db_url, "--lock-timeout", "300ms", "--wait", "2m")
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # the first try's line: it has given up once
        assert f"slotd migrate: {STEP} could not take its table lock within 0.3s" in first
        assert "(try 1; nothing applied)" in first
        assert "nightly-report, idle in transaction" in first and "slotd_tasks" in first
        # The holder is still open, and enqueues go through (each waits at most one
        # try's bound when it meets a try).
        with psycopg.connect(db_url, autocommit=True) as producer:
            producer.execute("SET lock_timeout = '5s'")
            for _ in range(5):
                slotd.enqueue(producer, "t")
        assert holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert not applied(one_step_behind)
        holder.commit()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, err
    assert out.strip() == f"applied {STEP}"
    assert applied(one_step_behind)


def test_migrate_gives_up_in_one_line_naming_the_holder_with_nothing_applied(
    one_step_behind: psycopg.Connection[Any], holder: psycopg.Connection[Any], db_url: str
) -> None:
    proc = migrate_cli(db_url, "--lock-timeout", "200ms", "--wait", "1s")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    lines = err.strip().splitlines()
    assert all(line.startswith("slotd migrate: ") for line in lines[:-1]) and len(lines) >= 2
    last = lines[-1]
    assert last.startswith("slotd: gave up after ") and f"{STEP} could not take" in last
    assert "nothing applied" in last and "nightly-report" in last and "slotd_tasks" in last
    assert not applied(one_step_behind)
    # Bad input: one line, exit 2, nothing tried.
    bad = migrate_cli(db_url, "--lock-timeout", "0s")
    out, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and err.strip() == "slotd: --lock-timeout must be more than 0"
