"""Dependencies through a real `slotd run`: a dependant waits outside the discovery's reach
until its last parent's success makes it due (in the same statement), gets its parents'
values from its claim, and is cancelled, transitively, when a parent ends otherwise."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.producer.control import cancel_matching
from slotd.repository import Repository, UnknownParents
from tests.daemon import Daemon

APP = "tests.apps.flows:registry"


def _daemon(db_url: str, daemons: list[Daemon]) -> Daemon:
    daemon = Daemon(db_url, slots=2, app=APP)
    daemons.append(daemon)
    return daemon.start()


def _started(conn: psycopg.Connection[Any], task_id: int) -> int:
    row = conn.execute(
        "SELECT count(*) FROM executions WHERE task_id = %s AND phase = 'start'", (task_id,)
    ).fetchone()
    return int(row[0]) if row else 0


def test_a_dependant_runs_after_both_parents_with_their_results(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    a = slotd.enqueue(qconn, "fl.parent", {"n": 1})
    b = slotd.enqueue(qconn, "fl.parent", {"n": 2})
    c = slotd.enqueue(qconn, "fl.child", {}, after=[a, b])
    _daemon(db_url, daemons)
    got = slotd.wait_result(qconn, c, timeout=90)
    assert got is not None and got.state == "succeeded"
    assert got.value == {str(a): {"from": a, "n": 1}, str(b): {"from": b, "n": 2}}
    assert [_started(qconn, t) for t in (a, b, c)] == [1, 1, 1]


def test_a_waiting_dependant_is_not_due_and_discovery_never_reads_it(
    qconn: psycopg.Connection[Any],
) -> None:
    a = slotd.enqueue(qconn, "fl.parent", {})
    c = slotd.enqueue(qconn, "fl.child", {}, after=[a])
    assert slotd.result(qconn, c) == slotd.TaskResult("waiting")  # on its parent (#37)
    assert Repository(qconn).discover(["fl.child", "fl.parent"], limit=10) == [a]


def test_a_failed_parent_cancels_its_dependants_transitively(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    bad = slotd.enqueue(qconn, "fl.fails", {"n": 9})
    child = slotd.enqueue(qconn, "fl.child", {}, after=[bad])
    grandchild = slotd.enqueue(qconn, "fl.child", {}, after=[child])
    _daemon(db_url, daemons)
    got = slotd.wait_result(qconn, grandchild, timeout=90)
    assert got is not None and got.state == "cancelled"
    assert got.error == f"cancelled: task {bad}, which it waits on, failed"
    middle = slotd.result(qconn, child)
    assert middle is not None and middle.state == "cancelled" and str(bad) in (middle.error or "")
    assert _started(qconn, child) == 0 and _started(qconn, grandchild) == 0
    # Explicit terminal states (sql/021): the parent ran out of attempts, its dependants
    # stopped because of it, each with the attempts it really ran (none).
    reasons = qconn.execute(
        "SELECT id, dead_reason, dead_attempts FROM slotd_tasks WHERE id = ANY(%s) ORDER BY id",
        ([bad, child, grandchild],),
    ).fetchall()
    assert reasons == [
        (bad, "exhausted", 1),
        (child, "parent_failed", 0),
        (grandchild, "parent_failed", 0),
    ]
    # A dead parent is no parent: refused at enqueue, nothing written.
    with pytest.raises(UnknownParents, match=f"task {bad} is not live"):
        slotd.enqueue(qconn, "fl.child", {}, after=[bad])


def test_a_cancelled_parent_cancels_its_dependants(qconn: psycopg.Connection[Any]) -> None:
    a = slotd.enqueue(qconn, "fl.parent", {})
    c = slotd.enqueue(qconn, "fl.child", {}, after=[a])
    assert slotd.cancel(qconn, a, by="tester")
    got = slotd.result(qconn, c)
    assert got is not None and got.state == "cancelled"
    assert got.error == f"cancelled: task {a}, which it waits on, was cancelled by tester"


def test_enqueued_handles_mix_with_literal_ids_wherever_ids_are_taken(
    qconn: psycopg.Connection[Any],
) -> None:
    """enqueue's handle is an int subclass: a list mixing it with a plain int (after=, an
    operator's cancel of ids) is bound as one int array, not refused by psycopg."""
    a = slotd.enqueue(qconn, "fl.parent", {})
    b = slotd.enqueue(qconn, "fl.parent", {})
    c = slotd.enqueue(qconn, "fl.child", {}, after=[a, int(b)])
    qconn.autocommit = True
    done = cancel_matching(qconn, ids=[a, int(b)], by="tester")
    assert sorted(t.id for t in done) == sorted([a, b])
    got = slotd.result(qconn, c)
    assert got is not None and got.state == "cancelled"


def test_unknown_parents_are_refused_and_nothing_is_enqueued(
    qconn: psycopg.Connection[Any],
) -> None:
    a = slotd.enqueue(qconn, "fl.parent", {})
    before = qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone()
    with pytest.raises(UnknownParents, match="task 999999999 is not live"):
        slotd.enqueue(qconn, "fl.child", {}, after=[a, 999999999])
    assert qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == before
    with pytest.raises(TypeError, match="after= takes task ids"):
        slotd.enqueue(qconn, "fl.child", {}, after=["x"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="after= cannot be combined with key="):
        slotd.enqueue(qconn, "fl.child", {}, after=[a], key="k")
    with pytest.raises(ValueError, match="after= cannot be combined with delay="):
        slotd.enqueue(qconn, "fl.child", {}, after=[a], delay=30)
    assert qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == before


def test_a_release_that_dead_letters_a_parent_cancels_its_dependants(
    qconn: psycopg.Connection[Any],
) -> None:
    """The shutdown path's dead letter (a second release of a final attempt) is a parent's
    end like its last failure: the dependants go with it, in the release's statement."""
    reg = slotd.Registry()
    reg.register("fl.parent", lambda task, ctx: None, ceiling=timedelta(seconds=30))
    repo = Repository(qconn)
    a = slotd.enqueue(qconn, "fl.parent", {}, max_attempts=1)
    c = slotd.enqueue(qconn, "fl.child", {}, after=[a])
    g = slotd.enqueue(qconn, "fl.child", {}, after=[c])
    for dead in (False, True):  # the first release of the final attempt refunds it
        claimed = repo.claim(repo.discover(reg.types), reg)
        assert claimed is not None and claimed.id == a
        assert repo.release(a, claimed.token, "released twice", refund_final=True) is dead
        state = slotd.result(qconn, c)
        assert state is not None and state.state == ("cancelled" if dead else "waiting")
    got = slotd.result(qconn, g)
    assert got is not None and got.state == "cancelled"
    assert got.error == f"cancelled: task {a}, which it waits on, failed"
    reason = qconn.execute("SELECT dead_reason FROM slotd_tasks WHERE id = %s", (g,))
    assert reason.fetchone() == ("parent_failed",)


def test_manual_mode_runs_a_dependant_after_its_parent_with_its_value(
    conn: psycopg.Connection[Any],
) -> None:
    from slotd.testing.manual import ManualQueue

    seen: dict[int, Any] = {}
    reg = slotd.Registry()
    reg.register("fl.parent", lambda task, ctx: {"n": 5}, ceiling=timedelta(seconds=30))
    reg.register(
        "fl.child",
        lambda task, ctx: seen.update(task.parent_results),
        ceiling=timedelta(seconds=30),
    )
    with conn.transaction(force_rollback=True):
        queue = ManualQueue(conn, reg)
        a = slotd.enqueue(conn, "fl.parent", {})
        c = slotd.enqueue(conn, "fl.child", {}, after=[a])
        waiting = {t.id: t.run_at for t in queue.pending()}
        assert waiting[c] is None  # no due time while it waits on its parents
        assert [s.outcome for s in queue.deliver_all()] == [slotd.Outcome.SUCCESS] * 2
        assert seen == {a: {"n": 5}}
