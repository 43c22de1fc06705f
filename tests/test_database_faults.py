"""PostgreSQL restarted under a running daemon, and a daemon started before its database."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import slotd
from slotd.localpg import LocalPostgres, scratch
from slotd.repository import migrate
from tests.daemon import Daemon, wait_for


@pytest.fixture
def own_server() -> Iterator[LocalPostgres]:
    """A server of this test's own: restarting the suite's shared one would cut every
    other fixture's connections."""
    with scratch(prefix="slotd-fault-", port=5433) as server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            migrate(conn)
        yield server


def drained(url: str) -> bool:
    try:
        with psycopg.connect(url) as conn:
            return conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,)
    except psycopg.OperationalError:
        return False


def enqueue_committed(url: str, n: int = 1) -> None:
    with psycopg.connect(url) as conn:
        slotd.enqueue_many(conn, [("rt.quick", {}) for _ in range(n)])


def test_daemon_survives_a_postgresql_restart(own_server: LocalPostgres) -> None:
    url = own_server.url()
    # A tick far away: work after the restart must be found by the re-LISTEN's own look.
    daemon = Daemon(url, slots=2, env={"SLOTD_POLL_INTERVAL": "60s"}).start()
    try:
        enqueue_committed(url, 5)
        wait_for(lambda: drained(url), what="work before the restart")
        own_server.stop("fast")
        mark = len(daemon.lines)
        own_server.start()
        enqueue_committed(url, 5)  # may be sent while the supervisor is still deaf
        wait_for(lambda: drained(url), timeout=30, what="work after the restart")
        assert daemon.proc is not None and daemon.proc.poll() is None
        assert not any("Traceback" in line for line in daemon.lines[mark:])
        # Still listening: a fresh enqueue is picked up long before the 60 s tick.
        enqueue_committed(url, 1)
        wait_for(lambda: drained(url), timeout=20, what="a notified task after recovery")
    finally:
        daemon.close()


def test_daemon_started_before_its_database_waits_then_serves(
    own_server: LocalPostgres,
) -> None:
    url = own_server.url()
    own_server.stop("fast")
    daemon = Daemon(url, slots=1).start(wait_ready=False)
    try:
        line = daemon.wait_line(r"database unreachable, retrying")
        assert "Traceback" not in "\n".join(daemon.lines)
        assert "retrying in" in line
        own_server.start()
        daemon.wait_line(r"serving ", timeout=60)
        enqueue_committed(url, 3)
        wait_for(lambda: drained(url), what="work once the database came up")
    finally:
        daemon.close()
