"""Uniqueness by state (#25): unique="live" dedupes against a pending or running task with
the key, unique="pending" only against one not started yet. On a real database with real
claims, two connections racing, and through `slotd run`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

import slotd
from slotd.registry import Registry
from slotd.repository import Repository, cancel_tasks
from tests.daemon import Daemon, wait_for


def registry() -> Registry:
    reg = Registry()
    reg.register("sync", lambda t, c: None, ceiling=__import__("datetime").timedelta(minutes=1))
    return reg


def claim(repo: Repository, reg: Registry) -> Any:
    return repo.claim(repo.discover(["sync"]), reg)


def keys(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT id, key, started_key FROM slotd_tasks ORDER BY id").fetchall()


def test_pending_dedupes_against_a_task_not_started_and_queues_behind_a_running_one(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry()
    first = slotd.enqueue(conn, "sync", {"n": 1}, key="user:7", unique="pending")
    assert slotd.enqueue(conn, "sync", {"n": 2}, key="user:7", unique="pending") == first
    running = claim(repo, reg)
    assert running.id == first and running.task().key == "user:7"  # the handler sees it
    assert keys(conn) == [(first, None, "user:7")]  # out of the dedupe index
    behind = slotd.enqueue(conn, "sync", {"n": 3}, key="user:7", unique="pending")
    assert behind != first
    assert slotd.enqueue(conn, "sync", {"n": 4}, key="user:7", unique="pending") == behind
    # enqueue_many, and a NewTask's own mode winning over the call's.
    ids = slotd.enqueue_many(
        conn,
        [slotd.NewTask("sync", {}, key="user:7", unique="pending"), ("sync", {}, None, "user:8")],
        unique="pending",
    )
    assert ids[0] == behind and ids[1] not in (first, behind)
    # The running one is still found by its key: cancel, the handler's Task.key.
    cancelled = cancel_tasks(conn, by="test", task_type="sync", key="user:7")
    assert sorted(c.id for c in cancelled) == sorted([first, behind])


def test_live_dedupes_against_a_running_task_as_before(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry()
    first = slotd.enqueue(conn, "sync", {}, key="user:7")  # unique="live" is the default
    assert claim(repo, reg).id == first
    assert slotd.enqueue(conn, "sync", {}, key="user:7", unique="live") == first
    assert keys(conn) == [(first, "user:7", None)]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [({"unique": "pending"}, "needs a key"), ({"key": "k", "unique": "any"}, "'live' or")],
)
def test_a_bad_unique_raises_before_anything_is_written(
    conn: psycopg.Connection[Any], kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        slotd.enqueue(conn, "sync", {}, **kwargs)
    assert keys(conn) == []


def test_an_enqueue_that_met_the_pending_row_holds_its_start_until_it_commits(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """The enqueue returned the pending row's id: its caller's writes must be visible to the
    run it is counting on, so no claim starts the row before that transaction commits."""
    reg = registry()
    first = slotd.enqueue(conn, "sync", {}, key="user:7", unique="pending")
    with psycopg.connect(db_url) as producer, psycopg.connect(db_url, autocommit=True) as slot:
        worker = Repository(slot)
        assert slotd.enqueue(producer, "sync", {}, key="user:7", unique="pending") == first
        assert claim(worker, reg) is None  # locked by the open transaction: passed over
        producer.commit()
        assert claim(worker, reg).id == first


def test_an_enqueue_racing_the_claim_of_the_pending_row_queues_its_own(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """The claim took the pending row first (not committed yet): the enqueue waits for it,
    then finds the row started and inserts its own task behind it."""
    reg = registry()
    first = slotd.enqueue(conn, "sync", {}, key="user:7", unique="pending")
    with psycopg.connect(db_url) as slot, psycopg.connect(db_url, autocommit=True) as producer:
        worker = Repository(slot)
        assert claim(worker, reg).id == first  # inside slot's open transaction
        got: list[int] = []
        racer = threading.Thread(
            target=lambda: got.append(
                slotd.enqueue(producer, "sync", {}, key="user:7", unique="pending")
            )
        )
        racer.start()
        wait_for(
            lambda: conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            ).fetchone(),
            what="the enqueue to wait for the claim",
        )
        slot.commit()
        racer.join(30)
    assert len(got) == 1 and got[0] != first
    assert keys(conn) == [(first, None, "user:7"), (got[0], "user:7", None)]


@pytest.mark.parametrize(("unique", "runs"), [("pending", 2), ("live", 1)])
def test_through_slotd_run_pending_queues_behind_a_running_task_and_live_does_not(
    qconn: psycopg.Connection[Any],
    db_url: str,
    daemons: list[Daemon],
    tmp_path: Path,
    unique: str,
    runs: int,
) -> None:
    release = str(tmp_path / "release")
    d = Daemon(db_url, slots=1, app="tests.apps.unique:registry")
    daemons.append(d)
    d.start()

    def sync(n: int) -> int:
        body = {"n": n, "release": release}
        return slotd.enqueue(qconn, "uniq.sync", body, key="user:7", unique=unique)

    first = sync(1)
    wait_for(lambda: qconn.execute("SELECT 1 FROM executions").fetchone(), what="it to start")
    second, third = sync(2), sync(3)  # while the first runs
    assert second == third and (second != first) == (unique == "pending")
    Path(release).touch()
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
        timeout=60,
        what="the queue to drain",
    )
    done = qconn.execute("SELECT note FROM executions WHERE phase = 'end' ORDER BY at").fetchall()
    assert [n for (n,) in done] == ["user:7#1", "user:7#2"][:runs]
