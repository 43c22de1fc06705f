"""Stored results through a real `slotd run`: written by the fenced settlement itself (so a
lost lease writes none and a dead slot's success is stored by its supervisor from the slot's
last words), read and awaited by id, pruned after keep_result."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest

import slotd
from slotd.repository import Repository
from slotd.supervisor import maintenance
from tests.apps.flows import GATE
from tests.daemon import ROOT, Daemon, wait_for

APP = "tests.apps.flows:registry"


def _daemon(db_url: str, daemons: list[Daemon], slots: int = 2) -> Daemon:
    daemon = Daemon(db_url, slots=slots, app=APP)
    daemons.append(daemon)
    return daemon.start()


def test_a_kept_result_is_stored_and_awaited_by_notification(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    _daemon(db_url, daemons)
    kept = slotd.enqueue(qconn, "fl.keep", {"n": 21})
    asynced = slotd.enqueue(qconn, "fl.keep_async", {"n": 5})
    nothing = slotd.enqueue(qconn, "fl.none", {})
    got = slotd.wait_result(qconn, kept, timeout=60)
    assert got == slotd.TaskResult("succeeded", {"doubled": 42, "id": kept}, None)
    assert slotd.wait_result(qconn, asynced, timeout=60) == slotd.TaskResult(
        "succeeded", [5, "async"], None
    )
    assert slotd.wait_result(qconn, nothing, timeout=60) == slotd.TaskResult("succeeded")
    assert slotd.result(qconn, kept) == got


def test_a_return_value_that_is_not_json_is_the_handlers_error(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    _daemon(db_url, daemons)
    bad = slotd.enqueue(qconn, "fl.not_json", {})
    failed = slotd.enqueue(qconn, "fl.fails", {"n": 3})
    got = slotd.wait_result(qconn, bad, timeout=60)
    assert got is not None and got.state == "failed" and got.value is None
    assert "not JSON-serializable" in (got.error or "")
    got = slotd.wait_result(qconn, failed, timeout=60)
    assert got is not None and got.state == "failed" and "no luck for 3" in (got.error or "")
    assert qconn.execute("SELECT count(*) FROM slotd_results").fetchone() == (0,)


def test_a_type_without_keep_result_stores_nothing(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    _daemon(db_url, daemons)
    plain = slotd.enqueue(qconn, "fl.plain", {})
    wait_for(lambda: slotd.result(qconn, plain) is None, timeout=60, what="the plain task done")
    assert qconn.execute("SELECT count(*) FROM slotd_results").fetchone() == (0,)


def test_waiting_inside_a_transaction_listens_on_a_connection_of_its_own(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """A notification reaches a session only between transactions: a caller in a
    transaction is waited for on a dedicated connection, and its transaction is untouched."""
    task_id = slotd.enqueue(qconn, "fl.keep", {"n": 1})
    _daemon(db_url, daemons)
    with psycopg.connect(db_url) as caller:  # not autocommit: a transaction opens
        caller.execute("SELECT 1")
        got = slotd.wait_result(caller, task_id, timeout=60)
        assert got is not None and got.value == {"doubled": 2, "id": task_id}
        status = caller.info.transaction_status
        assert status == psycopg.pq.TransactionStatus.INTRANS


def test_wait_result_times_out_on_a_task_nobody_runs(qconn: psycopg.Connection[Any]) -> None:
    task_id = slotd.enqueue(qconn, "fl.keep", {})
    with pytest.raises(TimeoutError, match="still pending"):
        slotd.wait_result(qconn, task_id, timeout=0.5)
    assert slotd.result(qconn, task_id) == slotd.TaskResult("pending")
    assert slotd.result(qconn, 10**12) is None


def test_wait_result_async_is_woken_by_the_settlement(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "fl.keep", {"n": 4})
    _daemon(db_url, daemons)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            got = await slotd.wait_result_async(aconn, task_id, timeout=60)
            assert got is not None and got.value == {"doubled": 8, "id": task_id}
            assert await slotd.result_async(aconn, task_id) == got

    asyncio.run(main())


def test_a_cancelled_task_answers_from_its_dead_letter(qconn: psycopg.Connection[Any]) -> None:
    task_id = slotd.enqueue(qconn, "fl.keep", {})
    slotd.cancel(qconn, task_id)
    got = slotd.wait_result(qconn, task_id, timeout=5)
    assert got is not None and got.state == "cancelled" and "cancelled by" in (got.error or "")


def _blocked_by(conn: psycopg.Connection[Any], holder: int) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (holder,)
    ).fetchall()
    return [r[0] for r in rows]


def _gated_until_settling(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> tuple[int, int, psycopg.Connection[Any], int]:
    """A fl.gated task whose handler has returned and whose slot is inside its settlement,
    held there by a row lock this test holds: (task id, slot pid, the lock's connection,
    the slot's blocked backend)."""
    qconn.execute("SELECT pg_advisory_lock(%s)", (GATE,))
    _daemon(db_url, daemons, slots=1)
    task_id = slotd.enqueue(qconn, "fl.gated", {"k": "v"})
    row = wait_for(
        lambda: qconn.execute(
            "SELECT note FROM executions WHERE task_id = %s AND phase = 'start'", (task_id,)
        ).fetchone(),
        timeout=60,
        what="the handler started",
    )
    slot_pid = int(row[0])
    locker = psycopg.connect(db_url)
    locker.execute("SELECT 1 FROM slotd_tasks WHERE id = %s FOR UPDATE", (task_id,))
    holder = locker.info.backend_pid
    qconn.execute("SELECT pg_advisory_unlock(%s)", (GATE,))  # the handler returns now
    blocked = wait_for(lambda: _blocked_by(qconn, holder), timeout=60, what="the settlement")
    return task_id, slot_pid, locker, blocked[0]


def test_a_slot_killed_after_the_handler_returned_has_its_result_stored_by_the_supervisor(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """kill -9 of the slot while its settlement waits: its own statement is cut off (its
    backend terminated before it could commit), so the only writer left is the supervisor,
    which settles by the slot's last words: the value is stored, the task never reruns."""
    task_id, slot_pid, locker, backend = _gated_until_settling(qconn, db_url, daemons)
    os.kill(slot_pid, signal.SIGKILL)
    qconn.execute("SELECT pg_terminate_backend(%s)", (backend,))
    wait_for(
        lambda: (
            not qconn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)
            ).fetchone()
        ),
        what="the dead slot's backend gone",
    )
    locker.rollback()
    locker.close()
    got = slotd.wait_result(qconn, task_id, timeout=60)
    assert got == slotd.TaskResult("succeeded", {"answer": 42, "payload": {"k": "v"}}, None)
    starts = qconn.execute(
        "SELECT count(*) FROM executions WHERE task_id = %s AND phase = 'start'", (task_id,)
    ).fetchone()
    assert starts == (1,)


def test_a_worker_that_lost_its_lease_writes_no_result(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """The lease changes hands while the settlement waits (as a takeover after a lapse
    would): the fenced statement rechecks the token, deletes nothing and stores nothing."""
    task_id, _, locker, _ = _gated_until_settling(qconn, db_url, daemons)
    locker.execute(
        "UPDATE slotd_tasks SET lease_token = gen_random_uuid() WHERE id = %s", (task_id,)
    )
    locker.commit()
    locker.close()
    daemons[-1].wait_line(rf"fl\.gated#{task_id} attempt 1: lost")
    assert qconn.execute("SELECT count(*) FROM slotd_results").fetchone() == (0,)
    got = slotd.result(qconn, task_id)
    assert got is not None and got.state == "running"


def test_results_are_pruned_by_the_retention_chore_after_keep_result(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    _daemon(db_url, daemons)
    old, fresh = slotd.enqueue_many(qconn, [("fl.keep", {"n": 1}), ("fl.keep", {"n": 2})])
    slotd.wait_result(qconn, old, timeout=60)
    slotd.wait_result(qconn, fresh, timeout=60)
    qconn.execute(
        "UPDATE slotd_results SET expires_at = now() - interval '1 second' WHERE task_id = %s",
        (old,),
    )
    assert slotd.result(qconn, old) is None  # past keep_result: gone at once for readers
    pruned, error = maintenance.prune(Repository(qconn), maintenance.RETENTION_PERIOD)
    assert (pruned, error) == (1, None)
    left = qconn.execute("SELECT task_id FROM slotd_results").fetchall()
    assert left == [(fresh,)]


def test_the_result_command_prints_state_and_value(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    _daemon(db_url, daemons)
    task_id = slotd.enqueue(qconn, "fl.keep", {"n": 3})
    env = {**os.environ, "SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "slotd", "result", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    done = run(str(task_id), "--wait", "60s", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert [a["outcome"] for a in body.pop("attempts")] == ["success"]  # #37
    assert body == {
        "id": task_id,
        "state": "succeeded",
        "value": {"doubled": 6, "id": task_id},
        "error": None,
    }
    text = run(str(task_id))
    assert text.returncode == 0 and text.stdout.splitlines()[0] == f"task {task_id}: succeeded"
    missing = run("999999999")
    assert missing.returncode == 1 and "no task 999999999" in missing.stderr
    bad = run(str(task_id), "--wait", "soon")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
