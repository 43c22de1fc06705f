"""Batches: the callback is enqueued exactly once, by the statement that settled the
batch's last task, with the counts kept on the batch's stripes. Through a real `slotd run`
(two replicas, one killed with kill -9 midway), and on the repository and the test modes
for the edges (empty batch, a rolled-back block, cancels, dependants inside a batch)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.outcome import Outcome
from slotd.repository import Repository
from slotd.repository.batches import batch_of, batches_in_flight
from slotd.testing.manual import ManualQueue
from tests.daemon import Daemon, wait_for
from tests.test_ops_cli import run_cli

APP = "tests.apps.flows:registry"


def _reports(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT payload FROM slotd_tasks WHERE task_type = 'fl.report' ORDER BY id"
    ).fetchall()
    return [r[0] for r in rows]


def _registry() -> slotd.Registry:
    reg = slotd.Registry()
    for name in ("fl.member", "fl.report", "fl.child"):
        reg.register(name, lambda task, ctx: None, ceiling=timedelta(seconds=30))
    return reg


def test_a_batch_of_1000_with_failures_runs_its_callback_once_through_a_kill_9(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """Two replicas drain a batch of 1,000 (one in ten fails every attempt); one replica is
    killed with kill -9 while it holds leases. Its runs lapse and run again on the other
    one; the callback runs once, with every task counted once."""
    failing = set(range(0, 1000, 10))
    with slotd.batch(qconn, on_complete=("fl.report", {"order": 7})) as b:
        ids = b.enqueue_many(
            [("fl.member", {"n": n, "ms": 50, "fail": n in failing}) for n in range(1000)]
        )
    assert len(ids) == 1000
    env = {
        "SLOTD_LEASE_MARGIN": "1s",
        "SLOTD_KILL_GRACE": "200ms",
        "SLOTD_HEARTBEAT_INTERVAL": "1s",
    }
    victim, survivor = (Daemon(db_url, slots=3, app=APP, env=env) for _ in range(2))
    daemons.extend([victim, survivor])
    victim.start()
    survivor.start()

    def victim_holds_leases() -> bool:
        # Its own heartbeat says which leases it holds (within seconds); by then a tenth of
        # the batch has ended, so the kill lands midway.
        row = qconn.execute(
            "SELECT count(*) FROM slotd_replicas WHERE pid = %s AND leases <> '{}'::jsonb",
            (victim.pid,),
        ).fetchone()
        return bool(row and row[0]) and batches_in_flight(qconn)[0].done >= 100

    wait_for(victim_holds_leases, timeout=120, what="the victim holding leases, 100 ended")
    os.killpg(victim.pid, signal.SIGKILL)  # supervisor and slots; runners follow them
    for proc in victim.tree():
        proc.kill()

    def report_ran() -> bool:
        row = qconn.execute(
            "SELECT count(*) FROM executions e JOIN slotd_results r ON r.task_id = e.task_id"
        ).fetchone()
        return bool(row and row[0] >= 1)

    wait_for(report_ran, timeout=240, what="the batch's callback to run")
    (report,) = qconn.execute("SELECT task_id FROM executions").fetchall()
    got = slotd.result(qconn, report[0])
    assert got is not None and got.state == "succeeded"
    assert got.value == {
        "order": 7,
        "batch": {
            "id": b.id,
            "succeeded": 900,
            "failed": 100,
            "cancelled": 0,
            "expired": 0,
        },
    }
    state = batch_of(qconn, b.id)
    assert state is not None and state.total == 1000 and state.done == 1000
    assert state.callback_id == report[0] and state.completed_at is not None
    assert batches_in_flight(qconn) == []
    # Exactly once: one callback task ever made (its id is the batch's), one run of it,
    # and nothing left to run but the dead letters.
    left = qconn.execute(
        "SELECT count(*) FILTER (WHERE attempt_count < max_attempts),"
        " count(*) FILTER (WHERE task_type = 'fl.report') FROM slotd_tasks"
    ).fetchone()
    assert left == (0, 0)
    kept = "SELECT count(*) FROM slotd_results WHERE task_type = 'fl.report'"
    assert qconn.execute(kept).fetchone() == (1,)
    assert qconn.execute("SELECT count(*) FROM executions").fetchone() == (1,)


def test_an_empty_batch_enqueues_its_callback_when_its_block_ends(
    conn: psycopg.Connection[Any],
) -> None:
    with slotd.batch(conn, on_complete=("fl.report", None)) as b:
        assert _reports(conn) == []
    assert _reports(conn) == [
        {"batch": {"id": b.id, "succeeded": 0, "failed": 0, "cancelled": 0, "expired": 0}}
    ]


def test_an_error_in_the_block_rolls_back_the_batch_and_its_tasks(
    conn: psycopg.Connection[Any],
) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        slotd.batch(conn, on_complete=("fl.report", {})) as b,
    ):
        b.enqueue("fl.member", {"n": 1})
        raise RuntimeError("boom")
    assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM slotd_batches").fetchone() == (0,)
    with pytest.raises(RuntimeError, match="is sealed"):
        b.enqueue("fl.member", {})


def test_bad_batch_input_is_one_line_and_writes_nothing(conn: psycopg.Connection[Any]) -> None:
    with (
        pytest.raises(TypeError, match="on_complete= takes a"),
        slotd.batch(conn, on_complete="fl.report"),
    ):  # type: ignore[arg-type]
        pass
    with (
        pytest.raises(ValueError, match="has a 'batch' key"),
        slotd.batch(conn, on_complete=("fl.report", {"batch": 1})),
    ):
        pass
    with (
        pytest.raises(ValueError, match="a batch's tasks take no key="),
        slotd.batch(conn, on_complete=("fl.report", {})) as b,
    ):
        b.enqueue_many([slotd.NewTask("fl.member", {}, key="k")])
    # The same refusal from enqueue (it was Python's "unexpected keyword argument 'key'").
    with (
        pytest.raises(ValueError, match="'fl.member': a batch's tasks take no key="),
        slotd.batch(conn, on_complete=("fl.report", {})) as b,
    ):
        b.enqueue("fl.member", {}, key="k")
    assert conn.execute("SELECT count(*) FROM slotd_batches").fetchone() == (0,)


def test_cancels_count_as_cancelled_and_the_last_cancel_enqueues_the_callback(
    conn: psycopg.Connection[Any],
) -> None:
    """A cancel of a task that is not running ends it in the cancel's statement; its
    dependants inside the batch go with it, each counted once."""
    repo, reg = Repository(conn), _registry()
    with slotd.batch(conn, on_complete=("fl.report", {})) as b:
        a = b.enqueue("fl.member", {"n": 1})
        c = b.enqueue("fl.child", {}, after=[a])
        d = b.enqueue("fl.member", {"n": 2})
    claimed = repo.claim([d], reg)
    assert claimed is not None and claimed.batch_id == b.id and claimed.linked
    repo.dequeue_linked(d, claimed.token, None, None)
    assert _reports(conn) == [] and batches_in_flight(conn)[0].done == 1
    assert slotd.cancel(conn, a, by="tester")
    assert slotd.result(conn, c) is not None
    assert _reports(conn) == [
        {"batch": {"id": b.id, "succeeded": 1, "failed": 0, "cancelled": 2, "expired": 0}}
    ]


def test_a_retried_dead_letter_leaves_its_batch(conn: psycopg.Connection[Any]) -> None:
    repo, reg = Repository(conn), _registry()
    with slotd.batch(conn, on_complete=("fl.report", {})) as b:
        a = b.enqueue("fl.member", {}, max_attempts=1)
    claimed = repo.claim([a], reg)
    assert claimed is not None
    assert repo.record_failure(a, claimed.token, "no", linked=True).dead
    (report,) = _reports(conn)
    assert report["batch"]["failed"] == 1
    assert repo.dead_retry_batch(ids=[a]) == [a]
    claimed = repo.claim([a], reg)
    assert claimed is not None and claimed.batch_id is None  # counted once, already
    repo.dequeue(a, claimed.token)
    assert len(_reports(conn)) == 1


def test_manual_mode_delivers_a_batch_then_its_callback(
    conn: psycopg.Connection[Any],
) -> None:
    reg = _registry()
    with conn.transaction(force_rollback=True):
        queue = ManualQueue(conn, reg)
        with slotd.batch(conn, on_complete=("fl.report", {"x": 1})) as b:
            b.enqueue_many([("fl.member", {"n": n}) for n in range(3)])
        # The members, then the callback their last success enqueued: in one drain.
        assert [s.outcome for s in queue.deliver_all()] == [Outcome.SUCCESS] * 4
        state = batch_of(conn, b.id)
        assert state is not None and state.succeeded == 3 and state.callback_id is not None
        assert [t.type for t in queue.pending()] == []


def test_batch_async_counts_like_the_sync_block(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async def make() -> int:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            async with slotd.batch_async(aconn, on_complete=("fl.report", {})) as b:
                await b.enqueue("fl.member", {"n": 1})
                await b.enqueue_many([("fl.member", {"n": 2})])
            return b.id

    batch_id = asyncio.run(make())
    state = batch_of(conn, batch_id)
    assert state is not None and state.total == 2 and state.done == 0
    repo, reg = Repository(conn), _registry()
    for _ in range(2):
        claimed = repo.claim(repo.discover(reg.types), reg)
        assert claimed is not None
        repo.dequeue_linked(claimed.id, claimed.token, None, None)
    assert [r["batch"]["succeeded"] for r in _reports(conn)] == [2]


def test_status_shows_batches_in_flight_with_done_over_total(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    repo, reg = Repository(conn), _registry()
    with slotd.batch(conn, on_complete=("fl.report", {})) as b:
        b.enqueue_many([("fl.member", {"n": n}) for n in range(3)])
    claimed = repo.claim(repo.discover(reg.types), reg)
    assert claimed is not None
    repo.dequeue_linked(claimed.id, claimed.token, None, None)
    text = run_cli(db_url, "status")
    assert text.exit_code == 0, text.output
    assert "batches in flight: 1" in text.output
    assert re.search(rf"^  {b.id} +fl\.report +1/3 ", text.output, re.M), text.output
    report = json.loads(run_cli(db_url, "status", "--json").output)
    assert [(x["id"], x["done"], x["total"]) for x in report["batches"]] == [(b.id, 1, 3)]


def test_eager_mode_runs_a_batchs_tasks_once_its_block_sealed_it(
    conn: psycopg.Connection[Any],
) -> None:
    from slotd.testing import eager

    reg = _registry()
    with eager(reg, conn) as runner:
        with slotd.batch(conn, on_complete=("fl.report", {})) as b:
            b.enqueue_many([("fl.member", {"n": n}) for n in range(2)])
            assert runner.settlements == []  # held until the block ends
        assert [s.outcome for _, s in runner.settlements] == [Outcome.SUCCESS] * 2
    (report,) = _reports(conn)  # the callback waits for the daemon or manual mode
    assert report["batch"]["succeeded"] == 2


def test_a_batch_and_its_dependants_live_in_the_schema_they_are_given(
    pg_server: Any,
) -> None:
    """schema= (or SLOTD_SCHEMA): the batch, its stripes, the edges and the callback are
    all that schema's; its linked settlements count there."""
    from slotd import repository

    name = f"slotd_batch_schema_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        repository.create_database(admin, name)
    with psycopg.connect(pg_server.url(name), autocommit=True) as conn:
        repository.migrate(conn, schema="jobs")
        with slotd.batch(conn, on_complete=("fl.report", {}), schema="jobs") as b:
            a = b.enqueue("fl.member", {})
            c = b.enqueue("fl.child", {}, after=[a])
        repo, reg = Repository(conn, schema="jobs"), _registry()
        for task_id in (a, c):
            claimed = repo.claim(repo.discover(reg.types), reg)
            assert claimed is not None and claimed.id == task_id and claimed.batch_id == b.id
            repo.dequeue_linked(task_id, claimed.token, '{"ok": 1}', None)
        rows = conn.execute("SELECT task_type, payload FROM jobs.slotd_tasks").fetchall()
        counts = {"id": b.id, "succeeded": 2, "failed": 0, "cancelled": 0, "expired": 0}
        assert rows == [("fl.report", {"batch": counts})]
        assert conn.execute("SELECT to_regclass('public.slotd_batches')").fetchone() == (None,)


def test_a_batch_task_settles_and_claims_the_next_in_one_statement(
    conn: psycopg.Connection[Any],
) -> None:
    """dequeue_linked_claim: a batch's task keeps the plain tasks' one round trip per task
    (its settlement counts it and claims the next), and the last one's enqueues the
    callback without claiming it in the same statement (its snapshot does not see it)."""
    repo, reg = Repository(conn), _registry()
    with slotd.batch(conn, on_complete=("fl.report", {})) as b:
        ids = b.enqueue_many([("fl.member", {"n": n}) for n in range(2)])
    first = repo.claim([ids[0]], reg)
    assert first is not None
    nxt = repo.dequeue_and_claim(first.id, first.token, [ids[1]], reg, linked=(None, None))
    assert nxt is not None and nxt.id == ids[1] and nxt.batch_id == b.id
    assert batches_in_flight(conn)[0].done == 1
    last = repo.dequeue_and_claim(nxt.id, nxt.token, ids, reg, linked=(None, None))
    assert last is None  # nothing left that its snapshot shows claimable
    assert [r["batch"]["succeeded"] for r in _reports(conn)] == [2]


@pytest.mark.parametrize("member", [False, True], ids=["linked", "member"])
def test_a_batch_member_settles_by_either_statement_to_the_same_end(
    conn: psycopg.Connection[Any], member: bool
) -> None:
    """dequeue_member_claim (a member with nothing else linked: the delete and its stripe's
    count only) ends a batch exactly as dequeue_linked_claim does: counted once, the last
    end enqueues the callback once, the claim riding on it taken."""
    repo, reg = Repository(conn), _registry()
    with slotd.batch(conn, on_complete=("fl.report", {})) as b:
        ids = b.enqueue_many([("fl.member", {"n": n}) for n in range(3)])
    held = repo.claim([ids[0]], reg)
    for _ in range(3):
        assert held is not None
        held = repo.dequeue_and_claim(
            held.id, held.token, ids, reg, linked=(None, None), member=member
        )
    assert held is None
    assert [r["batch"]["succeeded"] for r in _reports(conn)] == [3]
    assert batch_of(conn, b.id).done == 3  # type: ignore[union-attr]


def test_a_member_that_gained_a_dependant_since_its_claim_releases_it_all_the_same(
    conn: psycopg.Connection[Any],
) -> None:
    """The lighter statement refuses a row that has dependants now (its claim said none):
    the linked statement settles it, so the dependant is released with the value, and the
    claim that rode on the first statement stands (no second claim)."""
    repo, reg = Repository(conn), _registry()
    with slotd.batch(conn, on_complete=("fl.report", {})) as b:
        member, other = b.enqueue_many([("fl.member", {}), ("fl.member", {})])
    claimed = repo.claim([member], reg)
    assert claimed is not None and not claimed.has_dependants
    child = slotd.enqueue(conn, "fl.child", {}, after=[member])
    nxt = repo.dequeue_and_claim(
        member, claimed.token, [other], reg, linked=('{"v": 1}', None), member=True
    )
    assert nxt is not None and nxt.id == other
    row = conn.execute(
        "SELECT parents_left, run_at <= now() FROM slotd_tasks WHERE id = %s", (child,)
    ).fetchone()
    assert row == (0, True)
    assert batches_in_flight(conn)[0].done == 1
    leased = "SELECT count(*) FROM slotd_tasks WHERE lease_token IS NOT NULL"
    assert conn.execute(leased).fetchone() == (1,)  # only the claim that rode on it
