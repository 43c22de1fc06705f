"""The web dashboard in-process (Starlette's test client) against a real database: what
each page shows, that it escapes, that actions need auth, CSRF, the actions setting and
a confirmation for bulk, and that every action is logged. The browser tests
(test_dashboard_browser.py) drive the same app in Chromium against a real `slotd run`."""

from __future__ import annotations

import json
import logging
import re
import warnings
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

pytest.importorskip("starlette", reason="the dashboard needs the web extra: pip install '.[web]'")
with warnings.catch_warnings():
    # Starlette 1.x would rather its test client ran on httpx2; httpx works the same.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import slotd  # noqa: E402
from slotd.cli import main  # noqa: E402
from slotd.repository import DashboardReads, Repository, statements  # noqa: E402
from slotd.web import create_app  # noqa: E402
from slotd.web.settings import DashboardSettings  # noqa: E402

TOKEN = "t0ken-for-the-dashboard-tests"
XSS = "<script>window.pwned=1</script>"
SECRET = "s3cret-password-in-the-url"


def make_client(db_url: str, **settings: Any) -> TestClient:
    app = create_app(db_url, settings=DashboardSettings(**settings))
    return TestClient(app, base_url="http://127.0.0.1")


@pytest.fixture
def client(db_url: str) -> Any:
    with make_client(db_url, actions=True) as c:
        yield c
        c.app.state.dashboard.close()  # type: ignore[attr-defined]


def dead_letter(conn: psycopg.Connection[Any], task_type: str = "audit", **kw: Any) -> int:
    task_id = slotd.enqueue(conn, task_type, kw.pop("payload", {}), max_attempts=1, **kw)
    conn.execute(
        "UPDATE slotd_tasks SET attempt_count = 1, last_attempted_at = now(), last_error = %s "
        "WHERE id = %s",
        (
            'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad org 7',
            task_id,
        ),
    )
    return task_id


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


def test_overview_counts_equal_status_json(client: TestClient, conn: Any, db_url: str) -> None:
    for i in range(3):
        slotd.enqueue(conn, "mail.send", {"i": i})
    slotd.enqueue(conn, "mail.send", {}, delay=timedelta(hours=1))
    dead_letter(conn, "audit")
    dead_letter(conn, "audit")
    page = client.get("/").text
    status = json.loads(
        CliRunner().invoke(main, ["status", "--json"], env={"SLOTD_DATABASE_URL": db_url}).stdout
    )
    for task_type in ("mail.send", "audit"):
        for kind in ("pending", "running", "dead"):
            cell = re.search(
                rf'<tr data-type="{re.escape(task_type)}">.*?data-kind="{kind}">(\d+)<',
                page,
                re.S,
            )
            assert cell, (task_type, kind)
            assert int(cell.group(1)) == status[kind].get(task_type, 0), (task_type, kind)
    # Nobody serves mail.send: the page says so.
    assert "no replica handles this type" in page


def test_counts_stop_at_the_cap(client: TestClient, conn: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(DashboardReads, "COUNT_CAP", 5)
    slotd.enqueue_many(conn, [("bulk", {"i": i}) for i in range(12)])
    page = client.get("/").text
    assert re.search(r'data-kind="pending">5\+<', page)


def test_payload_and_error_are_escaped_everywhere(client: TestClient, conn: Any) -> None:
    task_id = dead_letter(conn, "audit", payload={"note": XSS}, key=XSS)
    conn.execute("UPDATE slotd_tasks SET last_error = %s WHERE id = %s", (XSS, task_id))
    for path in ("/", "/dead", f"/tasks/{task_id}", f"/dead?q={XSS}"):
        page = client.get(path).text
        assert XSS not in page, path
    detail = client.get(f"/tasks/{task_id}").text
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in detail
    # Even an escaping slip could not run a script: only our own /static ones may.
    policy = client.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy


def test_task_detail_shows_traceback_run_at_key_and_cursor(client: TestClient, conn: Any) -> None:
    task_id = dead_letter(conn, "audit", payload={"cursor": "s/42/page-9"}, key="org:7")
    page = client.get(f"/tasks/{task_id}").text
    assert "Traceback (most recent call last)" in page and "ValueError: bad org 7" in page
    assert "s/42/page-9" in page and "org:7" in page and "run_at" in page
    assert client.get("/tasks/999999").status_code == 404


def test_dead_list_shows_last_line_and_filters(client: TestClient, conn: Any) -> None:
    a = dead_letter(conn, "audit", key="org:1")
    b = dead_letter(conn, "billing")
    page = client.get("/dead").text
    assert "ValueError: bad org 7" in page and "most recent call last" not in page
    only = client.get("/dead?type=billing").text
    assert f'data-id="{b}"' in only and f'data-id="{a}"' not in only
    by_key = client.get("/dead?q=org:1").text
    assert f'data-id="{a}"' in by_key and f'data-id="{b}"' not in by_key
    by_id = client.get(f"/dead?q={b}").text
    assert f'data-id="{b}"' in by_id and f'data-id="{a}"' not in by_id


def test_retry_one_needs_no_confirmation_and_is_logged(
    client: TestClient, conn: Any, caplog: Any
) -> None:
    task_id = dead_letter(conn)
    csrf = csrf_of(client.get("/dead").text)
    with caplog.at_level(logging.INFO, logger="slotd.dashboard"):
        reply = client.post(
            "/dead/action",
            data={"csrf": csrf, "scope": "ids", "id": str(task_id), "action": "retry"},
            follow_redirects=True,
        )
    assert "retried 1 dead letter" in reply.text
    assert conn.execute(
        "SELECT attempt_count FROM slotd_tasks WHERE id = %s", (task_id,)
    ).fetchone() == (0,)
    assert any(
        "who=anonymous" in r.message
        and "action=retry" in r.message
        and f"scope=ids:{task_id}" in r.message
        and "count=1" in r.message
        for r in caplog.records
    ), [r.message for r in caplog.records]


def test_bulk_purge_asks_first(client: TestClient, conn: Any) -> None:
    ids = [dead_letter(conn, "audit") for _ in range(3)]
    keep = dead_letter(conn, "billing")
    csrf = csrf_of(client.get("/dead?type=audit").text)
    form = {"csrf": csrf, "scope": "type", "type": "audit", "action": "purge"}
    ask = client.post("/dead/action", data=form)
    assert ask.status_code == 200 and "Purge 3 dead letters of audit?" in ask.text
    assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (4,)
    done = client.post("/dead/action", data={**form, "confirm": "yes"}, follow_redirects=True)
    assert "purged 3 dead letters" in done.text
    left = [r[0] for r in conn.execute("SELECT id FROM slotd_tasks")]
    assert left == [keep] and not set(ids) & set(left)


def test_selection_retry_confirms_then_retries_only_those(client: TestClient, conn: Any) -> None:
    a, b, c = (dead_letter(conn) for _ in range(3))
    csrf = csrf_of(client.get("/dead").text)
    form = {"csrf": csrf, "scope": "ids", "action": "retry", "id": [str(a), str(c)]}
    assert "Retry 2 dead letters?" in client.post("/dead/action", data=form).text
    client.post("/dead/action", data={**form, "confirm": "yes"})
    counts = dict(conn.execute("SELECT id, attempt_count FROM slotd_tasks").fetchall())
    assert counts == {a: 0, b: 1, c: 0}


def test_actions_refused_without_csrf_or_from_another_origin(client: TestClient, conn: Any) -> None:
    task_id = dead_letter(conn)
    csrf = csrf_of(client.get("/dead").text)
    form = {"scope": "ids", "id": str(task_id), "action": "purge"}
    assert client.post("/dead/action", data=form).status_code == 403
    assert client.post("/dead/action", data={**form, "csrf": "forged"}).status_code == 403
    evil = client.post(
        "/dead/action", data={**form, "csrf": csrf}, headers={"origin": "http://evil.example"}
    )
    assert evil.status_code == 403
    assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (1,)


def test_read_only_unless_enabled(db_url: str, conn: Any) -> None:
    task_id = dead_letter(conn)
    with make_client(db_url) as c:
        page = c.get("/dead").text
        assert "Retry selected" not in page
        reply = c.post(
            "/dead/action",
            data={"csrf": csrf_of(page), "scope": "ids", "id": str(task_id), "action": "purge"},
        )
        assert reply.status_code == 403 and "read-only" in reply.text
    assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (1,)


def test_token_required_for_pages_and_actions(db_url: str, conn: Any) -> None:
    task_id = dead_letter(conn)
    with make_client(db_url, token=TOKEN, actions=True) as c:
        first = c.get("/dead", follow_redirects=False)
        assert first.status_code == 303 and "/login" in first.headers["location"]
        login = c.get("/login?next=/dead")
        csrf = csrf_of(login.text)
        refused = c.post(
            "/dead/action",
            data={"csrf": csrf, "scope": "ids", "id": str(task_id), "action": "purge"},
        )
        assert refused.status_code == 401
        assert c.post("/login", data={"csrf": csrf, "token": "wrong"}).status_code == 401
        ok = c.post("/login?next=/dead", data={"csrf": csrf, "token": TOKEN})
        assert ok.status_code == 200 and f'data-id="{task_id}"' in ok.text
        assert TOKEN not in str(c.cookies.get("slotd_dashboard"))
    with make_client(db_url, token=TOKEN) as c:
        bearer = c.get("/", headers={"authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200


def test_basic_auth(db_url: str) -> None:
    with make_client(db_url, basic_user="ops", basic_password="pw-for-ops") as c:
        denied = c.get("/")
        assert denied.status_code == 401 and "Basic" in denied.headers["www-authenticate"]
        assert c.get("/", auth=("ops", "nope")).status_code == 401
        assert c.get("/", auth=("ops", "pw-for-ops")).status_code == 200


def test_no_password_on_any_page(db_url: str, conn: Any) -> None:
    # trust authentication ignores the password, so the URL works and carries one.
    url = db_url.replace("://", f"://postgres:{SECRET}@", 1) if "@" not in db_url else db_url
    dead_letter(conn)
    with make_client(url, actions=True) as c:
        for path in ("/", "/running", "/dead", "/schedules"):
            assert SECRET not in c.get(path).text
    down = f"postgresql://slotd:{SECRET}@/x?host=/nonexistent/sock&connect_timeout=1"
    app = create_app(down, settings=DashboardSettings())
    app.state.dashboard.pool = lambda: (_ for _ in ()).throw(  # type: ignore[attr-defined]
        psycopg.OperationalError(f"connection to {down} failed")
    )
    with TestClient(app) as c:
        page = c.get("/")
        assert page.status_code == 503 and "database error" in page.text
        assert SECRET not in page.text


def test_running_page_counts_down_and_flags_past_deadline(client: TestClient, conn: Any) -> None:
    ok, late = (slotd.enqueue(conn, "crunch", {}) for _ in range(2))
    # Two leases as a claim leaves them: one with its deadline ahead, one past it (a
    # handler the watchdog failed to stop) while the lease itself still runs.
    conn.execute(
        "UPDATE slotd_tasks SET lease_token = gen_random_uuid(), attempt_count = 1, "
        "last_attempted_at = now(), lease_expires_at = now() + CASE WHEN id = %s "
        "THEN interval '90 seconds' ELSE interval '10 seconds' END",
        (ok,),
    )
    page = client.get("/running").text  # the client's margin is the default 30s
    rows = dict(re.findall(r'<tr class="([^"]*)" data-id="(\d+)"', page)[i][::-1] for i in (0, 1))
    assert "overdue" in rows[str(late)] and "overdue" not in rows[str(ok)]
    assert re.search(rf'data-id="{ok}".*?data-deadline="\d+" data-now="\d+">(5\d|60)s<', page, re.S)


def test_outcomes_chart_reads_the_outcome_record(client: TestClient, conn: Any) -> None:
    from datetime import UTC, datetime

    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    Repository(conn).record_outcomes(
        [(minute, "audit", "success", 7), (minute, "audit", "failure", 2)]
    )
    Repository(conn).record_outcomes([(minute, "audit", "success", 1)])
    page = client.get("/").text
    assert "success 8" in page and "failure 2" in page and "(10 attempts" in page


def test_paused_types_show_on_the_overview_and_schedules_page(
    client: TestClient, conn: Any
) -> None:
    slotd.pause(conn, "audit", by="ops@test")
    slotd.pause(conn, "mail", until=timedelta(hours=1), by="ops@test")
    slotd.pause(conn, "billing", until=timedelta(hours=1), by="ops@test")
    conn.execute(
        "UPDATE slotd_paused_types SET until = now() - interval '1 minute' "
        "WHERE task_type = 'billing'"
    )  # a pause that ran out
    for task_type in ("audit", "billing", "mail"):
        slotd.enqueue(conn, task_type, {})
    overview = client.get("/").text
    cells = re.findall(r'<tr data-type="([^"]+)">.*?<td>([^<]*)</td>\s*<td>', overview, re.S)
    paused = dict(cells)
    assert paused["audit"] == "paused" and paused["mail"].startswith("until ")
    assert paused["billing"] == ""
    page = client.get("/schedules").text
    assert "ops@test" in page and "billing" not in page


def test_schedules_page_shows_next_fire_and_orphans(client: TestClient, conn: Any) -> None:
    conn.execute(
        "INSERT INTO slotd_schedules (name, task_type, expression, timezone, catch_up) "
        "VALUES ('hourly-audit', 'audit', 'every 3600s', 'UTC', 'latest')"
    )
    page = client.get("/schedules").text
    row = re.search(r"<tr><td>hourly-audit</td>(.*?)</tr>", page, re.S)
    assert row, page
    cells = re.findall(r"<td>([^<]*)</td>", row.group(1))
    assert cells[0] == "audit" and cells[1] == "every 3600s (UTC)"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", cells[4])  # the next fire
    assert cells[-1] == "nobody (orphaned)"  # no live replica declares it


def test_mounted_under_a_prefix(db_url: str, conn: Any) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    dead_letter(conn)
    host = Starlette(routes=[Mount("/ops/slotd", create_app(db_url, settings=DashboardSettings()))])
    with TestClient(host) as c:
        page = c.get("/ops/slotd/dead").text
        assert 'href="/ops/slotd/tasks/' in page and 'href="/ops/slotd/static/style.css"' in page
        assert c.get("/ops/slotd/static/dashboard.js").status_code == 200


def test_cli_refuses_public_address_without_auth(db_url: str) -> None:
    result = CliRunner().invoke(
        main, ["dashboard", "--addr", "0.0.0.0:8099"], env={"SLOTD_DATABASE_URL": db_url}
    )
    assert result.exit_code == 2
    assert "refusing to listen on 0.0.0.0 without authentication" in result.stderr
    bad = CliRunner().invoke(
        main, ["dashboard", "--addr", "nope"], env={"SLOTD_DATABASE_URL": db_url}
    )
    assert bad.exit_code == 2 and "bad --addr" in bad.stderr


def test_dashboard_statements_never_scan_the_table(conn: Any) -> None:
    """Every page's statements read indexes, at any size: pinned on 20,000 rows, where a
    sequential scan and a sort would already be the planner's choice without them."""
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, key, attempt_count, max_attempts, "
        "last_attempted_at, run_at) "
        "SELECT 'type_' || g % 7, 'k' || g, CASE WHEN g % 3 = 0 THEN 0 ELSE 20 END, 20, "
        "now() - g * interval '1 second', now() + g * interval '1 second' "
        "FROM generate_series(1, 20000) g"
    )
    conn.execute("VACUUM (ANALYZE) slotd_tasks")
    types = [f"type_{n}" for n in range(7)]
    checks = {
        "dash_types": {"limit": 500},
        "dash_counts": {"types": types, "cap": 10_000},
        "dash_running": {"margin_s": 30.0, "limit": 200},
        "dash_task": {"id": 5},
        "dash_dead_count": {"task_type": None, "cap": 10_000},
    }
    for task_type in (None, "type_3"):
        checks[f"dead_list {task_type}"] = {
            "task_type": task_type, "ids": None, "limit": 100, "key": None, "key_types": types,
        }  # fmt: skip
    checks["dead_list key"] = {
        "task_type": None, "ids": None, "limit": 100, "key": "k7", "key_types": types,
    }  # fmt: skip
    for label, params in checks.items():
        sql = statements()[label.split()[0]]
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, params).fetchall())
        assert "Seq Scan on slotd_tasks" not in plan, (label, plan)
        if label.startswith("dead_list") and label != "dead_list key":  # a key: a few rows
            assert "Sort Key: (COALESCE" not in plan, (label, plan)  # the listing's order
