"""PostgreSQL restarted under a running daemon, and a daemon started before its database."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import slotd
from slotd import db
from slotd.dev.localpg import LocalPostgres, scratch
from slotd.repository import migrate
from tests.daemon import EXECUTIONS, Daemon, wait_for
from tests.forwarder import Forwarder
from tests.replica import promote, streaming_replica


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


def enqueue_committed(url: str, n: int = 1, task_type: str = "rt.quick") -> None:
    with psycopg.connect(url) as conn:
        slotd.enqueue_many(conn, [(task_type, {}) for _ in range(n)])


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


OUTAGE_S = 12.0


def test_an_outage_is_told_in_steps_once_for_all_slots(own_server: LocalPostgres) -> None:
    """A database gone after a good start is still waited out, but each component tells a
    run of failures at its 1st, 2nd, 4th, 8th... and the slots as one: 40 s of outage
    under 4 slots was 95 warnings, every slot saying every try."""
    url = own_server.url()
    daemon = Daemon(url, slots=4).start()
    try:
        mark = len(daemon.lines)
        own_server.stop("fast")
        # Not a wait for an event: the volume of an outage is counted over its length.
        time.sleep(OUTAGE_S)
        seen = daemon.lines[mark:]
        listener = r"supervisor database unreachable, retrying"
        slots_unreachable = [ln for ln in seen if re.search(r"slot \d database unreachable", ln)]
        slots_lost = [ln for ln in seen if "lost the database connection" in ln]
        sweeps = [ln for ln in seen if "sweep failed" in ln]
        # Each slot fails a try every ~2 s at the cap: four voices were 20 lines or more.
        assert 1 <= len(slots_unreachable) <= 6, slots_unreachable
        assert 1 <= len([ln for ln in seen if re.search(listener, ln)]) <= 5
        assert 1 <= len(slots_lost) <= 2, slots_lost  # one, or two that raced
        assert len(sweeps) <= 5, sweeps  # a sweep a poll (1 s) at most, when one is due
        own_server.start()
        enqueue_committed(url, 3)
        wait_for(lambda: drained(url), timeout=60, what="work after the outage")
        assert not any("Traceback" in ln for ln in daemon.lines)
    finally:
        daemon.close()


def test_daemon_started_before_its_database_waits_then_serves(
    own_server: LocalPostgres,
) -> None:
    url = own_server.url()
    own_server.stop("fast")
    # A database that starts after its worker (within SLOTD_START_WAIT): waited for, said once.
    daemon = Daemon(url, slots=1, env={"SLOTD_START_WAIT": "2m"}).start(wait_ready=False)
    try:
        line = daemon.wait_line(r"database unreachable at start")
        assert "Traceback" not in "\n".join(daemon.lines)
        assert "trying for up to 2m (SLOTD_START_WAIT)" in line
        own_server.start()
        daemon.wait_line(r"serving ", timeout=60)
        enqueue_committed(url, 3)
        wait_for(lambda: drained(url), what="work once the database came up")
    finally:
        daemon.close()


def test_a_url_where_nothing_listens_is_one_line_exit_2_after_the_start_wait() -> None:
    """A mistyped port: once retried for ever (121 warnings in 40 s, no exit)."""
    nothing = socket.socket()
    nothing.bind(("127.0.0.1", 0))  # held, never listening: every connect is refused
    try:
        url = f"postgresql://slotd@127.0.0.1:{nothing.getsockname()[1]}/slotd"
        daemon = Daemon(url, slots=2, env={"SLOTD_START_WAIT": "1s"})
        done = subprocess.run(
            daemon.cmd, env=daemon.env, cwd=daemon.cwd, capture_output=True, text=True, timeout=60
        )
    finally:
        nothing.close()
    assert done.returncode == 2
    waiting, refusal = done.stderr.splitlines()  # one line while it waits, one to end
    assert "WARNING" in waiting and "database unreachable at start (" in waiting
    assert "Connection refused" in waiting and "trying for up to 1s (SLOTD_START_WAIT)" in waiting
    assert refusal.startswith(f"slotd: cannot reach the database {url}: ")
    assert refusal.endswith("(check SLOTD_DATABASE_URL; waited 1s, SLOTD_START_WAIT)")


def test_a_database_that_refuses_us_is_one_line_exit_2_at_once(own_server: LocalPostgres) -> None:
    """Wrong database name: the server answered, retrying cannot help, no wait."""
    url = own_server.url("no_such_database")
    daemon = Daemon(url, slots=1, env={"SLOTD_START_WAIT": "10m"})
    done = subprocess.run(
        daemon.cmd, env=daemon.env, cwd=daemon.cwd, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"slotd: the database {url} refused slotd: ")
    assert 'database "no_such_database" does not exist' in line


def test_reconnect_waits_are_capped_at_seconds_and_jittered() -> None:
    backoff = db.Reconnect()
    waits = [backoff.next() for _ in range(12)]
    assert all(0 < w <= 3.0 for w in waits)
    assert max(waits[:2]) < 0.6  # quick at first
    assert len({round(w, 6) for w in waits[6:]}) > 1  # at the cap, still spread out
    backoff.reset()
    assert backoff.next() <= 0.25


def test_failover_through_a_switched_forwarder_resumes_and_runs_nothing_twice(
    own_server: LocalPostgres, daemons: list[Daemon]
) -> None:
    """Primary stopped with -m immediate, its streaming replica promoted, the forwarder the
    daemon connects through switched: LISTEN comes back (with a 10-minute tick only a
    notification can wake a slot), and no task is lost or run twice."""
    with psycopg.connect(own_server.url(), autocommit=True) as conn:
        conn.execute(EXECUTIONS)
    with streaming_replica(own_server) as replica:
        forwarder = Forwarder(own_server)
        try:
            daemon = Daemon(forwarder.url(), slots=2, env={"SLOTD_POLL_INTERVAL": "10m"})
            daemons.append(daemon)
            daemon.start()
            enqueue_committed(forwarder.url(), 20, "rt.noop")
            wait_for(lambda: drained(own_server.url()), what="work before the failover")
            # Caught up means it replayed everything the primary wrote, the handlers' own
            # rows included: an empty queue on the replica is also what a replica that has
            # not yet seen the enqueue shows, and a -m immediate stop loses what it had not.
            # The insert position, not the write position: this server commits
            # asynchronously (synchronous_commit=off), so a commit that has returned may
            # not be written yet; the WAL writer writes it, and the replica gets it, soon.
            lsn = _one(own_server.url(), "SELECT pg_current_wal_insert_lsn()::text")
            wait_for(
                lambda: _one(replica.url(), f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
                what="the replica caught up",
            )
            own_server.stop("immediate")
            promote(replica)
            forwarder.switch(replica)
            enqueue_committed(replica.url(), 20, "rt.noop")
            wait_for(lambda: drained(replica.url()), timeout=60, what="work after the failover")
            with psycopg.connect(replica.url()) as conn:
                runs = conn.execute(
                    "SELECT count(DISTINCT task_id), count(*) FROM executions WHERE phase = 'start'"
                ).fetchone()
            assert runs == (40, 40)
        finally:
            forwarder.close()


def _one(url: str, sql: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
    return row[0] if row else None
