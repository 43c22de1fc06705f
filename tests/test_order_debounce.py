"""Debounce (#39): enqueue(..., key=K, debounce=td) makes one run, td after the key's last
enqueue, with the last payload; every enqueue of a burst returns the same id; an enqueue
while it runs queues one more. At the statement level and through real `slotd run`."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from tests.daemon import Daemon, wait_for
from tests.order_fleet import two_replicas

APP = "tests.apps.order:registry"


def _task(conn: psycopg.Connection[Any], task_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT payload, extract(epoch FROM run_at - now()), extract(epoch FROM run_at -"
        " created_at) FROM slotd_tasks WHERE id = %s",
        (task_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_a_burst_is_one_task_with_the_last_payload_due_td_after_the_last_enqueue(
    conn: psycopg.Connection[Any],
) -> None:
    first = slotd.enqueue(conn, "ord.step", {"n": 0}, key="doc:7", debounce=timedelta(seconds=30))
    assert first.created
    for n in range(1, 5):
        again = slotd.enqueue(conn, "ord.step", {"n": n}, key="doc:7", debounce=30)
        assert again == first and not again.created
    payload, due_in, _ = _task(conn, first)
    assert payload == {"n": 4} and 29 < due_in <= 30
    assert slotd.result(conn, first).state == "scheduled"  # type: ignore[union-attr]
    kept = slotd.enqueue(conn, "ord.step", {"n": 9}, key="doc:8", debounce=30)
    slotd.enqueue(conn, "ord.step", {"n": 10}, key="doc:8", debounce=30, debounce_keep="first")
    assert _task(conn, kept)[0] == {"n": 9}


def test_debounce_max_caps_how_long_a_stream_of_enqueues_postpones_the_run(
    conn: psycopg.Connection[Any],
) -> None:
    tid = slotd.enqueue(conn, "ord.step", {}, key="k", debounce=10, debounce_max=12)
    conn.execute(
        "UPDATE slotd_tasks SET created_at = created_at - interval '5s' WHERE id = %s", (tid,)
    )
    slotd.enqueue(conn, "ord.step", {}, key="k", debounce=10, debounce_max=12)
    _, due_in, since_first = _task(conn, tid)
    assert 6 < due_in <= 7.1 and since_first == pytest.approx(12)  # not 10 s from now


def test_two_producers_of_one_burst_make_one_task(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    # The first producer holds its transaction open after its enqueue; the second waits for
    # it on the key's lock, then pushes the same task (pg-boss #414 made two).
    got: list[int] = []
    with psycopg.connect(db_url) as a:
        first = slotd.enqueue(a, "ord.step", {"by": "a"}, key="race", debounce=30)

        def second() -> None:
            with psycopg.connect(db_url) as b:
                got.append(slotd.enqueue(b, "ord.step", {"by": "b"}, key="race", debounce=30))
                b.commit()

        thread = threading.Thread(target=second)
        thread.start()
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()[0]
                == 1
            ),
            what="the second producer to wait",
        )  # type: ignore[index]
        a.commit()
        thread.join()
    assert got == [first]
    assert _task(conn, first)[0] == {"by": "b"}


def test_debounce_refuses_what_it_cannot_be(conn: psycopg.Connection[Any]) -> None:
    for kwargs, match in (
        ({"debounce": 5}, "needs a key"),
        ({"debounce": 5, "key": "k", "debounce_max": 1}, "shorter"),
        ({"debounce": 5, "key": "k", "delay": 3}, "delay"),
        ({"debounce": 5, "key": "k", "sequence": "s"}, "sequence"),
        ({"debounce": 5, "key": "k", "debounce_keep": "middle"}, "debounce_keep"),
        ({"key": "k", "debounce_max": 5}, "need debounce"),
        ({"debounce": -1, "key": "k"}, "positive"),
    ):
        with pytest.raises(ValueError, match=match):
            slotd.enqueue(conn, "ord.step", {}, **kwargs)
    row = conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()
    assert row is not None and row[0] == 0


def test_a_debounced_burst_of_five_runs_once_td_after_the_last_enqueue(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    two_replicas(conn, db_url, daemons)
    ids = []
    for n in range(5):
        if n:
            conn.execute("SELECT pg_sleep(0.3)")
        ids.append(
            slotd.enqueue(
                conn, "ord.step", {"n": n, "sleep": 1.5}, key="doc:1", debounce=timedelta(seconds=1)
            )
        )
        last = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert len(set(ids)) == 1
    wait_for(
        lambda: conn.execute("SELECT count(*) FROM order_runs").fetchone()[0] == 1,  # type: ignore[index]
        what="the run",
    )
    started, payload, task_id = conn.execute(
        "SELECT started_at, payload, task_id FROM order_runs"
    ).fetchone()  # type: ignore[misc]
    assert task_id == ids[0] and payload["n"] == 4
    # Due 1 s after the last enqueue (the database's clock): never earlier; the upper bound
    # only says it was not left to a poll much later.
    assert 0.95 <= (started - last).total_seconds() < 4
    # An enqueue while it runs queues one more, which runs after it.
    more = slotd.enqueue(conn, "ord.step", {"n": 5}, key="doc:1", debounce=0.1)
    assert more != ids[0] and more.created
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM order_runs WHERE ended_at IS NOT NULL").fetchone()[0]
            == 2
        ),
        what="the second run",
    )  # type: ignore[index]
