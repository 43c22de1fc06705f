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
        assert "(pending, not run yet)" in child and 'id="result-state">waiting<' in child
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
        assert "(succeeded)" in done.text and "not run yet" not in done.text
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


def test_a_dead_parent_is_named_so_and_its_cancelled_dependant_is_never_due(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """Issue #44's mislabels: "waits on 106 (not yet)" when 106 is a dead letter, and
    "due - (after its parents)" on a dependant its parent's failure already cancelled."""
    reg = slotd.Registry()
    reg.register("fl.member", lambda task, ctx: None, ceiling=timedelta(seconds=30))
    parent = slotd.enqueue(conn, "fl.member", {}, max_attempts=1)
    child = slotd.enqueue(conn, "fl.child", {}, after=[parent])
    grandchild = slotd.enqueue(conn, "fl.child", {}, after=[child])
    repo = Repository(conn)
    claimed = repo.claim([parent], reg)
    assert claimed is not None
    repo.record_failure(parent, claimed.token, "ValueError: no", linked=True)
    with make_client(db_url) as client:
        page = client.get(f"/tasks/{child}").text
        parents = re.search(r'id="parents">(.*?)</dd>', page, re.S)
        assert parents and "not yet" not in parents.group(1)
        assert "(failed: its dependants are cancelled)" in parents.group(1)
        assert "<dt>parents</dt>" in page and "<dt>waits on</dt>" not in page
        assert "after its parents" not in page and "never: a dead letter" in page
        # The graph: the parent above (linked, failed), this task, the dependant below.
        graph = re.search(r'<svg class="workflow-graph".*?</svg>', page, re.S)
        assert graph, page
        boxes = re.findall(r'<a href="[^"]*/tasks/(\d+)" class="node node-link" '
                           r'data-state="(\w+)"', graph.group(0))  # fmt: skip
        assert boxes == [(str(parent), "failed"), (str(grandchild), "cancelled")], boxes
        assert 'class="node here" data-state="cancelled"' in graph.group(0)
        assert graph.group(0).count('class="edge"') == 2
        client.app.state.dashboard.close()  # type: ignore[attr-defined]


def test_a_batch_is_drawn_with_its_members_by_state_and_its_callback(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    reg = slotd.Registry()
    reg.register("fl.member", lambda task, ctx: None, ceiling=timedelta(seconds=30))
    with slotd.batch(conn, on_complete=("fl.report", {})) as b:
        ids = [b.enqueue("fl.member", {"n": n}, max_attempts=1) for n in range(3)]
    repo = Repository(conn)
    first = repo.claim([ids[0]], reg)
    assert first is not None
    repo.dequeue_linked(ids[0], first.token, None, None)
    second = repo.claim([ids[1]], reg)
    assert second is not None
    repo.record_failure(ids[1], second.token, "ValueError: no", linked=True)
    batch_id = conn.execute("SELECT batch_id FROM slotd_tasks WHERE id = %s", (ids[1],))
    batch_id = batch_id.fetchone()[0]  # type: ignore[index]
    with make_client(db_url) as client:
        member = client.get(f"/tasks/{ids[2]}").text
        assert f'href="/batches/{batch_id}" id="batch-link"' in member
        page = client.get(f"/batches/{batch_id}").text
        assert re.search(r'data-state="succeeded">succeeded 1<', page)
        assert re.search(r'data-state="failed">failed 1<', page)
        assert re.search(r'id="batch-in-flight">1<', page)
        graph = re.search(r'<svg class="workflow-graph".*?</svg>', page, re.S)
        assert graph
        boxes = re.findall(r'/tasks/(\d+)" class="node node-link" data-state="(\w+)"',
                           graph.group(0))  # fmt: skip
        # The succeeded member has no row left (counted above); the callback is not yet.
        assert boxes == [(str(ids[1]), "failed"), (str(ids[2]), "pending")], boxes
        assert "callback, after 1 more" in graph.group(0)
        last = repo.claim([ids[2]], reg)
        assert last is not None
        repo.dequeue_linked(ids[2], last.token, None, None)
        page = client.get(f"/batches/{batch_id}").text
        callback = re.search(r'id="batch-callback">task (\d+)<', page)
        assert callback and "complete" in page
        assert re.search(
            rf'/tasks/{callback.group(1)}" class="node node-link" data-state="pending"', page
        )
        assert client.get("/batches/987654").status_code == 404
        client.app.state.dashboard.close()  # type: ignore[attr-defined]
