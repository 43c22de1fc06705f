"""The dashboard behind a real PgBouncer (Debian's 1.18) in transaction mode, as a
production deployment puts it: no prepared statement through the pool, no setting of the
dashboard's left on a server connection for the pool's other clients, and live pages that
work there as they do straight to the server (polls: one short transaction each, no LISTEN,
no connection held between two)."""

from __future__ import annotations

import re
import warnings
from datetime import timedelta
from typing import Any

import psycopg
import pytest

pytest.importorskip("starlette", reason="the dashboard needs the web extra: pip install '.[web]'")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import slotd  # noqa: E402
from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.web import create_app  # noqa: E402
from slotd.web.settings import DashboardSettings  # noqa: E402
from tests.pgbouncer import binary, pgbouncer  # noqa: E402

pytestmark = pytest.mark.skipif(
    binary() is None, reason="pgbouncer is not installed (apt-get install -y pgbouncer)"
)
# A timeout no one else uses, so seeing it anywhere but in our own transaction is a leak.
TIMEOUT = timedelta(milliseconds=4321)
RELOADS = 15


def pages_of(conn: psycopg.Connection[Any]) -> list[str]:
    dead = slotd.enqueue(conn, "audit", {}, max_attempts=1, key="org:1")
    conn.execute(
        "UPDATE slotd_tasks SET attempt_count = 1, last_attempted_at = now(), "
        "last_error = 'ValueError: bad' WHERE id = %s",
        (dead,),
    )
    running = slotd.enqueue(conn, "crunch", {})
    conn.execute(
        "UPDATE slotd_tasks SET lease_token = gen_random_uuid(), attempt_count = 1, "
        "last_attempted_at = now(), lease_expires_at = now() + interval '1 hour' WHERE id = %s",
        (running,),
    )
    slotd.enqueue(conn, "mail", {})
    slotd.pause(conn, "mail", by="ops@test")
    conn.execute(
        "INSERT INTO slotd_schedules (name, task_type, expression, timezone, catch_up) "
        "VALUES ('hourly-audit', 'audit', 'every 3600s', 'UTC', 'latest')"
    )
    return [
        "/",
        "/running",
        "/dead",
        "/dead?type=audit",
        "/dead?q=org:1",
        f"/tasks/{dead}",
        f"/tasks/{running}",
        "/schedules",
        "/types/audit",
        "/?window=day",
    ]


def test_every_page_reloads_through_a_transaction_pooler_and_leaves_no_session_setting(
    pg_server: LocalPostgres, conn: psycopg.Connection[Any], db_url: str
) -> None:
    paths = pages_of(conn)
    # One server connection for every client: the dashboard's pooled connections and the
    # bystander below all run on it, so a prepared statement of one client meets the next
    # client's, and a session setting of the dashboard's is what the bystander sees.
    with pgbouncer(pg_server, "transaction", pool_size=1) as bouncer:
        url = bouncer.url_for(db_url)
        settings = DashboardSettings(statement_timeout=TIMEOUT, actions=True)
        app = create_app(url, settings=settings)
        bystander = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        try:
            with TestClient(app, base_url="http://127.0.0.1") as client:
                for path in paths:
                    for _ in range(RELOADS):
                        reply = client.get(path)
                        assert reply.status_code == 200, (path, reply.text[-500:])
                        shown = bystander.execute("SHOW statement_timeout").fetchone()
                        assert shown is not None and shown[0] != "4321ms", path
                # An action's transaction leaves nothing behind either.
                page = client.get("/dead").text
                csrf = re.search(r'name="csrf" value="([^"]+)"', page)
                assert csrf
                form = {"csrf": csrf.group(1), "scope": "ids", "action": "retry"}
                dead = paths[5].rsplit("/", 1)[1]
                done = client.post("/dead/action", data={**form, "id": dead})
                assert done.status_code in (200, 303), done.text[-500:]
                assert bystander.execute("SHOW statement_timeout").fetchone() != ("4321ms",)
            # Live pages: each update is one short transaction, nothing held between two, so
            # they stay on behind a transaction pooler; the one server connection is the
            # bystander's between two updates (a pinned one would hang its statement).
            live = create_app(url, settings=DashboardSettings(refresh=timedelta(seconds=1)))
            try:
                with TestClient(live, base_url="http://127.0.0.1") as client:
                    for path in ("/", "/running", f"/tasks/{paths[6].rsplit('/', 1)[1]}"):
                        for _ in range(RELOADS):
                            reply = client.get(path, headers={"X-Slotd-Live": "1"})
                            assert reply.status_code == 200, (path, reply.text[-500:])
                            assert "<div data-live id=" in reply.text, path
                            assert bystander.execute("SELECT 1").fetchone() == (1,)
                    assert 'data-refresh="1000"' in client.get("/").text
            finally:
                live.state.dashboard.close()
            prepared = bystander.execute("SELECT count(*) FROM pg_prepared_statements")
            assert prepared.fetchone() == (0,)
        finally:
            bystander.close()
            app.state.dashboard.close()
