"""slotd behind a real PgBouncer (Debian's 1.18), in transaction and in session mode: no
server-side prepared statements through the pool, LISTEN on its own direct URL, migrations
that cannot strand a lock in the pool, and a NOTIFY self-test that says when wake-ups do not
arrive."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import slotd
from slotd import db, repository
from slotd.dev.localpg import LocalPostgres
from tests.daemon import ROOT, Daemon, wait_for
from tests.pgbouncer import PgBouncer, binary, pgbouncer
from tests.test_generic_plans import connections

pytestmark = pytest.mark.skipif(
    binary() is None, reason="pgbouncer is not installed (apt-get install -y pgbouncer)"
)


@pytest.fixture(scope="module")
def bouncers(pg_server: LocalPostgres) -> Iterator[dict[str, PgBouncer]]:
    with pgbouncer(pg_server, "transaction") as tx, pgbouncer(pg_server, "session", 40) as ses:
        yield {"transaction": tx, "session": ses}


def drained(conn: psycopg.Connection[Any]) -> bool:
    return conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,)


def pooled_env(bouncer: PgBouncer, db_url: str) -> dict[str, str]:
    # Transaction pooling needs LISTEN on a direct connection; session pooling does not.
    return {"SLOTD_DATABASE_URL_LISTEN": db_url} if bouncer.mode == "transaction" else {}


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_a_slot_behind_a_pooler_leaves_the_servers_plan_settings_alone(
    bouncers: dict[str, PgBouncer], db_url: str, mode: str
) -> None:
    """A slot's direct sessions plan generically (sql generic_plans_session); behind a
    pooler that session setting would stay on a server connection other clients share."""
    repo = connections(bouncers[mode].url_for(db_url), None).connect()
    try:
        assert db.pooled(repo.write)
        assert repo.write.execute("SHOW plan_cache_mode").fetchone() == ("auto",)
    finally:
        repo.write.close()
    # The same slot straight to the server does set it (the other half of the rule).
    direct = connections(db_url, None).connect()
    try:
        assert direct.write.execute("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
    finally:
        direct.write.close()


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_a_pooled_connection_is_detected_and_never_prepares(
    bouncers: dict[str, PgBouncer], db_url: str, mode: str
) -> None:
    url = bouncers[mode].url_for(db_url)
    with db.connect(url) as conn:
        assert db.pooled(conn)
        assert conn.prepare_threshold is None
        for _ in range(10):  # past psycopg's threshold of 5: still no prepared statement
            conn.execute("SELECT 1")
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
    with db.connect(db_url) as conn:
        assert not db.pooled(conn)
        assert conn.prepare_threshold is not None
        assert db.session_is_ours(conn, "auto") and db.session_is_ours(conn, "on")
        # SLOTD_PREPARE=off is what a transaction pooler needs: taken as its sign as well.
        assert not db.session_is_ours(conn, "off")
    with db.connect(url, prepare="on") as conn:
        assert conn.prepare_threshold is not None
        # Session settings behind a pooler would land on some other client's server session.
        assert not db.session_is_ours(conn, "on")


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_every_task_succeeds_exactly_once_through_the_pooler(
    bouncers: dict[str, PgBouncer],
    qconn: psycopg.Connection[Any],
    db_url: str,
    daemons: list[Daemon],
    mode: str,
) -> None:
    bouncer = bouncers[mode]
    daemon = Daemon(
        bouncer.url_for(db_url),
        slots=4,
        env={
            **pooled_env(bouncer, db_url),
            "SLOTD_ALLOW_FAULTS": "1",
            # Slots die between outcome and settlement. One draw per settling statement,
            # and a batch settles many successes in one: about 90 draws for 300 tasks, so
            # 0.1 leaves no run without a fault (0.9 ** 90 < 1e-4; 0.02 missed 1 in 6).
            "SLOTD_FAULT_SLOT_CRASH": "0.1",
            "SLOTD_BACKOFF_BASE": "10ms",
            "SLOTD_BACKOFF_CAP": "50ms",
        },
    )
    daemons.append(daemon)
    daemon.start()
    payloads = [{"fail_until": 2 if n % 50 == 0 else 1 if n % 10 == 0 else 0} for n in range(300)]
    ids = slotd.enqueue_many(qconn, [("rt.flaky", p) for p in payloads])
    wait_for(lambda: drained(qconn), timeout=240, what="300 tasks through the pooler")
    rows = qconn.execute(
        "SELECT task_id, array_agg(phase ORDER BY at) FROM executions GROUP BY task_id"
    ).fetchall()
    phases = dict(rows)
    assert sorted(phases) == sorted(ids)
    for task_id, payload in zip(ids, payloads, strict=True):
        expected = ["start", "fail"] * payload["fail_until"] + ["start", "end"]
        # One success, after the planned failures, and each run over before the next began.
        assert phases[task_id] == expected, (task_id, phases[task_id])
    log = "\n".join(daemon.lines)
    assert "injected fault: slot_crash" in log
    assert "_pg3_" not in log and "Traceback" not in log  # no prepared statement met the pool


def test_concurrent_migrations_through_a_transaction_pooler_all_finish(
    bouncers: dict[str, PgBouncer], pg_server: LocalPostgres
) -> None:
    name = f"slotd_migrate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        repository.create_database(conn, name)
    env = {"SLOTD_DATABASE_URL": bouncers["transaction"].url(name), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "slotd", "migrate"],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(5)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 5, outputs
    applied = [
        part.strip()
        for out, _ in outputs
        if out.startswith("applied ")
        for part in out.removeprefix("applied ").split(",")
    ]
    expected = [stem for _, stem, _ in repository.migrations()]
    assert sorted(applied) == sorted(expected)  # each migration applied once, by someone
    with psycopg.connect(pg_server.url(name)) as conn:
        rows = conn.execute("SELECT version FROM slotd_schema_migrations").fetchall()
        assert len(rows) == len(expected)
        # Nothing left held in the pool: another session takes the lock at once.
        assert conn.execute(
            "SELECT pg_try_advisory_lock(hashtext('slotd.migrate'))"
        ).fetchone() == (True,)


def start_with_readyz(
    daemons: list[Daemon], url: str, env: dict[str, str] | None = None
) -> tuple[Daemon, Callable[[], str]]:
    daemon = Daemon(url, slots=2, env={**(env or {}), "SLOTD_METRICS_ADDR": "127.0.0.1:0"})
    daemons.append(daemon)
    daemon.start()
    metrics = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()

    def readyz() -> str:
        with urllib.request.urlopen(metrics.replace("/metrics", "/readyz"), timeout=5) as r:
            return str(r.read().decode().strip())

    return daemon, readyz


def test_listen_through_a_transaction_pooler_warns_and_serves_on_the_poll(
    bouncers: dict[str, PgBouncer],
    conn: psycopg.Connection[Any],
    db_url: str,
    daemons: list[Daemon],
) -> None:
    daemon, readyz = start_with_readyz(daemons, bouncers["transaction"].url_for(db_url))
    daemon.wait_line(r"NOTIFY did not reach the LISTEN connection", timeout=60)
    assert readyz().startswith("polling every 1s: NOTIFY does not reach")
    slotd.enqueue_many(conn, [("rt.quick", {}) for _ in range(5)])
    wait_for(lambda: drained(conn), timeout=60, what="work found by the poll alone")


def test_session_pooling_carries_listen_and_passes_the_self_test(
    bouncers: dict[str, PgBouncer],
    conn: psycopg.Connection[Any],
    db_url: str,
    daemons: list[Daemon],
) -> None:
    _, readyz = start_with_readyz(
        daemons, bouncers["session"].url_for(db_url), {"SLOTD_POLL_INTERVAL": "10m"}
    )
    slotd.enqueue_many(conn, [("rt.quick", {}) for _ in range(5)])
    # With a 10 min tick only a notification can have woken a slot.
    wait_for(lambda: drained(conn), timeout=30, what="work woken by NOTIFY through the pool")
    assert readyz() == "listening"


def test_prepared_statements_forced_on_behind_a_transaction_pooler_stop_the_replica(
    pg_server: LocalPostgres,
    conn: psycopg.Connection[Any],
    db_url: str,
    daemons: list[Daemon],
) -> None:
    # One server connection shared by every client: the second slot to prepare meets the
    # first one's statement of the same name.
    with pgbouncer(pg_server, "transaction", pool_size=1) as bouncer:
        daemon = Daemon(
            bouncer.url_for(db_url),
            slots=2,
            env={"SLOTD_PREPARE": "on", "SLOTD_DATABASE_URL_LISTEN": db_url},
        )
        daemons.append(daemon)
        daemon.start()
        slotd.enqueue_many(conn, [("rt.quick", {}) for _ in range(300)])
        assert daemon.wait(120) == 2
        line = daemon.wait_line(r"stopping: server-side prepared statements failed")
        assert "SLOTD_PREPARE=off" in line
