"""The dashboard in headless Chromium (Playwright, Debian's /usr/bin/chromium), served by a
real `slotd dashboard` against a real database that a real `slotd run` works on. Run with
`--browser` (tests/browser/run.sh installs what it needs); the page screenshots in the
README come from here (SLOTD_SCREENSHOT_DIR=docs/screenshots)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import slotd
from tests.daemon import ROOT, Daemon, wait_for

pytestmark = pytest.mark.browser
playwright_sync = pytest.importorskip(
    "playwright.sync_api", reason="the browser tests need playwright (tests/browser/run.sh)"
)
CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-test-token-0123456789"
XSS = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
SHOTS = Path(os.environ.get("SLOTD_SCREENSHOT_DIR") or "/tmp/slotd-dashboard-screenshots")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reachable(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def world(scratch_pg: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (tests/browser/run.sh)")
    url = scratch_pg.new_database()
    tmp = tmp_path_factory.mktemp("dashboard")
    # A heartbeat a second: the outcome chart and the lease holders show up without waiting.
    daemon = Daemon(
        url, app="tests.apps.dashboard:registry", env={"SLOTD_HEARTBEAT_INTERVAL": "1s"}
    )
    port = free_port()
    # The daemon's settings (its lease margin places the deadlines), plus the dashboard's.
    # Live pages ask again every second (5 s by default): the tests see updates sooner.
    env = {
        **daemon.env,
        "SLOTD_DASHBOARD_TOKEN": TOKEN,
        "SLOTD_DASHBOARD_ACTIONS": "on",
        "SLOTD_DASHBOARD_REFRESH": "1s",
    }
    web = subprocess.Popen(
        [sys.executable, "-m", "slotd", "dashboard", "--addr", f"127.0.0.1:{port}"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "dashboard.log").open("w"),
    )
    pw = playwright_sync.sync_playwright().start()
    try:
        daemon.start()
        wait_for(lambda: reachable(port) or web.poll() is not None, what="the dashboard")
        assert web.poll() is None, (tmp / "dashboard.log").read_text()
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        with psycopg.connect(url, autocommit=True) as conn:
            yield {
                "url": url,
                "server": scratch_pg.server,
                "env": env,
                "base": f"http://127.0.0.1:{port}",
                "browser": browser,
                "conn": conn,
                "tmp": tmp,
                "log": tmp / "dashboard.log",
                "pid": daemon.pid,
            }
        browser.close()
    finally:
        pw.stop()
        web.terminate()
        web.wait(20)
        daemon.close()


@pytest.fixture(scope="module")
def page(world: dict[str, Any]) -> Iterator[Any]:
    """A signed-in operator's tab."""
    context = world["browser"].new_context(viewport={"width": 1280, "height": 760})
    tab = context.new_page()
    tab.goto(world["base"] + "/")
    assert "/login" in tab.url  # nothing to see before signing in
    tab.fill("input[name=token]", TOKEN)
    tab.click("form.login button")
    tab.wait_for_url(world["base"] + "/")
    yield tab
    context.close()


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def enqueue(conn: Any, task_type: str, payload: dict[str, Any], **kw: Any) -> int:
    # One attempt: the first failure is a dead letter.
    return slotd.enqueue(conn, task_type, payload, max_attempts=1, **kw)


def is_dead(conn: Any, task_id: int) -> bool:
    row = conn.execute(
        "SELECT attempt_count >= max_attempts AND lease_token IS NULL FROM slotd_tasks "
        "WHERE id = %s",
        (task_id,),
    ).fetchone()
    return bool(row and row[0])


def test_overview_numbers_equal_slotd_status_json(world: dict[str, Any], page: Any) -> None:
    conn, tmp = world["conn"], world["tmp"]
    for org in (1, 2):
        dead = enqueue(conn, "dash.flaky", {"fixed": str(tmp / "never"), "org": org})
        wait_for(lambda dead=dead: is_dead(conn, dead), what="a dead letter")
    running = enqueue(conn, "dash.slow", {"release": str(tmp / "release-overview")})
    wait_for(
        lambda: conn.execute(
            "SELECT lease_token IS NOT NULL FROM slotd_tasks WHERE id = %s", (running,)
        ).fetchone()[0],
        what="the slow task to be claimed",
    )
    enqueue(conn, "report.weekly", {"week": 48})  # no replica has a handler for it
    enqueue(conn, "report.weekly", {"week": 49})
    try:
        status = json.loads(
            subprocess.run(
                [sys.executable, "-m", "slotd", "status", "--json"],
                env={**os.environ, "SLOTD_DATABASE_URL": world["url"]},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        page.goto(world["base"] + "/")
        shown: dict[str, dict[str, int]] = {"pending": {}, "running": {}, "dead": {}}
        for row in page.locator("#types tbody tr").all():
            task_type = row.get_attribute("data-type")
            for kind in shown:
                shown[kind][task_type] = int(row.locator(f"td[data-kind={kind}]").inner_text())
        for kind in shown:
            expected = {t: n for t, n in status[kind].items() if n}
            assert {t: n for t, n in shown[kind].items() if n} == expected, kind
        assert shown["running"]["dash.slow"] == 1 and shown["dead"]["dash.flaky"] == 2
        flagged = page.locator('#types tr[data-type="report.weekly"] .flag')
        assert flagged.inner_text() == "no replica handles this type"
        assert page.locator('#types tr[data-type="dash.flaky"] .flag').count() == 0
        assert page.locator("#replicas tbody tr").count() == len(status["replicas"]) == 1
    finally:
        (tmp / "release-overview").touch()


def test_failing_task_is_a_dead_letter_with_its_traceback_and_retry_runs_it(
    world: dict[str, Any], page: Any
) -> None:
    conn, tmp = world["conn"], world["tmp"]
    fix = tmp / "fixed-7"
    task_id = enqueue(conn, "dash.flaky", {"fixed": str(fix), "org": 7}, key="org:7")
    wait_for(lambda: is_dead(conn, task_id), what="the dead letter")
    page.goto(world["base"] + "/dead?type=dash.flaky")
    row = page.locator(f'#dead tr[data-id="{task_id}"]')
    assert row.locator(".error-line").inner_text() == "ValueError: org 7 not fixed yet"
    shot(page, "dead-letters")
    row.locator(f'a[href$="/tasks/{task_id}"]').click()
    error = page.locator("#error").inner_text()
    assert error.startswith("Traceback (most recent call last):")
    assert "ValueError: org 7 not fixed yet" in error and "tests/apps/dashboard.py" in error
    assert "org:7" in page.locator("dl.facts").inner_text()
    shot(page, "task")
    fix.touch()  # the fix is deployed; the operator retries
    page.click("button[value=retry]")
    page.wait_for_url(re.compile(r"/dead\?"))
    assert page.locator("#notice").inner_text() == "retried 1 dead letter"
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM slotd_tasks WHERE id = %s", (task_id,)).fetchone()[0]
            == 0
        ),
        what="the retried task to run and finish",
    )
    page.goto(world["base"] + "/dead?type=dash.flaky")
    assert page.locator(f'#dead tr[data-id="{task_id}"]').count() == 0
    log = world["log"].read_text()
    assert re.search(rf"who=token .*action=retry scope=ids:{task_id} count=1", log), log


def test_running_task_shows_a_live_countdown(world: dict[str, Any], page: Any) -> None:
    conn, tmp = world["conn"], world["tmp"]
    task_id = enqueue(conn, "dash.slow", {"release": str(tmp / "release-countdown")})
    try:
        wait_for(
            lambda: conn.execute(
                "SELECT lease_token IS NOT NULL FROM slotd_tasks WHERE id = %s", (task_id,)
            ).fetchone()[0],
            what="the slow task to be claimed",
        )
        wait_for(
            lambda: conn.execute(
                "SELECT count(*) FROM slotd_replicas WHERE leases ? %s", (str(task_id),)
            ).fetchone()[0],
            what="a heartbeat naming the lease's slot",
        )
        page.goto(world["base"] + "/running")
        row = page.locator(f'#running tr[data-id="{task_id}"]')
        assert row.locator("td").nth(3).inner_text() == f"{socket.gethostname()}:{world['pid']}"
        assert row.locator("td").nth(4).inner_text() in ("0", "1")  # one of its two slots
        cell = row.locator("td.countdown")
        first = cell.inner_text()
        assert re.fullmatch(r"\d+s", first), first
        assert 50 <= int(first[:-1]) <= 60  # a 60 s ceiling, claimed moments ago
        # The browser counts down by itself between page loads.
        page.wait_for_function(
            "([selector, first]) => document.querySelector(selector).textContent !== first",
            arg=[f'#running tr[data-id="{task_id}"] td.countdown', first],
        )
        assert int(cell.inner_text()[:-1]) < int(first[:-1])
        assert "overdue" not in (cell.locator("xpath=..").get_attribute("class") or "")
        shot(page, "running")
    finally:
        (tmp / "release-countdown").touch()


def test_xss_payload_renders_as_text(world: dict[str, Any], page: Any) -> None:
    conn = world["conn"]
    task_id = enqueue(conn, "dash.echo", {"note": XSS}, key=XSS)
    wait_for(lambda: is_dead(conn, task_id), what="the dead letter")
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    for path in (f"/tasks/{task_id}", "/dead", "/"):
        page.goto(world["base"] + path)
        assert page.evaluate("typeof window.pwned") == "undefined", path
    page.goto(world["base"] + f"/tasks/{task_id}")
    assert json.loads(page.locator("#payload").inner_text()) == {"note": XSS}
    assert XSS in page.locator("#error").inner_text()
    assert page.locator("main script, main img").count() == 0
    assert not dialogs


def test_actions_without_the_token_are_refused(world: dict[str, Any], page: Any) -> None:
    conn, tmp = world["conn"], world["tmp"]
    task_id = enqueue(conn, "dash.flaky", {"fixed": str(tmp / "never"), "org": 9})
    wait_for(lambda: is_dead(conn, task_id), what="the dead letter")
    stranger = world["browser"].new_context()
    try:
        form = {"scope": "ids", "id": str(task_id), "action": "purge", "csrf": "x"}
        reply = stranger.request.post(world["base"] + "/dead/action", form=form)
        assert reply.status == 401
        page_view = stranger.new_page()
        page_view.goto(world["base"] + "/dead")
        assert "/login" in page_view.url
        # Signed in but without the page's CSRF token: refused as well.
        forged = page.context.request.post(world["base"] + "/dead/action", form=form)
        assert forged.status == 403
    finally:
        stranger.close()
    assert is_dead(conn, task_id)


def test_schedules_page_lists_the_fleets_schedules_and_pauses(
    world: dict[str, Any], page: Any
) -> None:
    conn = world["conn"]
    wait_for(
        lambda: conn.execute("SELECT count(*) FROM slotd_schedules").fetchone()[0],
        what="the replica to record its schedule",
    )
    slotd.pause(conn, "report.weekly", by="ops@dashboard-test")
    page.goto(world["base"] + "/schedules")
    assert page.locator("h1").inner_text() == "Schedules & paused types"
    tables = page.locator("main table")
    assert "weekly-digest" in tables.nth(0).inner_text()
    assert "report.weekly" in tables.nth(1).inner_text()
    shot(page, "schedules")
    slotd.resume(conn, "report.weekly")


def leased(conn: Any, task_id: int) -> bool:
    row = conn.execute(
        "SELECT lease_token IS NOT NULL FROM slotd_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    return bool(row and row[0])


def test_cancel_a_running_task_from_running_now_and_it_ends_cancelled(
    world: dict[str, Any], page: Any
) -> None:
    conn, tmp = world["conn"], world["tmp"]
    task_id = enqueue(conn, "dash.slow", {"release": str(tmp / "never-released")})
    wait_for(lambda: leased(conn, task_id), what="the slow task to be claimed")
    page.goto(world["base"] + "/running")
    row = page.locator(f'#running tr[data-id="{task_id}"]')
    assert re.fullmatch(r"\d+s", row.locator("td.age").inner_text())
    row.locator("button", has_text="Cancel").click()
    page.wait_for_url(re.compile(r"/running\?done=cancel"))
    assert page.locator("#notice").inner_text() == (
        "cancelled 1 task (1 running: their replicas stop them)"
    )
    # The replica hears of it, stops the handler and settles the lease: a dead letter.
    wait_for(lambda: is_dead(conn, task_id), what="the cancelled task to be settled")
    page.goto(world["base"] + f"/tasks/{task_id}")
    assert page.locator("h1 .state").inner_text() == "cancelled"  # slotd's one vocabulary
    assert page.locator("#error").inner_text().startswith("cancelled by token@dashboard at ")
    assert page.locator("#cancel-task").count() == 0  # nothing left to cancel
    wait_for(
        lambda: conn.execute(
            "SELECT sum(count) FROM slotd_outcomes WHERE task_type = 'dash.slow' "
            "AND outcome = 'cancelled'"
        ).fetchone()[0],
        what="the cancelled outcome in the record",
    )
    log = world["log"].read_text()
    assert re.search(rf"who=token .*action=cancel scope=ids:{task_id} count=1", log), log


def test_pause_stops_claims_of_a_type_and_resume_starts_them_again(
    world: dict[str, Any], page: Any
) -> None:
    conn, tmp = world["conn"], world["tmp"]
    page.goto(world["base"] + "/")
    row = page.locator('#types tr[data-type="dash.digest"]')
    row.locator("button[data-action=pause]").click()
    page.wait_for_url(re.compile(r"/\?done=pause"))
    assert page.locator("#notice").inner_text() == "paused dash.digest until resumed"
    held = enqueue(conn, "dash.digest", {})
    (tmp / "fixed-pause").touch()
    after = enqueue(conn, "dash.flaky", {"fixed": str(tmp / "fixed-pause"), "org": 0})

    def gone(task_id: int) -> bool:
        found = conn.execute("SELECT 1 FROM slotd_tasks WHERE id = %s", (task_id,)).fetchone()
        return found is None

    # A task enqueued after it ran: the replica claims, and passes the paused type by.
    wait_for(lambda: gone(after), what="the later task of another type to run")
    assert not gone(held) and not leased(conn, held)
    page.goto(world["base"] + "/")
    assert "paused" in row.inner_text()
    shot(page, "overview-paused")
    row.locator("button[data-action=resume]").click()
    page.wait_for_url(re.compile(r"/\?done=resume"))
    assert page.locator("#notice").inner_text() == "resumed dash.digest"
    wait_for(lambda: gone(held), what="the paused type's task to run after the resume")
    log = world["log"].read_text()
    assert re.search(r"who=token .*action=pause scope=type:dash.digest count=1", log), log


def test_page_past_the_first_100_dead_letters(world: dict[str, Any], page: Any) -> None:
    conn = world["conn"]
    ids = slotd.enqueue_many(conn, [("dash.bulk", {"i": i}) for i in range(130)])
    # 130 dead letters of a type no replica serves, one stopping each second.
    conn.execute(
        "UPDATE slotd_tasks SET attempt_count = max_attempts, last_error = 'ValueError: bulk', "
        "last_attempted_at = now() - (id - %s) * interval '1 second' WHERE id = ANY(%s)",
        (ids[0], ids),
    )
    page.goto(world["base"] + "/dead?type=dash.bulk")
    first = [int(r.get_attribute("data-id")) for r in page.locator("#dead tbody tr").all()]
    assert first == ids[:100]
    page.click("#next-page")
    page.wait_for_url(re.compile(r"after="))
    second = [int(r.get_attribute("data-id")) for r in page.locator("#dead tbody tr").all()]
    assert second == ids[100:]
    assert page.locator("#next-page").count() == 0
    page.click("#first-page")
    page.wait_for_url(re.compile(r"/dead\?type=dash.bulk$"))
    assert page.locator("#dead tbody tr").count() == 100


def test_outcome_chart_shows_what_the_replica_reported(world: dict[str, Any], page: Any) -> None:
    """The supervisor adds its slots' outcomes to slotd_outcomes at each heartbeat;
    the chart then shows them. Runs last: the earlier tests made the outcomes."""
    conn = world["conn"]

    def reported() -> dict[str, int]:
        rows = conn.execute("SELECT outcome, sum(count) FROM slotd_outcomes GROUP BY 1")
        return {outcome: int(n) for outcome, n in rows}

    wait_for(lambda: reported().get("success"), what="a heartbeat's outcomes")
    counts = reported()
    page.goto(world["base"] + "/")
    legend = page.locator("#outcome-legend").inner_text()
    for outcome, n in counts.items():
        assert f"{outcome} {n}" in legend, (outcome, legend)
    assert page.locator("svg.chart rect[fill]").count() >= 1
    # The backlog charts: the replica samples the queue once a minute (its first sample
    # within seconds of its start); the unserved report.weekly tasks are still pending.
    wait_for(
        lambda: conn.execute(
            "SELECT count(*) FROM slotd_queue_history WHERE task_type = 'report.weekly'"
        ).fetchone()[0],
        timeout=90,
        what="a backlog sample",
    )
    page.goto(world["base"] + "/")
    pending = page.locator('#backlog figure[data-chart="pending"] polyline')
    assert pending.count() >= 1
    assert "report.weekly" in page.locator("#backlog ul.legend").inner_text()
    assert page.locator("#oldest-due").inner_text().startswith("Oldest due: ")
    shot(page, "overview")


def test_a_task_page_links_its_parents_and_dependants(world: dict[str, Any], page: Any) -> None:
    """A dependant waiting on a parent nobody serves here: the parent's page links it, its
    page says what it waits on and that it has no due time yet."""
    conn = world["conn"]
    parent = slotd.enqueue(conn, "dash.unserved", {"n": 1})
    child = slotd.enqueue(conn, "dash.echo", {}, after=[parent])
    page.goto(world["base"] + f"/tasks/{parent}")
    page.locator(f"#dependants a[href$='/tasks/{child}']").click()
    page.wait_for_url(world["base"] + f"/tasks/{child}")
    assert page.locator("#parents").inner_text() == f"{parent} (pending, not run yet)"
    assert page.locator("#result-state").inner_text() == "waiting"
    assert "after its parents" in page.locator("dl.facts").inner_text()
    shot(page, "task-dependant")


def finished_in_place(tab: Any) -> None:
    """Marks the tab's window: a reload would lose the mark (see `not_reloaded`)."""
    tab.evaluate("window.__sameDocument = true")
    tab.wait_for_function(
        "() => document.getElementById('live-status').textContent.includes('live')"
    )


def not_reloaded(tab: Any) -> bool:
    return bool(tab.evaluate("window.__sameDocument === true"))


def test_pages_update_without_reload_when_a_task_finishes(world: dict[str, Any], page: Any) -> None:
    """A running task's page and "Running now", open in two tabs, follow the task to its
    end by themselves: its row leaves "Running now", its page says it finished."""
    conn, tmp = world["conn"], world["tmp"]
    release = tmp / "release-live"
    task_id = enqueue(conn, "dash.slow", {"release": str(release)})
    running = page.context.new_page()
    try:
        wait_for(lambda: leased(conn, task_id), what="the slow task to be claimed")
        running.goto(world["base"] + "/running")
        page.goto(world["base"] + f"/tasks/{task_id}")
        assert page.locator("h1 .state").inner_text() == "running"
        assert running.locator(f'#running tr[data-id="{task_id}"]').count() == 1
        for tab in (page, running):
            finished_in_place(tab)
        release.touch()
        running.wait_for_function(
            f"() => !document.querySelector('#running tr[data-id=\"{task_id}\"]')", timeout=20_000
        )
        page.wait_for_function(
            "() => document.getElementById('main').textContent.includes('it finished')",
            timeout=20_000,
        )
        for tab in (page, running):
            assert not_reloaded(tab)
        assert "live, updated " in running.locator("#live-status").inner_text()
    finally:
        release.touch()
        running.close()


def test_charts_have_axes_units_and_start_where_their_data_does(
    world: dict[str, Any], page: Any
) -> None:
    conn = world["conn"]
    wait_for(
        lambda: conn.execute("SELECT count(*) FROM slotd_outcomes").fetchone()[0],
        what="a heartbeat's outcomes",
    )
    first = conn.execute(
        "SELECT extract(epoch FROM now() - min(minute)) / 60 FROM slotd_outcomes"
    ).fetchone()[0]
    page.goto(world["base"] + "/")
    chart = page.locator("#outcome-chart")
    ticks = chart.locator("text.y-tick").all_text_contents()
    assert ticks[0] == "0" and len(ticks) >= 2, ticks
    assert [int(t) for t in ticks] == sorted(int(t) for t in ticks)
    assert chart.locator("text.unit").text_content() == "attempts / min"
    times = chart.locator("text.x-tick").all_text_contents()
    assert times and all(re.fullmatch(r"\d\d:\d\d", t) for t in times), times
    assert chart.locator("rect[fill]").count() >= 1
    # The window starts with the data (minutes old here), not an hour back: at least ten
    # minutes drawn, and no more than the data's age.
    caption = page.locator('figure[data-chart="outcomes"] figcaption').inner_text()
    since, until = re.match(r"(\d\d:\d\d)–(\d\d:\d\d) UTC", caption).groups()  # type: ignore[union-attr]
    span = (int(until[:2]) * 60 + int(until[3:]) - int(since[:2]) * 60 - int(since[3:])) % 1440
    assert 10 <= span <= max(10, int(first) + 2), (caption, first)
    # Throughput and failure rate per type, at a glance on the overview's table.
    flaky = page.locator('#types tr[data-type="dash.flaky"]')
    assert re.fullmatch(
        r"[\d.]+/min", flaky.locator('[data-kind="throughput"]').inner_text().strip()
    )
    assert flaky.locator('[data-kind="failed"]').inner_text().endswith("%")
    # The last day, by hour.
    page.locator('a[data-window="day"]').first.click()
    page.wait_for_url(re.compile(r"window=day"))
    chart = page.locator("#outcome-chart")
    assert chart.locator("text.unit").text_content() == "attempts / h"
    assert all(
        re.fullmatch(r"\d\d:00", t) for t in chart.locator("text.x-tick").all_text_contents()
    )
    for name in ("pending", "running", "oldest_due_s"):
        figure = page.locator(f'#backlog figure[data-chart="{name}"]')
        if figure.count():
            assert figure.locator("text.y-tick").count() >= 2
    shot(page, "overview-day")


def test_a_batch_is_drawn_and_each_box_links_to_its_task(world: dict[str, Any], page: Any) -> None:
    conn, tmp = world["conn"], world["tmp"]
    (tmp / "fixed-batch").touch()
    release = tmp / "release-batch"
    with slotd.batch(conn, on_complete=("dash.echo", {"note": "batch done"})) as b:
        ok = b.enqueue("dash.flaky", {"fixed": str(tmp / "fixed-batch")}, max_attempts=1)
        bad = b.enqueue("dash.echo", {"note": "member failed"}, max_attempts=1)
        held = b.enqueue("dash.slow", {"release": str(release)}, max_attempts=1)
    try:
        wait_for(lambda: is_dead(conn, bad) and leased(conn, held), what="two members' ends")
        wait_for(
            lambda: not conn.execute("SELECT 1 FROM slotd_tasks WHERE id = %s", (ok,)).fetchone(),
            what="the succeeded member",
        )
        batch_id = conn.execute("SELECT batch_id FROM slotd_tasks WHERE id = %s", (bad,))
        batch_id = batch_id.fetchone()[0]
        page.goto(world["base"] + f"/tasks/{held}")
        page.locator("#batch-link").click()
        page.wait_for_url(world["base"] + f"/batches/{batch_id}")
        ended = page.locator("#batch-ended").inner_text()
        assert "succeeded 1" in ended and "failed 1" in ended, ended
        graph = page.locator("svg.workflow-graph")
        assert graph.locator(f'a[href$="/tasks/{bad}"]').get_attribute("data-state") == "failed"
        assert graph.locator(f'a[href$="/tasks/{held}"]').get_attribute("data-state") == "running"
        assert "callback, after 1 more" in graph.text_content()
        assert graph.locator("path.edge").count() == 2
        shot(page, "batch")
        finished_in_place(page)
        release.touch()
        # The last member ends: the callback's box appears, linked, without a reload.
        page.wait_for_function(
            "() => document.querySelector('svg.workflow-graph').textContent.includes('callback #')",
            timeout=20_000,
        )
        assert not_reloaded(page)
        page.locator("svg.workflow-graph a", has_text="callback #").click()
        page.wait_for_url(re.compile(r"/tasks/\d+$"))
        assert "dash.echo" in page.locator("dl.facts").inner_text() or (
            "finished" in page.locator("main").inner_text()
        )
    finally:
        release.touch()


def state_of(conn: Any, task_id: int) -> str | None:
    got = slotd.result(conn, task_id)
    return None if got is None else got.state


def test_a_tasks_page_shows_every_attempt_with_its_error_folded(
    world: dict[str, Any], page: Any
) -> None:
    """A task that failed, then succeeded on its retry, through the real `slotd run`: its
    row is gone, its history kept (keep_history), and its page lists both attempts, the
    failure's traceback folded to its last line until clicked."""
    conn = world["conn"]
    task_id = slotd.enqueue(conn, "dash.twice", {"order": 31})
    got = slotd.wait_result(conn, task_id, timeout=30)
    assert got is not None and got.state == "succeeded"
    page.goto(world["base"] + f"/tasks/{task_id}")
    assert page.locator("h1 .state").inner_text() == "succeeded"
    rows = page.locator("#attempts tbody tr")
    assert rows.count() == 2
    second, first = rows.all()
    assert (second.get_attribute("data-outcome"), first.get_attribute("data-outcome")) == (
        "success",
        "failure",
    )
    summary = first.locator("summary")
    assert summary.inner_text() == "ConnectionError: card gateway timed out for order 31"
    traceback = first.locator("details pre")
    assert not traceback.is_visible()  # folded
    summary.click()
    assert traceback.is_visible()
    assert traceback.inner_text().startswith("Traceback (most recent call last):")
    assert "tests/apps/dashboard.py" in traceback.inner_text()
    worker = rf"{re.escape(socket.gethostname())}:{world['pid']}:\d+"
    for row in (first, second):
        assert re.fullmatch(worker, row.locator("td.worker").inner_text()), worker
        assert re.fullmatch(r"\d+s", row.locator("td.n").nth(1).inner_text())
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page.locator("#started").inner_text()
    )
    assert page.locator("#ended").inner_text().endswith("(succeeded)")
    shot(page, "task-attempts")
    page.set_viewport_size({"width": 400, "height": 800})
    try:
        assert page.evaluate("document.documentElement.scrollWidth") <= 400
    finally:
        page.set_viewport_size({"width": 1280, "height": 760})


def test_an_unfolded_traceback_stays_open_while_the_page_updates(
    world: dict[str, Any], page: Any
) -> None:
    """A task whose first attempt failed runs its second: the page's attempts update every
    second (the running attempt's duration), and the failure's traceback the operator
    unfolded stays unfolded through those updates."""
    conn, tmp = world["conn"], world["tmp"]
    release = tmp / "release-again"
    task_id = slotd.enqueue(conn, "dash.again", {"release": str(release)})
    try:
        wait_for(
            lambda: conn.execute(
                "SELECT attempt_count = 2 AND lease_token IS NOT NULL FROM slotd_tasks "
                "WHERE id = %s",
                (task_id,),
            ).fetchone()[0],
            what="the second attempt running",
        )
        page.goto(world["base"] + f"/tasks/{task_id}")
        finished_in_place(page)
        running = page.locator('#attempts tr[data-outcome="running"] td:nth-child(4)')
        before = running.inner_text()
        failed = page.locator('#attempts tr[data-outcome="failure"]')
        failed.locator("summary").click()
        assert failed.locator("details pre").is_visible()
        # The operator reads on: the focus and the mouse leave the attempts (a part holding
        # either waits, by design).
        page.locator("h1").click()
        # The attempts part is replaced by a live update (the running duration moved on)...
        page.wait_for_function(
            "(before) => document.querySelector("
            "'#attempts tr[data-outcome=\"running\"] td:nth-child(4)')"
            ".textContent !== before",
            arg=before,
            timeout=20_000,
        )
        assert not_reloaded(page)
        # ...and the traceback is still open.
        assert failed.locator("details").get_attribute("open") is not None
        assert f"ValueError: first try of {task_id} fails" in failed.locator("pre").inner_text()
    finally:
        release.touch()


def test_a_waiting_tasks_page_shows_its_steps_and_what_it_waits_for(
    world: dict[str, Any], page: Any
) -> None:
    """Through the real `slotd run`: a task that stored two steps and waits for its event,
    and one that sleeps durably for a day; their pages show the steps, the event's name,
    the wake time; the emit ends the wait and the page follows without a reload."""
    conn = world["conn"]
    waiter = slotd.enqueue(conn, "dash.approve", {"order": 32, "amount": 5})
    sleeper = slotd.enqueue(conn, "dash.nap", {})
    wait_for(
        lambda: state_of(conn, waiter) == state_of(conn, sleeper) == "waiting",
        what="both tasks waiting",
    )
    page.goto(world["base"] + f"/tasks/{waiter}")
    assert page.locator("h1 .state").inner_text() == "waiting"
    assert page.locator("#wait-event").inner_text() == "approved:32"
    assert re.match(
        r"\d{4}-.* UTC \(in (59m \d\ds|1h 00m); the wait", page.locator("#wake").inner_text()
    )
    steps = page.locator("#steps tbody tr")
    assert [r.get_attribute("data-name") for r in steps.all()] == [
        "charge",
        "reserve",
        "slotd.event:approved:32",  # the wait: stored as a step once served
    ]
    assert re.fullmatch(r"3\d\d B", steps.nth(0).locator("td.n").nth(1).inner_text())
    shot(page, "task-waiting")
    page.goto(world["base"] + f"/tasks/{sleeper}")
    assert re.match(r"until .* UTC \(in (23h 59m|1d 0h)\)", page.locator("#wake").inner_text())
    assert page.locator('#steps tr[data-name="remind"]').count() == 1
    page.goto(world["base"] + f"/tasks/{waiter}")
    finished_in_place(page)
    slotd.emit(conn, "approved:32")
    page.wait_for_function(
        "() => document.getElementById('main').textContent.includes('no task')", timeout=20_000
    )
    assert not_reloaded(page)


def test_search_tasks_by_state_tag_and_id(world: dict[str, Any], page: Any) -> None:
    """The tasks page's search form: a state and a tag find a dead letter among live
    tasks; the tag alone finds both; an id finds a succeeded task kept by keep_history,
    whose row is gone, and its link opens its page."""
    conn = world["conn"]
    dead = slotd.enqueue(conn, "dash.echo", {"note": "tagged"}, max_attempts=1, tags=["t:44"])
    live = slotd.enqueue(conn, "report.weekly", {"week": 50}, tags=["t:44"])  # unserved
    kept = slotd.enqueue(conn, "dash.twice", {"order": 44})
    wait_for(lambda: is_dead(conn, dead), what="the tagged dead letter")
    got = slotd.wait_result(conn, kept, timeout=30)
    assert got is not None and got.state == "succeeded"

    def shown() -> list[tuple[int, str]]:
        rows = page.locator("#tasks tbody tr").all()
        return [(int(r.get_attribute("data-id")), r.get_attribute("data-state")) for r in rows]

    page.goto(world["base"] + "/tasks")
    page.select_option("#search select[name=state]", "failed")
    page.fill("#search input[name=tag]", "t:44")
    page.click("#search button")
    page.wait_for_url(re.compile(r"state=failed"))
    assert shown() == [(dead, "failed")]
    page.select_option("#search select[name=state]", "")
    page.click("#search button")
    page.wait_for_url(re.compile(r"state=&"))
    assert shown() == [(live, "pending"), (dead, "failed")]
    shot(page, "tasks-search")
    page.fill("#search input[name=tag]", "")
    page.fill("#search input[name=q]", str(kept))
    page.click("#search button")
    page.wait_for_url(re.compile(rf"q={kept}"))
    assert shown() == [(kept, "succeeded")]
    page.locator(f'#tasks a[href$="/tasks/{kept}"]').click()
    page.wait_for_url(world["base"] + f"/tasks/{kept}")
    assert page.locator("h1 .state").inner_text() == "succeeded"
    assert page.locator("#attempts tbody tr").count() == 2


def test_the_narrow_layout_never_spills_sideways(world: dict[str, Any], page: Any) -> None:
    """At 400 px every page fits its width (wide tables scroll inside their own box); the
    screenshots at 1400 and 400 px are the docs' (docs/how-to/dashboard.md)."""
    conn = world["conn"]
    dead = conn.execute(
        "SELECT id FROM slotd_tasks WHERE attempt_count >= max_attempts ORDER BY id LIMIT 1"
    ).fetchone()[0]
    batch = conn.execute("SELECT max(id) FROM slotd_batches").fetchone()[0]
    paths = ["/", "/running", "/tasks", "/tasks?state=failed", "/dead", "/schedules",
             "/types/dash.flaky", f"/tasks/{dead}", "/?window=day"]  # fmt: skip
    if batch is not None:
        paths.append(f"/batches/{batch}")
    try:
        page.set_viewport_size({"width": 1400, "height": 900})
        page.goto(world["base"] + "/")
        shot(page, "overview-1400")
        page.set_viewport_size({"width": 400, "height": 800})
        for path in paths:
            page.goto(world["base"] + path)
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 400, (path, wide)
        page.goto(world["base"] + "/")
        shot(page, "overview-400")
        page.goto(world["base"] + f"/tasks/{dead}")
        shot(page, "task-400")
    finally:
        page.set_viewport_size({"width": 1280, "height": 760})


def test_live_pages_behind_a_transaction_pooler(world: dict[str, Any]) -> None:
    """A dashboard whose database is a PgBouncer in transaction mode with ONE server
    connection: its live pages update as they do straight to the server (each update one
    short transaction, nothing held between two), and another client of the pooler gets
    the connection between two updates."""
    from tests.pgbouncer import binary, pgbouncer

    if binary() is None:
        pytest.skip("pgbouncer is not installed (apt-get install -y pgbouncer)")
    conn, tmp = world["conn"], world["tmp"]
    release = tmp / "release-pooled"
    with pgbouncer(world["server"], "transaction", pool_size=1) as bouncer:
        url = bouncer.url_for(world["url"])
        port = free_port()
        env = {**world["env"], "SLOTD_DATABASE_URL": url, "SLOTD_DASHBOARD_TOKEN": ""}
        env.pop("SLOTD_DATABASE_URL_READ", None)
        web = subprocess.Popen(
            [sys.executable, "-m", "slotd", "dashboard", "--addr", f"127.0.0.1:{port}"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "pooled.log").open("w"),
        )
        context = world["browser"].new_context(viewport={"width": 1280, "height": 760})
        bystander = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        try:
            wait_for(lambda: reachable(port) or web.poll() is not None, what="the dashboard")
            assert web.poll() is None, (tmp / "pooled.log").read_text()
            tab = context.new_page()
            tab.goto(f"http://127.0.0.1:{port}/running")
            finished_in_place(tab)
            task_id = enqueue(conn, "dash.slow", {"release": str(release)})
            row = f'#running tr[data-id="{task_id}"]'
            tab.wait_for_selector(row, timeout=20_000)  # it appears without a reload
            assert bystander.execute("SELECT 1").fetchone() == (1,)
            release.touch()
            tab.wait_for_selector(row, state="detached", timeout=20_000)
            assert not_reloaded(tab)
            assert "live, updated " in tab.locator("#live-status").inner_text()
            assert bystander.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (
                0,
            )
        finally:
            release.touch()
            bystander.close()
            context.close()
            web.terminate()
            web.wait(20)
