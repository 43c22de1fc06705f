"""The lease lifecycle through a real `slotd run` (slotd/lifecycle's rule book): an
advance keeps the lease until the handler returns, so its return settles the slice; claims
take the queue in its order whichever slot makes them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

import slotd
from tests.daemon import Daemon, wait_for

APP = "tests.apps.lifecycle:registry"


def start(daemons: list[Daemon], db_url: str, **kw: Any) -> Daemon:
    daemon = Daemon(db_url, app=APP, **kw)
    daemons.append(daemon)
    return daemon.start()


def row(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any] | None:
    cur = conn.execute("SELECT * FROM slotd_tasks WHERE id = %s", (task_id,))
    found = cur.fetchone()
    return dict(zip([c.name for c in cur.description], found, strict=True)) if found else None


def test_readme_sliced_handler_finishes_after_its_last_page(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url)
    task_id = slotd.enqueue(qconn, "rebuild", {"cursor": 0})
    wait_for(lambda: row(qconn, task_id) is None, what="the sliced task to finish")
    line = daemon.wait_line(rf"rebuild#{task_id} attempt \d+: success")
    assert "success" in line
    pages = [r[0] for r in qconn.execute("SELECT note FROM executions ORDER BY at").fetchall()]
    assert pages == ["0", "1", "2", "3"]  # each page once: the last one did not start again
    assert not [x for x in daemon.lines if f"rebuild#{task_id}" in x and ": lost" in x]
    continued = [x for x in daemon.lines if f"rebuild#{task_id}" in x and ": continued" in x]
    assert len(continued) == 3


def test_advance_then_raise_is_a_failure_backed_off_from_the_saved_cursor(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url)
    task_id = slotd.enqueue(qconn, "slices.advance_then_raise", {"cursor": 0})
    daemon.wait_line(rf"advance_then_raise#{task_id} attempt 1: failure")
    after = row(qconn, task_id)
    assert after is not None
    assert after["payload"] == {"cursor": 1}  # the advance stands
    assert after["attempt_count"] == 0  # as the advance left it
    assert "RuntimeError: page read failed" in (after["last_error"] or "")
    assert after["lease_token"] is None
    assert after["run_at"] > datetime.now(UTC)  # backed off (SLOTD_BACKOFF_BASE 30s), no storm
    starts = qconn.execute("SELECT count(*) FROM executions WHERE phase = 'start'").fetchone()
    assert starts == (1,)
    assert not [x for x in daemon.lines if ": lost" in x]


def test_work_after_an_advance_never_overlaps_the_next_slice(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # Two replicas of two slots each, polling every second: any of them could take the row
    # while the slice that advanced is still running its remaining work, were it free.
    for _ in range(2):
        start(daemons, db_url)
    task_id = slotd.enqueue(qconn, "slices.work_after_advance", {"cursor": 0, "after_s": 1.5})
    wait_for(lambda: row(qconn, task_id) is None, timeout=60, what="the three slices")
    spans = qconn.execute(
        "SELECT note, phase, at FROM executions WHERE task_id = %s ORDER BY at", (task_id,)
    ).fetchall()
    starts = {note: at for note, phase, at in spans if phase == "start"}
    ends = {note: at for note, phase, at in spans if phase == "end"}
    assert sorted(starts) == ["0", "1", "2"]
    for n in (1, 2):
        assert starts[str(n)] >= ends[str(n - 1)], spans  # slice n began after n-1 ended


def test_slots_claim_in_key_order_without_rotating_where_each_looks(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # Ranked by priority (a point is a second of head start), enqueued in reverse, so the
    # key order is not the id order. Enqueued before the replica starts: every slot's first
    # discovery sees all of them.
    n = 40
    rows = [("lifecycle.ordered", {"rank": rank}, rank) for rank in range(n)]
    ids = {}
    for task_type, payload, rank in reversed(rows):
        ids[rank] = slotd.enqueue(qconn, task_type, payload, priority=n - rank)
    start(daemons, db_url, slots=4)
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
        timeout=60,
        what="the ranked tasks to drain",
    )
    started = [
        int(r[0])
        for r in qconn.execute(
            "SELECT note FROM executions WHERE phase = 'start' ORDER BY at"
        ).fetchall()
    ]
    assert sorted(started) == list(range(n))
    # Four slots claim at once at the start and then take turns: a rank may start at most
    # three places (the other slots' concurrent claims) from its place in the key order.
    # A slot that looked k/4 of the way into the candidates first started rank 10 first.
    late = {rank: place for place, rank in enumerate(started) if abs(place - rank) > 3}
    assert not late, (late, started)
