"""The lapse sweep (slotd/lifecycle/, "lapsed"): a final attempt whose lease lapsed with its
whole replica gone is given the end its settlement would have written: a dead letter with
reason 'exhausted', its dependants cancelled, its batch counted (and called back). Through a
real `slotd run` whose process group is killed with kill -9, and on the repository for the
edges (a cancelled attempt, a live lease, an attempt with attempts left, a late holder)."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd import lifecycle
from slotd.errors import LeaseLost
from slotd.repository import Repository
from slotd.repository.batches import batch_of, batches_in_flight
from tests.daemon import Daemon, wait_for

APP = "tests.apps.flows:registry"


def _registry() -> slotd.Registry:
    reg = slotd.Registry()
    for name in ("fl.member", "fl.report", "fl.child"):
        reg.register(name, lambda task, ctx: None, ceiling=timedelta(seconds=30))
    return reg


def _lapse(conn: psycopg.Connection[Any], *ids: int) -> None:
    """The database's clock cannot be moved; a lease's end can."""
    conn.execute(
        "UPDATE slotd_tasks SET lease_expires_at = now() - interval '1 second' WHERE id = ANY(%s)",
        (list(ids),),
    )


def _row(conn: psycopg.Connection[Any], task_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT lease_token, dead_reason, dead_attempts, last_error FROM slotd_tasks WHERE id = %s",
        (task_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_a_lapsed_final_attempt_becomes_an_exhausted_dead_letter_that_ends_its_workflow(
    conn: psycopg.Connection[Any],
) -> None:
    repo, reg = Repository(conn), _registry()
    with slotd.batch(conn, on_complete=("fl.report", {"order": 3})) as b:
        parent = b.enqueue("fl.member", {}, max_attempts=1)
        sibling = b.enqueue("fl.member", {})
    child = slotd.enqueue(conn, "fl.child", {}, after=[parent])
    grandchild = slotd.enqueue(conn, "fl.child", {}, after=[child])
    claimed = repo.claim([parent], reg)
    assert claimed is not None
    assert lifecycle.lapse(repo) == {}  # a live lease is its holder's
    _lapse(conn, parent)

    assert lifecycle.lapse(repo) == {("fl.member", "exhausted"): 1}
    assert lifecycle.lapse(repo) == {}  # once
    token, reason, attempts, error = _row(conn, parent)
    assert (token, reason, attempts) == (None, "exhausted", 1)
    assert "its final attempt (1) was never settled: its lease lapsed" in error
    got = slotd.result(conn, parent)
    assert got is not None and got.state == "failed" and "lapsed" in (got.error or "")
    # Its dependants, transitively, as a failure's settlement would have.
    for dependant in (child, grandchild):
        r = slotd.result(conn, dependant)
        assert r is not None and r.state == "cancelled"
        assert r.error == f"cancelled: task {parent}, which it waits on, failed"
    # Its batch counted it; the sibling's end is the last, and calls back once.
    assert batches_in_flight(conn)[0].done == 1
    other = repo.claim([sibling], reg)
    assert other is not None
    repo.dequeue_linked(sibling, other.token, None, None)
    (report,) = conn.execute(
        "SELECT payload FROM slotd_tasks WHERE task_type = 'fl.report'"
    ).fetchone() or (None,)
    assert report["batch"] == {
        "id": b.id,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 0,
        "expired": 0,
    }
    state = batch_of(conn, b.id)
    assert state is not None and state.done == state.total == 2
    # The holder, were it still alive past its lease, has lost it: its late write is refused.
    with pytest.raises(LeaseLost):
        repo.dequeue_linked(parent, claimed.token, None, None)


def test_an_attempt_with_attempts_left_is_left_to_the_next_claim(
    conn: psycopg.Connection[Any],
) -> None:
    repo, reg = Repository(conn), _registry()
    task_id = slotd.enqueue(conn, "fl.member", {}, max_attempts=2)
    first = repo.claim([task_id], reg)
    assert first is not None
    _lapse(conn, task_id)
    assert lifecycle.lapse(repo) == {}
    expired = conn.execute(
        "SELECT lease_expires_at, last_attempted_at FROM slotd_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    again = repo.claim([task_id], reg)  # claimable again at once: the seed's rule
    assert again is not None and again.attempt == 2
    # The claim that took the lapsed lease over remembered its attempt, once.
    assert expired is not None and (again.lapsed_at, again.lapsed_started) == tuple(expired)
    remembered = conn.execute(
        "SELECT number, outcome, host, started_at, ended_at, error FROM slotd_attempts"
        " WHERE task_id = %s",
        (task_id,),
    ).fetchall()
    assert [r[:5] for r in remembered] == [(1, "crashed", None, expired[1], expired[0])]
    assert "its lease lapsed" in remembered[0][5]


def test_a_batched_claim_remembers_each_lapsed_attempt_it_takes_over(
    conn: psycopg.Connection[Any],
) -> None:
    repo, reg = Repository(conn), _registry()
    lapsed, fresh = (slotd.enqueue(conn, "fl.member", {}, max_attempts=3) for _ in range(2))
    assert repo.claim([lapsed], reg) is not None
    _lapse(conn, lapsed)
    claims = repo.claim_many([lapsed, fresh], reg, ["a" * 32, "b" * 32])
    assert [(c.id, c.attempt, c.lapsed_at is not None) for c in claims] == [
        (lapsed, 2, True),
        (fresh, 1, False),
    ]
    remembered = conn.execute(
        "SELECT task_id, number, outcome FROM slotd_attempts ORDER BY id"
    ).fetchall()
    assert remembered == [(lapsed, 1, "crashed")]


def test_a_cancelled_attempt_that_lapsed_keeps_its_cancel_and_is_counted_cancelled(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    repo, reg = Repository(conn), _registry()
    with slotd.batch(conn, on_complete=("fl.report", {})) as b:
        task_id = b.enqueue("fl.member", {})
    assert repo.claim([task_id], reg) is not None
    assert slotd.cancel(conn, task_id)
    _lapse(conn, task_id)
    assert lifecycle.lapse(repo) == {("fl.member", "cancelled"): 1}
    token, reason, attempts, error = _row(conn, task_id)
    assert (token, reason, attempts) == (None, "cancelled", 1)
    assert "while attempt 1 was running" in error  # the cancel's own words, kept
    (report,) = conn.execute(
        "SELECT payload FROM slotd_tasks WHERE task_type = 'fl.report'"
    ).fetchone() or (None,)
    assert report["batch"]["cancelled"] == 1 and report["batch"]["failed"] == 0


def test_the_sweep_counts_lapsed_attempts_as_crashed_and_expired_ones_as_expired(
    conn: psycopg.Connection[Any],
) -> None:
    repo, reg = Repository(conn), _registry()
    lapsing = slotd.enqueue(conn, "fl.member", {}, max_attempts=1)
    stale = slotd.enqueue(conn, "fl.child", {}, expires_in=timedelta(hours=1))
    assert repo.claim([lapsing], reg) is not None
    _lapse(conn, lapsing)
    conn.execute(
        "UPDATE slotd_tasks SET expires_at = now() - interval '1s' WHERE id = %s", (stale,)
    )
    swept = lifecycle.sweep(repo)
    assert sorted(swept.outcomes()) == [
        ("fl.child", slotd.Outcome.EXPIRED, 1),
        ("fl.member", slotd.Outcome.CRASHED, 1),
    ]


def test_a_whole_replica_killed_on_a_final_attempt_ends_its_dependants_and_batch(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """kill -9 of a replica's process group (supervisor, slots, runners) while it runs a
    final attempt: no one is left to settle it. Another replica's sweep does once the lease
    lapses (ceiling 2 s + margin 1 s): the dependant is cancelled and the batch's callback
    runs, where before the workflow waited until an operator's `slotd dead retry`."""
    with slotd.batch(qconn, on_complete=("fl.report", {"order": 9})) as b:
        parent = b.enqueue("fl.member", {"ms": 1500}, max_attempts=1)
    child = slotd.enqueue(qconn, "fl.child", {}, after=[parent])
    env = {"SLOTD_LEASE_MARGIN": "1s", "SLOTD_HEARTBEAT_INTERVAL": "1s"}
    victim = Daemon(db_url, slots=1, app=APP, env=env)
    daemons.append(victim)
    victim.start()

    def running() -> bool:
        row = qconn.execute(
            "SELECT lease_token IS NOT NULL FROM slotd_tasks WHERE id = %s", (parent,)
        ).fetchone()
        return bool(row and row[0])

    wait_for(running, timeout=30, what="the victim running the parent's only attempt")
    os.killpg(victim.pid, signal.SIGKILL)
    for proc in victim.tree():
        proc.kill()
    survivor = Daemon(db_url, slots=1, app=APP, env=env)
    daemons.append(survivor)
    survivor.start()
    survivor.wait_line(r"1 fl\.member task\(s\) became dead letters \(exhausted\)", timeout=30)

    def report_ran() -> bool:
        row = qconn.execute(
            "SELECT count(*) FROM slotd_results WHERE task_type = 'fl.report'"
        ).fetchone()
        return bool(row and row[0] >= 1)

    wait_for(report_ran, timeout=30, what="the batch's callback to run")
    got = slotd.result(qconn, parent)
    assert got is not None and got.state == "failed" and "lapsed" in (got.error or "")
    c = slotd.result(qconn, child)
    assert c is not None and c.state == "cancelled"
    (value,) = qconn.execute(
        "SELECT value FROM slotd_results WHERE task_type = 'fl.report'"
    ).fetchone() or (None,)
    assert value["batch"]["failed"] == 1 and value["order"] == 9
    # The child never ran; the callback ran once.
    starts = qconn.execute(
        "SELECT count(*) FILTER (WHERE task_id = %s), count(*) FROM executions", (child,)
    ).fetchone()
    assert starts == (0, 1)
