"""The tasks page's search (#44 item 2) with the real app: by state (slotd's one vocabulary,
live tasks, dead letters and kept successes alike), by tag (sql/040), by id (a succeeded
task kept by keep_history too), by key and type; each search walks a bounded stretch of
the queue and offers to go on from where it stopped."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.repository import statements
from slotd.web import listings
from tests.test_dashboard import dead_letter, make_client
from tests.test_dashboard_life import fail_then_succeed


def ids_shown(page: str) -> list[int]:
    body = (
        page.split('<table id="tasks">', 1)[1].split("</table>", 1)[0] if "<table" in page else ""
    )
    return [int(n) for n in re.findall(r'<tr data-id="(\d+)"', body)]


def states_shown(page: str) -> set[str]:
    return set(re.findall(r'<tr data-id="\d+" data-state="(\w+)"', page))


def test_search_by_state_tag_id_key_and_type(conn: psycopg.Connection[Any], db_url: str) -> None:
    pending = slotd.enqueue(conn, "find.mail", {}, key="order:9", tags=["tenant:7"])
    scheduled = slotd.enqueue(conn, "find.mail", {}, delay=timedelta(hours=1))
    failed = dead_letter(conn, "find.report", tags=["tenant:7"])
    cancelled = slotd.enqueue(conn, "find.report", {})
    assert slotd.cancel(conn, cancelled)
    # life.order, kept by keep_history; its key and tags kept beside it (sql/091)
    succeeded = fail_then_succeed(conn, key="order:31", tags=["tenant:7", "vip"])
    with make_client(db_url) as client:

        def shown(query: str) -> list[int]:
            reply = client.get(f"/tasks?{query}")
            assert reply.status_code == 200, reply.text
            return ids_shown(reply.text)

        assert shown("state=pending") == [pending]
        assert shown("state=scheduled") == [scheduled]
        assert shown("state=failed") == [failed]
        assert shown("state=cancelled") == [cancelled]
        assert shown("state=succeeded") == [succeeded]
        assert shown("state=running") == []
        assert shown("state=pending&type=find.report") == []
        # A tag finds live tasks and dead letters alike, newest first, each with its state.
        page = client.get("/tasks?tag=tenant:7").text
        assert ids_shown(page) == [failed, pending]
        assert states_shown(page) == {"failed", "pending"}
        assert '<span class="tag">tenant:7</span>' in page
        assert shown("tag=tenant:7&state=failed") == [failed]
        assert shown("tag=tenant:8") == []
        # By key and id with a state; an id alone finds a kept success (its row is gone).
        assert shown("state=pending&q=order:9") == [pending]
        assert shown(f"state=failed&q={failed}") == [failed]
        assert shown(f"q={succeeded}") == [succeeded]
        assert "not kept (keep_history)" in client.get(f"/tasks?q={succeeded}").text
        assert shown(f"q={succeeded}&type=find.mail") == []
        # A kept success by its key and its tags, with the state succeeded or by key alone.
        assert shown("state=succeeded&tag=vip") == [succeeded]
        assert shown("state=succeeded&tag=tenant:7") == [succeeded]
        assert shown("state=succeeded&tag=tenant:8") == []
        assert shown("state=succeeded&q=order:31") == [succeeded]
        assert shown("state=succeeded&q=order:32") == []
        assert shown("q=order:31") == [succeeded]
        assert shown("q=order:31&type=find.mail") == []
        # The live listing in due order names slotd's states too.
        assert states_shown(client.get("/tasks").text) == {"pending", "scheduled"}
        bad = client.get("/tasks?state=done")
        assert bad.status_code == 400 and "unknown state" in bad.text
        client.app.state.dashboard.close()  # type: ignore[attr-defined]


def test_a_search_walks_a_bounded_stretch_and_goes_on_from_where_it_stopped(
    conn: psycopg.Connection[Any], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a stretch of 5: the one failed task is older than the 6 newest pending ones, so
    the first page finds nothing and links past where it stopped; that link finds it."""
    monkeypatch.setattr(listings, "SEARCH_SCAN", 5)
    old = dead_letter(conn, "find.report")
    newer = [slotd.enqueue(conn, "find.mail", {"n": n}) for n in range(6)]
    with make_client(db_url) as client:
        page = client.get("/tasks?state=failed").text
        assert ids_shown(page) == []
        further = re.search(
            r'href="([^"]*)" id="next-page">Search further \(tasks older than (\d+)\)', page
        )
        assert further and int(further[2]) == newer[1], page
        page = client.get(further[1].replace("&amp;", "&").replace("http://127.0.0.1", "")).text
        assert ids_shown(page) == [old]
        assert 'id="next-page"' not in page  # the walk reached the oldest task
        client.app.state.dashboard.close()  # type: ignore[attr-defined]


def test_the_search_reads_indexes_never_the_whole_table(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, key, attempt_count, max_attempts, run_at, tags) "
        "SELECT 'type_' || g % 7, 'k' || g, 0, 20, now(), "
        "CASE WHEN g % 1000 = 0 THEN ARRAY['tenant:' || g] END FROM generate_series(1, 20000) g"
    )
    conn.execute("VACUUM (ANALYZE) slotd_tasks")
    base = {
        "task_type": None, "ids": None, "key": None, "key_types": [f"type_{n}" for n in range(7)],
        "state": "retrying", "tag": None, "after_id": None, "limit": 100, "scan": 10_000,
    }  # fmt: skip
    for label, extra in (
        ("state", {}),
        ("state after", {"after_id": 15_000}),
        ("tag", {"tag": "tenant:7000", "state": None}),
        ("key", {"key": "k7", "state": None}),
    ):
        sql = statements()["dash_find"]
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, {**base, **extra}))
        assert "Seq Scan on slotd_tasks" not in plan, (label, plan)


def test_the_kept_successes_search_reads_indexes_never_the_whole_table(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute(
        "INSERT INTO slotd_results (task_id, task_type, value, expires_at, key, tags) "
        "SELECT g, 'type_' || g % 7, NULL, now() + interval '1 day', 'k' || g, "
        "CASE WHEN g % 1000 = 0 THEN ARRAY['tenant:' || g] END FROM generate_series(1, 20000) g"
    )
    conn.execute("VACUUM (ANALYZE) slotd_results")
    base = {"task_type": None, "ids": None, "key": None, "tag": None, "after_id": None}
    for label, extra in (("tag", {"tag": "tenant:7000"}), ("key", {"key": "k7"})):
        params = {**base, **extra, "limit": 100, "scan": 10_000}
        sql = statements()["dash_kept_page"]
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, params))
        assert "Seq Scan on slotd_results" not in plan, (label, plan)
        found = conn.execute(sql, params).fetchall()  # type: ignore[call-overload]
        assert len([r for r in found if not r[-2]]) == 1, (label, found)
