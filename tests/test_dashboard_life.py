"""A task's life on its dashboard page (#44 item 2, #38 item 6), with the real app over the
repository's real statements: every attempt with its error, worker and duration; a kept
success found after its row is gone; steps and what a task waits for; and a task with
10,000 attempts and 10,000 steps shown a page at a time."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import psycopg

import slotd
from slotd.repository import Repository, statements
from slotd.web import pages
from tests.test_dashboard import make_client

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "app/orders.py", line 12, in charge\n'
    "    gateway.charge(order)\n"
    "ConnectionError: card gateway timed out for order 31\n"
)


def registry() -> slotd.Registry:
    reg = slotd.Registry()
    reg.register(
        "life.order", lambda task, ctx: None, ceiling=timedelta(seconds=30), max_attempts=3
    )
    return reg


def fail_then_succeed(conn: psycopg.Connection[Any], keep_s: float = 3600.0, **enqueue: Any) -> int:
    """A task whose first attempt fails and whose second succeeds, kept without its value
    (keep_history), through the statements a worker settles with. `enqueue`: its key,
    tags..."""
    reg = registry()
    repo = Repository(conn)
    task_id = slotd.enqueue(conn, "life.order", {"order": 31}, **enqueue)
    claimed = repo.claim([task_id], reg)
    assert claimed is not None
    repo.record_failure(task_id, claimed.token, TRACEBACK, backoff_base=timedelta(0))
    conn.execute("UPDATE slotd_tasks SET run_at = now() WHERE id = %s", (task_id,))
    claimed = repo.claim([task_id], reg)
    assert claimed is not None
    repo.dequeue(task_id, claimed.token, kept=(None, keep_s))
    return task_id


def rows_of(page: str, table: str) -> list[str]:
    body = page.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr data-[^>]*>.*?</tr>", body, re.S)


def test_a_kept_success_shows_every_attempt_with_its_error_worker_and_duration(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    task_id = fail_then_succeed(conn)
    assert conn.execute("SELECT 1 FROM slotd_tasks WHERE id = %s", (task_id,)).fetchone() is None
    with make_client(db_url) as client:
        reply = client.get(f"/tasks/{task_id}")
        assert reply.status_code == 200, reply.text  # found, not "no task"
        page = reply.text
        assert '<span class="state state-succeeded">succeeded</span>' in page
        assert "keep_history: its state and attempts, not its value" in page
        assert re.search(r'id="started">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC<', page)
        assert re.search(r'id="ended">\d{4}-[^<]+ UTC <span class="hint">\(succeeded\)', page)
        newest, first = rows_of(page, "attempts")
        assert 'data-number="2" data-outcome="success"' in newest and "<details" not in newest
        assert 'data-number="1" data-outcome="failure"' in first
        # The error folded to its last line; the whole traceback inside.
        summary = re.search(r'<summary class="error-line">([^<]*)</summary>', first)
        assert summary and summary[1] == "ConnectionError: card gateway timed out for order 31"
        assert "Traceback (most recent call last):" in first and "app/orders.py" in first
        assert re.search(r'class="worker">[^<:]+:\d+(:\d+)?<', first)
        assert re.search(r'<td class="n">\d+s</td>', first)  # how long it took
        assert "2 remembered, newest first" in page
        client.app.state.dashboard.close()  # type: ignore[attr-defined]


def test_a_live_task_shows_its_times_steps_and_what_it_waits_for(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    sleeper = slotd.enqueue(conn, "life.order", {})
    waiter = slotd.enqueue(conn, "life.order", {})
    steps = '[{"name": "charge", "value": {"charged": 5}, "at": "2026-12-05T10:00:00+00:00"}]'
    # What a durable sleep (sql wait_step) and an event wait leave on a row: the waited
    # step is stored once served, not before.
    conn.execute(
        "UPDATE slotd_tasks SET steps = %s::jsonb, wait_step = 'slotd.sleep:1', "
        "wait_until = now() + interval '2 hours', run_at = now() + interval '2 hours' "
        "WHERE id = %s",
        (steps, sleeper),
    )
    conn.execute(
        "UPDATE slotd_tasks SET wait_step = 'approved:7', wait_event = 'approved:7', "
        "wait_until = NULL, run_at = 'infinity' WHERE id = %s",
        (waiter,),
    )
    with make_client(db_url) as client:
        page = client.get(f"/tasks/{sleeper}").text
        assert '<span class="state state-waiting">waiting</span>' in page
        assert re.search(
            r'id="wake">until [^<]+ UTC <span class="hint">\(in (1h 59m|2h 00m)\)', page
        )
        assert 'id="wait-step">slotd.sleep:1 ' in page
        charge, sleep = rows_of(page, "steps")
        assert 'data-name="charge"' in charge and "2026-12-05 10:00:00 UTC" in charge
        assert '<td class="n">14 B</td>' in charge  # {"charged": 5}
        assert 'data-name="slotd.sleep:1"' in sleep and "(waiting here" in sleep
        assert '<td class="n">2</td>' in sleep
        assert re.search(r'id="enqueued">\d{4}-', page)
        assert 'id="started"><span class="hint">not yet</span>' in page
        page = client.get(f"/tasks/{waiter}").text
        assert 'id="wait-event">approved:7<' in page
        assert "none: it waits until the event is emitted" in page
        assert 'id="due">when its event is emitted<' in page
        assert "after its parents" not in page
        # The listings say what it waits on too (they said "after its parents" of any task
        # with no due time).
        for listing in (client.get("/tasks").text, client.get("/types/life.order").text):
            [row] = [r for r in listing.split("<tr") if f'data-id="{waiter}"' in r]
            assert "when its event is emitted" in row, row
        client.app.state.dashboard.close()  # type: ignore[attr-defined]


def test_ten_thousand_attempts_and_steps_are_shown_a_page_at_a_time(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    task_id = slotd.enqueue(conn, "life.order", {}, max_attempts=20_000)
    conn.execute(
        "INSERT INTO slotd_attempts (task_id, task_type, number, outcome, error, started_at, "
        "ended_at, host, pid, slot) "
        "SELECT %s, 'life.order', g, 'failure', 'ValueError: try ' || g, "
        "now() - interval '1 second', now(), 'h', 1, 0 FROM generate_series(1, 10000) g",
        (task_id,),
    )
    conn.execute(
        "UPDATE slotd_tasks SET attempt_count = 10000, run_at = now() + interval '1 hour', "
        "steps = (SELECT jsonb_agg(jsonb_build_object('name', 's' || g, 'value', g, "
        "'at', now()) ORDER BY g) FROM generate_series(1, 10000) g) WHERE id = %s",
        (task_id,),
    )
    with make_client(db_url) as client:
        page = client.get(f"/tasks/{task_id}").text
        shown = rows_of(page, "attempts")
        assert len(shown) == pages.ATTEMPTS
        numbers = [int(re.search(r'data-number="(\d+)"', r)[1]) for r in shown]  # type: ignore[index]
        assert numbers == list(range(10_000, 10_000 - pages.ATTEMPTS, -1))
        assert "10000+ remembered, newest first, 20 a page" in page
        older = re.search(r'href="([^"]*attempts_before=\d+)" id="attempts-older"', page)
        assert older
        page2 = client.get(older[1].replace("http://127.0.0.1", "")).text
        numbers = [int(re.search(r'data-number="(\d+)"', r)[1]) for r in rows_of(page2, "attempts")]  # type: ignore[index]
        assert numbers == list(range(9_980, 9_980 - pages.ATTEMPTS, -1))
        steps = rows_of(page, "steps")
        assert len(steps) == pages.STEPS and 'data-name="s1"' in steps[0]
        assert "10000 stored, in the order they ran; 1–50 shown" in page
        page3 = client.get(f"/tasks/{task_id}?steps_from=9990").text
        names = re.findall(r'<tr data-name="(s\d+)">', page3)
        assert names == [f"s{n}" for n in range(9991, 10001)]
        assert 'id="steps-next"' not in page3 and 'id="steps-first"' in page3
        for bad in ("attempts_before=x", "attempts_before=0", "steps_from=-1"):
            assert client.get(f"/tasks/{task_id}?{bad}").status_code == 400
        client.app.state.dashboard.close()  # type: ignore[attr-defined]


def test_a_tasks_attempts_are_read_by_their_index(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO slotd_attempts (task_id, task_type, number, outcome) "
        "SELECT g % 500, 't', g, 'failure' FROM generate_series(1, 20000) g"
    )
    conn.execute("VACUUM (ANALYZE) slotd_attempts")
    sql = statements()["dash_attempts"]
    params = {"id": 7, "before": None, "limit": 20, "error_chars": 100}
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, params).fetchall())
    assert "Seq Scan" not in plan and "Sort" not in plan, plan


def test_a_sequence_member_waits_its_turn(conn: psycopg.Connection[Any], db_url: str) -> None:
    head = slotd.enqueue(conn, "life.order", {}, sequence="customer:7")
    follower = slotd.enqueue(conn, "life.order", {}, sequence="customer:7")
    with make_client(db_url) as client:
        page = client.get(f"/tasks/{follower}").text
        assert '<span class="state state-waiting">waiting</span>' in page
        assert re.search(r'id="sequence">customer:7 <span class="hint">\(place \d+\)', page)
        assert 'id="wake">in sequence customer:7 <span class="hint">(due when' in page
        assert 'id="due">when its turn in its sequence comes<' in page
        assert "after its parents" not in page
        assert 'id="wake"' not in client.get(f"/tasks/{head}").text  # the head is due
        listing = client.get("/tasks").text
        [row] = [r for r in listing.split("<tr") if f'data-id="{follower}"' in r]
        assert "when its turn in its sequence comes" in row, row
        client.app.state.dashboard.close()  # type: ignore[attr-defined]
