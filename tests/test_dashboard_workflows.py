"""The dashboard's task page with the real app: a task's result, its parents, its
dependants and its batch, while it waits, and once it finished (a kept result)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import psycopg

import slotd
from slotd.repository import Repository
from tests.test_dashboard import make_client


def test_the_task_page_shows_result_parents_dependants_and_batch(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    reg = slotd.Registry()
    for name in ("fl.member", "fl.child"):
        reg.register(name, lambda task, ctx: None, ceiling=timedelta(seconds=30))
    with slotd.batch(conn, on_complete=("fl.report", {})) as b:
        a = b.enqueue("fl.member", {"n": 1})
        c = b.enqueue("fl.child", {}, after=[a])
    with make_client(db_url) as client:
        parent = client.get(f"/tasks/{a}").text
        assert re.search(rf'id="dependants"><a href="[^"]*/tasks/{c}">{c}</a>', parent)
        assert re.search(r'id="batch-done">0/2<', parent)
        child = client.get(f"/tasks/{c}").text
        assert re.search(rf'id="parents"><a href="[^"]*/tasks/{a}">{a}</a> ', child)
        assert "(not yet)" in child and 'id="result-state">pending<' in child
        repo = Repository(conn)
        for task_id, value in ((a, '{"size": 3}'), (c, '{"published": true}')):
            claimed = repo.claim([task_id], reg)
            assert claimed is not None
            repo.dequeue_linked(task_id, claimed.token, value, 3600.0)
        # Finished: the row is gone, the page shows what it left.
        done = client.get(f"/tasks/{c}")
        assert done.status_code == 200
        assert 'id="result-state">succeeded<' in done.text
        assert "&#34;published&#34;: true" in done.text or '"published": true' in done.text
        assert "(succeeded)" in done.text
        assert client.get("/tasks/999999").status_code == 404
        client.app.state.dashboard.close()  # type: ignore[attr-defined]


def test_a_waiting_dependant_is_listed_last_with_no_due_time(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    a = slotd.enqueue(conn, "fl.member", {})
    c = slotd.enqueue(conn, "fl.child", {}, after=[a])
    with make_client(db_url) as client:
        page = client.get("/tasks").text
        assert page.index(f'/tasks/{a}"') < page.index(f'/tasks/{c}"')
        assert "after its parents" in page
        client.app.state.dashboard.close()  # type: ignore[attr-defined]
