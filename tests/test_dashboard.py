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
                rf'<tr data-type="{re.escape(task_type)}"[^>]*>.*?data-kind="{kind}">(\d+)<',
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
    assert "s/42/page-9" in page and "org:7" in page and "<dt>due</dt>" in page
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
    app.state.dashboard.database._pool = lambda lane: (_ for _ in ()).throw(  # type: ignore[attr-defined]
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
    assert "success 8" in page and "failure 2" in page and "10 attempts, 20% failed" in page
    # Its y-axis: round ticks up to the peak (10 attempts in one minute), and its unit.
    chart = re.search(r'data-chart="outcomes">(.*?)</figure>', page, re.S)
    assert chart, page
    ticks = re.findall(r'class="tick y-tick">([^<]+)<', chart.group(1))
    assert ticks == ["0", "5", "10"], ticks
    assert ">attempts / min<" in chart.group(1)
    # The type's own page charts only its attempts; its row on the overview its rates.
    row = re.search(r'<tr data-type="audit".*?</tr>', page, re.S)
    assert row and re.search(r'data-kind="failed">20%<', row.group(0)), row
    own = client.get("/types/audit")
    assert own.status_code == 200 and "10 attempts, 20% failed" in own.text
    day = client.get("/types/audit?window=day").text
    assert ">attempts / h<" in day and "last day, by hour" in day
    # Kept 25 hours (the record's own prune): five hours ago is on the day's chart.
    earlier = minute - timedelta(hours=5)
    Repository(conn).record_outcomes([(earlier, "audit", "timeout", 4)])
    Repository(conn).record_outcomes([(minute, "audit", "success", 2)])
    day = client.get("/types/audit?window=day").text
    assert (
        "16 attempts" in day
        and "timeout 4" in day
        and "16 attempts" not in (client.get("/types/audit").text)
    )
    # The window starts where its data does: the first hour labelled is that of the timeout.
    hours = re.findall(r'class="tick x-tick">(\d\d):00<', day)
    assert hours[0] == earlier.strftime("%H"), hours
    assert client.get("/?window=week").status_code == 400


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
    cells = re.findall(r'<tr data-type="([^"]+)"[^>]*>.*?<td>([^<]*)</td>\s*<td>', overview, re.S)
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


def fill_20k(conn: Any) -> None:
    """20,000 rows of 7 types, a third live, the rest dead, VACUUMed: the size at which a
    sequential scan and a sort would already be the planner's choice without the indexes."""
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, key, attempt_count, max_attempts, "
        "last_attempted_at, run_at) "
        "SELECT 'type_' || g % 7, 'k' || g, CASE WHEN g % 3 = 0 THEN 0 ELSE 20 END, 20, "
        "now() - g * interval '1 second', now() + g * interval '1 second' "
        "FROM generate_series(1, 20000) g"
    )
    conn.execute("VACUUM (ANALYZE) slotd_tasks")


def test_dashboard_statements_never_scan_the_table(conn: Any) -> None:
    """Every page's statements read indexes, at any size: pinned on 20,000 rows, where a
    sequential scan and a sort would already be the planner's choice without them."""
    fill_20k(conn)
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


def test_a_storm_of_lost_or_crashed_attempts_is_flagged_on_the_overview(
    client: TestClient, conn: Any
) -> None:
    from datetime import UTC, datetime

    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    Repository(conn).record_outcomes([(minute, "audit", "success", 9)])
    assert 'class="notice alarm"' not in client.get("/").text
    Repository(conn).record_outcomes(
        [(minute, "audit", "lost", 31), (minute - timedelta(minutes=3), "mail", "crashed", 4)]
    )
    page = client.get("/").text
    assert re.search(r'data-outcome="lost"><strong>31 lost</strong> attempts in the last 15', page)
    assert re.search(r'data-outcome="crashed"><strong>4 crashed</strong>', page)


def lease(conn: Any, task_id: int) -> None:
    """The row as a claim leaves it: a live lease, attempt 1."""
    conn.execute(
        "UPDATE slotd_tasks SET lease_token = gen_random_uuid(), attempt_count = 1, "
        "last_attempted_at = now(), lease_expires_at = now() + interval '1 hour' WHERE id = %s",
        (task_id,),
    )


def cancelled_ids(conn: Any) -> set[int]:
    rows = conn.execute("SELECT id FROM slotd_tasks WHERE cancelled_at IS NOT NULL")
    return {r[0] for r in rows}


def test_cancel_one_task_from_its_page_is_recorded_with_who_and_logged(
    client: TestClient, conn: Any, caplog: Any
) -> None:
    pending = slotd.enqueue(conn, "report", {})
    running = slotd.enqueue(conn, "report", {})
    lease(conn, running)
    page = client.get(f"/tasks/{running}").text
    assert 'id="cancel-task"' in page and "running for" in page
    with caplog.at_level(logging.INFO, logger="slotd.dashboard"):
        for task_id in (pending, running):
            reply = client.post(
                f"/tasks/{task_id}/cancel",
                data={"csrf": csrf_of(page), "back": f"/tasks/{task_id}"},
                follow_redirects=True,
            )
            assert reply.status_code == 200
    assert "cancelled 1 task (1 running: their replicas stop them)" in reply.text
    assert cancelled_ids(conn) == {pending, running}
    reason = conn.execute("SELECT last_error FROM slotd_tasks WHERE id = %s", (pending,))
    assert reason.fetchone()[0].startswith("cancelled by anonymous@dashboard at ")
    assert any(f"action=cancel scope=ids:{running} count=1" in r.message for r in caplog.records)
    # A second cancel finds nothing live: said so, nothing changed.
    again = client.post(f"/tasks/{pending}/cancel", data={"csrf": csrf_of(page)})
    assert "cancelled 0 tasks: nothing live matched" in again.text


def test_cancel_all_of_a_type_or_key_asks_with_a_count_first(client: TestClient, conn: Any) -> None:
    ids = slotd.enqueue_many(
        conn, [("report", {}, None, "a"), ("report", {}, None, "b"), ("report", {}, None, "c")]
    )
    lease(conn, ids[2])
    other = slotd.enqueue(conn, "audit", {})
    csrf = csrf_of(client.get("/").text)
    ask = client.post("/cancel", data={"csrf": csrf, "type": "report", "back": "/"})
    assert "Cancel 3 live tasks of report?" in ask.text and "1 running" in ask.text
    assert cancelled_ids(conn) == set()
    by_key = client.post("/cancel", data={"csrf": csrf, "type": "report", "key": "b"})
    assert "Cancel 1 live task of report with key b?" in by_key.text
    client.post("/cancel", data={"csrf": csrf, "type": "report", "key": "b", "confirm": "yes"})
    assert cancelled_ids(conn) == {ids[1]}
    done = client.post(
        "/cancel",
        data={"csrf": csrf, "type": "report", "confirm": "yes", "back": "/"},
        follow_redirects=True,
    )
    assert "cancelled 2 tasks (1 running" in done.text
    assert cancelled_ids(conn) == set(ids) and other not in cancelled_ids(conn)


def test_pause_for_a_while_and_resume_from_the_overview(client: TestClient, conn: Any) -> None:
    slotd.enqueue(conn, "report", {})
    csrf = csrf_of(client.get("/").text)
    paused = client.post(
        "/types/pause",
        data={"csrf": csrf, "type": "report", "until": "30m", "back": "/"},
        follow_redirects=True,
    )
    assert "paused report for 30m" in paused.text
    [row] = slotd.repository.paused_types(conn)
    assert row["paused_by"] == "anonymous@dashboard" and 1790 < row["remaining_s"] <= 1800
    assert 'data-action="resume"' in paused.text  # the row now offers Resume
    schedules = client.get("/schedules").text
    assert "<th>time left</th>" in schedules and "REMAINING_S" not in schedules.upper()
    assert re.search(r"<td>(29m 5\d|30m 00)s</td>", schedules), schedules
    resumed = client.post(
        "/types/resume", data={"csrf": csrf, "type": "report"}, follow_redirects=True
    )
    assert "resumed report" in resumed.text and not slotd.repository.paused_types(conn)
    bad = client.post("/types/pause", data={"csrf": csrf, "type": "report", "until": "soon"})
    assert bad.status_code == 400 and "bad until" in bad.text
    assert not slotd.repository.paused_types(conn)


@pytest.mark.parametrize(
    "path, form",
    [
        ("/tasks/{id}/cancel", {}),
        ("/cancel", {"type": "report", "confirm": "yes"}),
        ("/types/pause", {"type": "report"}),
    ],
)
def test_live_work_actions_need_the_setting_and_the_csrf_token(
    db_url: str, conn: Any, path: str, form: dict[str, str]
) -> None:
    task_id = slotd.enqueue(conn, "report", {})
    path = path.replace("{id}", str(task_id))
    with make_client(db_url) as ro:
        page = ro.get(f"/tasks/{task_id}").text
        assert 'id="cancel-task"' not in page and "Pause</button>" not in ro.get("/").text
        csrf = str(ro.cookies.get("slotd_csrf"))  # the right token: refused all the same
        assert ro.post(path, data={**form, "csrf": csrf}).status_code == 403
    with make_client(db_url, actions=True) as rw:
        rw.get("/")
        assert rw.post(path, data=form).status_code == 403
        assert rw.post(path, data={**form, "csrf": "forged"}).status_code == 403
    assert cancelled_ids(conn) == set() and not slotd.repository.paused_types(conn)


def many_dead(conn: Any, n: int, task_type: str = "audit") -> list[int]:
    """n dead letters, one stopping each second, the newest first in the list: ids, newest first."""
    ids = slotd.enqueue_many(conn, [(task_type, {"i": i}) for i in range(n)])
    conn.execute(
        "UPDATE slotd_tasks SET attempt_count = max_attempts, "
        "last_attempted_at = now() - (id %% 1000) * interval '1 second', "
        "last_error = 'Traceback (most recent call last):\n' || "
        "CASE WHEN id %% 10 = 0 THEN 'KeyError: org ' ELSE 'ValueError: bad org ' END || id "
        "WHERE id = ANY(%s)",
        (ids,),
    )
    return sorted(ids, key=lambda i: i % 1000)


def listed(page: str, table: str) -> list[int]:
    body = page.split(f'id="{table}"', 1)[-1] if f'id="{table}"' in page else ""
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', body)]


def follow(client: TestClient, path: str, table: str) -> list[list[int]]:
    pages = []
    while path:
        page = client.get(path)
        assert page.status_code == 200, page.text[-300:]
        pages.append(listed(page.text, table))
        found = re.search(r'<a href="([^"]+)" id="next-page">', page.text)
        path = found.group(1).replace("&amp;", "&") if found else ""
    return pages


def test_dead_letters_page_by_keyset_with_no_gap_or_repeat(client: TestClient, conn: Any) -> None:
    newest_first = many_dead(conn, 250)
    pages = follow(client, "/dead", "dead")
    assert [len(p) for p in pages] == [100, 100, 50]
    assert [i for p in pages for i in p] == newest_first
    assert "?after=" in client.get("/dead").text and "« Newest" not in client.get("/dead").text
    # The same by type, and a type's pages hold only its own.
    many_dead(conn, 5, "billing")
    by_type = follow(client, "/dead?type=audit", "dead")
    assert [i for p in by_type for i in p] == newest_first


def test_dead_letters_searched_by_the_start_of_their_error_line(
    client: TestClient, conn: Any, monkeypatch: Any
) -> None:
    from slotd.web import listings

    newest_first = many_dead(conn, 60)
    key_errors = [i for i in newest_first if i % 10 == 0]
    page = client.get("/dead?error=keyerror: ORG").text  # case-insensitive
    assert listed(page, "dead") == key_errors and "KeyError: org" in page
    # A search looks through a bounded stretch at a time and says where it went on from.
    monkeypatch.setattr(listings, "ERROR_SCAN", 25)
    pages = follow(client, "/dead?error=KeyError", "dead")
    assert [i for p in pages for i in p] == key_errors and len(pages) == 3
    assert client.get("/dead?after=nonsense").status_code == 400


def test_live_tasks_page_by_keyset_in_due_order(client: TestClient, conn: Any) -> None:
    ids = slotd.enqueue_many(conn, [("report", {"i": i}) for i in range(130)])
    conn.execute(
        "UPDATE slotd_tasks SET run_at = now() + (id %% 7) * interval '1 minute' "
        "WHERE id = ANY(%s)",
        (ids,),
    )
    order = [r[0] for r in conn.execute("SELECT id FROM slotd_tasks ORDER BY run_at, id")]
    pages = follow(client, "/tasks", "tasks")
    assert [len(p) for p in pages] == [100, 30]
    assert [i for p in pages for i in p] == order
    one = client.get(f"/tasks?q={ids[5]}").text
    assert listed(one, "tasks") == [ids[5]]


def test_keyset_pages_read_their_index_from_the_cursor(conn: Any) -> None:
    """A later page is an index range from the cursor, never a walk from the top or a sort."""
    fill_20k(conn)
    at = conn.execute("SELECT now() - interval '5000 seconds'").fetchone()[0]
    types = [f"type_{n}" for n in range(7)]
    search = {"ids": None, "key": None, "key_types": types, "limit": 100}
    for task_type in (None, "type_3"):
        params = {**search, "task_type": task_type, "after_at": at, "after_id": 15000}
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN " + statements()["dash_dead_page"], params)
        )
        assert "Index Cond: " in plan and "ROW(COALESCE" in plan, plan
        assert "Sort Key: (COALESCE" not in plan, plan
    params = {**search, "task_type": None, "after_at": at, "after_id": 3000}
    sql = statements()["dash_tasks_page"]
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, params))
    assert "Index Cond: ((task_type = l.task_type) AND (ROW(run_at, id) >" in plan, plan
    assert "Seq Scan on slotd_tasks" not in plan, plan


def test_overview_charts_the_backlog_and_flags_the_oldest_due(
    client: TestClient, conn: Any
) -> None:
    conn.execute(
        "INSERT INTO slotd_queue_history (minute, task_type, pending, running, oldest_due_s) "
        "SELECT date_trunc('minute', now()) - m * interval '1 minute', t, 10 * m, 1, m * 60 "
        "FROM generate_series(0, 30) m, unnest(ARRAY['report', 'audit']) t"
    )
    late = slotd.enqueue(conn, "report", {})
    conn.execute(
        "UPDATE slotd_tasks SET run_at = now() - interval '95 seconds' WHERE id = %s", (late,)
    )
    slotd.enqueue(conn, "audit", {})  # due now: not late
    slotd.pause(conn, "held", by="ops")
    held = slotd.enqueue(conn, "held", {})
    conn.execute("UPDATE slotd_tasks SET run_at = now() - interval '1 hour' WHERE id = %s", (held,))
    page = client.get("/").text
    headline = re.search(r'id="oldest-due">(.*?)</p>', page, re.S)
    assert headline and re.search(
        r"Oldest due: <strong[^>]*>1m 3\d+s</strong> \(report\)", headline.group(1)
    )
    # Starved (its oldest due cell in red); the flag says why: no replica serves it here.
    assert '<tr data-type="report" class="starved">' in page
    assert '<tr data-type="audit" class="">' in page
    assert re.search(r'data-type="held".*?1h 00m \(paused\)', page, re.S)  # waits on purpose
    for field in ("pending", "running", "oldest_due_s"):
        chart = re.search(rf'data-chart="{field}">(.*?)</figure>', page, re.S)
        assert chart and chart.group(1).count("<polyline") == 2, field


def test_a_live_update_is_the_pages_main_and_shares_one_read_per_page(
    db_url: str, conn: Any
) -> None:
    """What static/dashboard.js asks for: the page's <main> with its [data-live] parts;
    asks for the same page within half the interval read once (a tab more costs the
    database nothing more), while a full load always reads afresh."""
    slotd.enqueue(conn, "mail.send", {})
    with make_client(db_url, refresh=timedelta(seconds=60)) as client:
        full = client.get("/").text
        assert 'data-refresh="60000"' in full and 'src="/static/dashboard.js"' in full
        live = client.get("/", headers={"X-Slotd-Live": "1"})
        assert live.status_code == 200
        assert live.text.lstrip().startswith('<main id="main">') and "<header>" not in live.text
        assert live.headers["content-security-policy"].startswith("default-src 'self'")
        ids = set(re.findall(r'<div data-live id="([^"]+)"', live.text))
        assert ids == set(re.findall(r'<div data-live id="([^"]+)"', full)) and ids

        def pending(page: str) -> str:
            cell = re.search(r'data-type="mail.send".*?data-kind="pending">(\d+)<', page, re.S)
            assert cell, page
            return cell.group(1)

        assert pending(live.text) == "1"
        slotd.enqueue(conn, "mail.send", {})
        again = client.get("/", headers={"X-Slotd-Live": "1"}).text
        assert pending(again) == "1"  # the same read, within half the interval
        assert pending(client.get("/").text) == "2"  # a full load reads afresh
        for path in ("/running", "/types/mail.send", f"/tasks/{slotd.enqueue(conn, 'x', {})}"):
            part = client.get(path, headers={"X-Slotd-Live": "1"}).text
            assert "<div data-live id=" in part and "<header>" not in part, path
        client.app.state.dashboard.close()  # type: ignore[attr-defined]
    with make_client(db_url, refresh=None) as client:
        assert 'data-refresh="0"' in client.get("/").text  # off: snapshots, as before
        client.app.state.dashboard.close()  # type: ignore[attr-defined]


def test_the_refresh_setting_is_a_second_or_more_or_off(monkeypatch: Any) -> None:
    from slotd.errors import ConfigError

    for text, expected in (
        ("off", None),
        ("10s", timedelta(seconds=10)),
        ("", timedelta(seconds=5)),
    ):
        monkeypatch.setenv("SLOTD_DASHBOARD_REFRESH", text)
        assert DashboardSettings.from_env().refresh == expected
    for bad in ("0.5s", "soon"):
        monkeypatch.setenv("SLOTD_DASHBOARD_REFRESH", bad)
        with pytest.raises(ConfigError, match="SLOTD_DASHBOARD_REFRESH"):
            DashboardSettings.from_env()


def test_a_types_page_shows_its_counts_live_tasks_and_dead_letters(
    client: TestClient, conn: Any
) -> None:
    slotd.enqueue(conn, "mail.send", {}, key="to:ann")
    dead = dead_letter(conn, "mail.send")
    slotd.enqueue(conn, "other", {})
    page = client.get("/types/mail.send").text
    assert re.search(r'data-kind="pending">1<', page) and re.search(r'data-kind="dead">', page)
    assert "to:ann" in page and f'/tasks/{dead}"' in page and "ValueError: bad org 7" in page
    assert "no live replica has a handler for it" in page
    assert "/tasks/" in page and "other" not in page.split("<main", 1)[1]
    assert 'href="/types/mail.send"' in client.get("/").text  # linked from the overview
    assert client.get("/types/bad%20name").status_code == 400
