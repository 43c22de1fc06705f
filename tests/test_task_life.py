"""A task's life (#37): the seven defects a review of 8a69dc5 reproduced against a real
`slotd run`, where the end of a task was not one transition guarded at the row. Each test
drives real daemons (tests/daemon.py) and the operator's commands in their own processes;
freezing a replica is SIGSTOP of every process it made, which is what a stalled host (a VM
paused, a process stopped by a debugger) looks like to the fleet."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.repository.batches import batch_of
from tests.apps.life import GATE
from tests.daemon import Daemon, wait_for
from tests.test_control_runtime import cli

APP = "tests.apps.life:registry"
# A lease is ceiling (2 s for lc.member) + 1 s; the lapse sweep runs each heartbeat.
ENV = {"SLOTD_LEASE_MARGIN": "1s", "SLOTD_HEARTBEAT_INTERVAL": "1s"}


def _daemon(db_url: str, daemons: list[Daemon], slots: int = 2, **env: str) -> Daemon:
    daemon = Daemon(db_url, slots=slots, app=APP, env={**ENV, **env})
    daemons.append(daemon)
    return daemon.start()


def _freeze(daemon: Daemon) -> None:
    """SIGSTOP the supervisor, its slots and their runners (own process groups)."""
    for proc in [*daemon.tree(), None]:
        os.kill(daemon.pid if proc is None else proc.pid, signal.SIGSTOP)


def _leased(conn: psycopg.Connection[Any], *ids: int) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM slotd_tasks WHERE id = ANY(%s) AND lease_token IS NOT NULL",
        (list(ids),),
    ).fetchone()
    return bool(row and row[0] == len(ids))


def _lapsed(conn: psycopg.Connection[Any], *ids: int) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM slotd_tasks WHERE id = ANY(%s) AND lease_expires_at < now()",
        (list(ids),),
    ).fetchone()
    return bool(row and row[0] == len(ids))


def _starts(conn: psycopg.Connection[Any], task_id: int, phase: str = "start") -> int:
    row = conn.execute(
        "SELECT count(*) FROM executions WHERE task_id = %s AND phase = %s", (task_id, phase)
    ).fetchone()
    return int(row[0]) if row else 0


def _callback(conn: psycopg.Connection[Any], batch_id: int) -> dict[str, Any] | None:
    """The batch's callback's payload once it ran (lc.record keeps its payload)."""
    row = conn.execute(
        "SELECT r.value FROM slotd_batches b JOIN slotd_results r ON r.task_id = b.callback_id "
        "WHERE b.id = %s",
        (batch_id,),
    ).fetchone()
    return None if row is None else dict(row[0])


def _completed(conn: psycopg.Connection[Any], batch_id: int) -> bool:
    row = conn.execute(
        "SELECT completed_at IS NOT NULL FROM slotd_batches WHERE id = %s", (batch_id,)
    ).fetchone()
    return bool(row and row[0])


def _ok(done: Any) -> Any:
    assert done.returncode == 0, done.stderr
    return done


# 1 -------------------------------------------------------------------------------------


def test_a_frozen_members_cancel_after_its_lease_lapsed_is_counted_once(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """A member whose replica froze past its lease, cancelled by an operator: the cancel
    ends it (a lease that is not live is no lease), and the lapse sweep that passes later
    finds nothing of it to end again. Before, the sweep counted it a second time and the
    batch called back while another member still waited."""
    with slotd.batch(qconn, on_complete=("lc.record", {"order": 1})) as b:
        frozen = b.enqueue("lc.member", {"ms": 60_000})
        waiting = b.enqueue("lc.member", {}, delay=timedelta(hours=1))
    # Not of the batch: a final attempt lapsing beside it, whose end proves a sweep passed.
    marker = slotd.enqueue(qconn, "lc.member", {"ms": 60_000}, max_attempts=1)
    victim = _daemon(db_url, daemons)
    wait_for(lambda: _leased(qconn, frozen, marker), what="both attempts running")
    _freeze(victim)
    wait_for(lambda: _lapsed(qconn, frozen, marker), what="their leases to lapse")
    _ok(cli(db_url, "cancel", "--id", str(frozen)))

    survivor = _daemon(db_url, daemons)
    survivor.wait_line(r"1 lc\.member task\(s\) became dead letters \(exhausted\)")
    state = batch_of(qconn, b.id)
    assert state is not None and (state.done, state.total) == (1, 2)
    assert not _completed(qconn, b.id)  # `waiting` has not ended: no callback yet
    assert not any("(cancelled)" in line for line in survivor.lines)

    assert slotd.cancel(qconn, waiting)
    payload = wait_for(lambda: _callback(qconn, b.id), what="the batch's callback")
    assert payload["batch"] == {
        "id": b.id,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 2,
        "expired": 0,
    }
    done = batch_of(qconn, b.id)
    assert done is not None and done.done == done.total == 2


# 2 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("unique", ["live", "pending"])
def test_an_enqueue_never_folds_into_an_expired_task_the_sweep_has_not_reached(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], unique: str
) -> None:
    """With no replica running, nothing sweeps: an expired task holding the key must not
    swallow the new request. The enqueue ends it (expired) and inserts its own row."""
    old = slotd.enqueue(
        qconn, "lc.record", {"n": 1}, key="k", unique=unique, expires_in=timedelta(hours=1)
    )
    qconn.execute("UPDATE slotd_tasks SET expires_at = now() - interval '1s' WHERE id = %s", (old,))
    new = slotd.enqueue(qconn, "lc.record", {"n": 2}, key="k", unique=unique)
    assert new != old
    gone = slotd.result(qconn, old)
    assert gone is not None and gone.state == "expired"
    _daemon(db_url, daemons)
    got = slotd.wait_result(qconn, new, timeout=30)
    assert got.state == "succeeded" and got.value == {"n": 2}
    assert _starts(qconn, old) == 0
    # And a third enqueue of the key, the new one done, makes a fresh task again.
    third = slotd.enqueue(qconn, "lc.record", {"n": 3}, key="k", unique=unique)
    assert third not in (old, new)
    assert slotd.wait_result(qconn, third, timeout=30).value == {"n": 3}


# 3 -------------------------------------------------------------------------------------


def test_a_slice_cancelled_after_its_advance_and_continued_unheard_ends_its_batch(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """The slot settles `continue` without having heard of the cancel (its supervisor
    stopped, so the cancel's notification never reached it): the continue must not clear
    the lease of a task the cancel ended, or the batch waits for ever. It is settled as the
    cancel's end instead: counted, the callback run."""
    gate = psycopg.connect(db_url, autocommit=True)
    try:
        gate.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        with slotd.batch(qconn, on_complete=("lc.record", {"order": 3})) as b:
            task_id = b.enqueue("lc.slice", {"cursor": 0})
        daemon = _daemon(db_url, daemons, slots=1)
        wait_for(lambda: _starts(qconn, task_id, "advanced") == 1, what="the first advance")
        os.kill(daemon.pid, signal.SIGSTOP)  # the supervisor only: its slot runs on
        try:
            assert slotd.cancel(qconn, task_id)
            gate.execute("SELECT pg_advisory_unlock(%s)", (GATE,))

            def settled() -> bool:
                row = qconn.execute(
                    "SELECT lease_token IS NULL FROM slotd_tasks WHERE id = %s", (task_id,)
                ).fetchone()
                return bool(row and row[0])

            wait_for(settled, what="the slot's settlement of the slice")
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        payload = wait_for(lambda: _callback(qconn, b.id), what="the batch's callback")
        assert payload["batch"]["cancelled"] == 1
        got = slotd.result(qconn, task_id)
        assert got is not None and got.state == "cancelled"
        assert _starts(qconn, task_id, "advanced") == 1  # never ran again
    finally:
        gate.close()


# 4 -------------------------------------------------------------------------------------


def test_dead_retry_all_revives_a_dependant_cancelled_while_waiting(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """A parent fails; its waiting dependant is cancelled with run_at = 'infinity'.
    `slotd dead retry --all` retries both (it failed whole on the infinite timestamp)."""
    parent = slotd.enqueue(qconn, "lc.fail_once", {})
    child = slotd.enqueue(qconn, "lc.record", {"n": 4}, after=[parent])
    other = slotd.enqueue(qconn, "lc.fail", {})
    daemon = _daemon(db_url, daemons)
    wait_for(lambda: _starts(qconn, other) == 1 and _starts(qconn, parent) == 1, what="failures")
    wait_for(
        lambda: (r := slotd.result(qconn, child)) is not None and r.state == "cancelled",
        what="the dependant's cancel",
    )
    done = _ok(cli(db_url, "dead", "retry", "--all"))
    assert done.stdout.strip() == "retried 3 dead letters"
    got = slotd.wait_result(qconn, child, timeout=30)
    assert got.state == "succeeded" and got.value == {"n": 4}
    assert slotd.wait_result(qconn, parent, timeout=30).state == "succeeded"
    assert daemon.proc is not None and daemon.proc.poll() is None


# 5 -------------------------------------------------------------------------------------


def test_dead_retry_of_two_dead_letters_of_one_pending_key_revives_one_holding_the_key(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """Two unique="pending" runs of one key both dead (each ran, so each gave its key up to
    started_key): a retry revives the newest only, with its key back, and the next enqueue
    of the key dedupes onto it."""
    first = slotd.enqueue(qconn, "lc.fail", {}, key="acct:5", unique="pending")
    daemon = _daemon(db_url, daemons, slots=1)
    wait_for(lambda: _starts(qconn, first) == 1, what="the first run")
    second = slotd.enqueue(qconn, "lc.fail", {}, key="acct:5", unique="pending")
    assert second != first
    wait_for(lambda: _starts(qconn, second) == 1, what="the second run")
    wait_for(
        lambda: all(
            (r := slotd.result(qconn, i)) is not None and r.state == "failed"
            for i in (first, second)
        ),
        what="both dead",
    )
    os.killpg(daemon.pid, signal.SIGKILL)  # nothing runs the retried one meanwhile
    daemon.wait()
    done = _ok(cli(db_url, "dead", "retry", "--type", "lc.fail"))
    assert done.stdout.strip() == "retried 1 dead letter"
    third = slotd.enqueue(qconn, "lc.fail", {}, key="acct:5", unique="pending")
    assert third == second
    row = qconn.execute(
        "SELECT count(*) FROM slotd_tasks WHERE task_type = 'lc.fail' "
        "AND attempt_count < max_attempts"
    ).fetchone()
    assert row is not None and row[0] == 1


# 6 -------------------------------------------------------------------------------------


def test_the_dashboards_bulk_retry_goes_on_past_a_short_batch_and_says_what_is_left(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """Dead letters of a type, one of them locked by another transaction: the dashboard's
    retry of the type retries every other one and reports the one left."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from tests.test_dashboard import csrf_of, make_client

    ids = [slotd.enqueue(qconn, "lc.fail", {"n": n}) for n in range(3)]
    daemon = _daemon(db_url, daemons, slots=1)
    wait_for(
        lambda: all((r := slotd.result(qconn, i)) is not None and r.state == "failed" for i in ids),
        what="three dead letters",
    )
    os.killpg(daemon.pid, signal.SIGKILL)
    daemon.wait()
    holder = psycopg.connect(db_url)
    try:
        holder.execute("SELECT 1 FROM slotd_tasks WHERE id = %s FOR UPDATE", (ids[0],))
        client: TestClient
        with make_client(db_url, actions=True) as client:
            csrf = csrf_of(client.get("/dead").text)
            form = {"csrf": csrf, "scope": "type", "type": "lc.fail", "action": "retry"}
            r = client.post("/dead/action", data={**form, "confirm": "yes"}, follow_redirects=False)
            assert r.status_code == 303, r.text
            assert "n=2" in r.headers["location"] and "left=1" in r.headers["location"]
            client.app.state.dashboard.close()  # type: ignore[attr-defined]
    finally:
        holder.close()


# 7 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["purge", "retry"])
def test_dead_purge_or_retry_of_a_lapsed_final_attempt_ends_it_first(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], verb: str
) -> None:
    """A final attempt cancelled while running, whose replica then froze: its lease lapsed
    and no sweep has passed. `dead purge` / `dead retry` end it first (counted in its batch,
    its dependant cancelled), as the lapse sweep would have, then act on the dead letter."""
    with slotd.batch(qconn, on_complete=("lc.record", {"order": 7})) as b:
        task_id = b.enqueue("lc.member", {"ms": 60_000}, max_attempts=1)
    child = slotd.enqueue(qconn, "lc.record", {"n": 7}, after=[task_id])
    victim = _daemon(db_url, daemons, slots=1)
    wait_for(lambda: _starts(qconn, task_id) == 1, what="the final attempt running")
    _freeze(victim)
    wait_for(lambda: _lapsed(qconn, task_id), what="its lease to lapse")
    if verb == "purge":
        _ok(cli(db_url, "dead", "purge", "--id", str(task_id), "--yes"))
        assert slotd.result(qconn, task_id) is None
    else:
        _ok(cli(db_url, "dead", "retry", "--id", str(task_id)))
    assert _completed(qconn, b.id)
    c = slotd.result(qconn, child)
    assert c is not None and c.state == "cancelled"
    state = batch_of(qconn, b.id)
    assert state is not None and (state.failed, state.done) == (1, 1)
    _daemon(db_url, daemons)  # the callback runs; a retried task runs on its own
    payload = wait_for(lambda: _callback(qconn, b.id), what="the batch's callback")
    assert payload["batch"]["failed"] == 1
    if verb == "retry":
        wait_for(lambda: _starts(qconn, task_id) == 2, what="the retried attempt")
