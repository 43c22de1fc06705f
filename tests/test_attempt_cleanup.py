"""After an attempt that timed out, nothing it started survives, while its runner does."""

from __future__ import annotations

from typing import Any

import psutil
import psycopg
import pytest

import slotd
from slotd.repository import cancel_tasks
from tests.daemon import Daemon, gone, wait_for
from tests.test_runtime import settled, task_row


def test_a_timed_out_attempt_leaves_no_subprocess_behind_and_keeps_its_runner(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = Daemon(db_url, slots=1)
    daemons.append(daemon)
    daemon.start()
    task_id = slotd.enqueue(qconn, "rt.popen_wait")
    runner_pid, sleep_pid = wait_for(
        lambda: qconn.execute(
            "SELECT pid, note::int FROM executions WHERE task_id = %s", (task_id,)
        ).fetchone(),
        what="the handler to start its subprocess",
    )
    error = wait_for(
        lambda: qconn.execute(
            "SELECT last_error FROM slotd_tasks WHERE id = %s AND lease_token IS NULL",
            (task_id,),
        ).fetchone(),
        what="the timeout's settlement",
    )[0]
    assert "DeadlineExceeded" in error  # interrupted in its frame, not killed with the runner
    wait_for(lambda: gone(sleep_pid), timeout=10, what="the attempt's `sleep` to be killed")
    assert psutil.Process(runner_pid).status() != psutil.STATUS_ZOMBIE  # the runner stays warm


def phase_rows(conn: psycopg.Connection[Any], task_id: int, phase: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT pid, note, at FROM executions WHERE task_id = %s AND phase = %s ORDER BY at",
        (task_id, phase),
    ).fetchall()


@pytest.mark.parametrize("ended_by", ["deadline", "operator cancel"])
def test_an_async_attempt_that_ends_by_its_deadline_or_a_cancel_leaves_no_task_on_the_loop(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], ended_by: str
) -> None:
    """The ticker an attempt spawned is cancelled and awaited before the attempt is settled:
    it does not tick on during the next handler the runner's loop runs."""
    # The kill grace the cancel and its awaiting fit in on a loaded machine: a kill would
    # end the runner, which the test asserts is kept.
    daemon = Daemon(db_url, slots=1, env={"SLOTD_KILL_GRACE": "2s"})
    daemons.append(daemon)
    daemon.start()
    task_type = "rt.async_ticker" if ended_by == "deadline" else "rt.async_ticker_long"
    ticker = slotd.enqueue(qconn, task_type, max_attempts=1)
    wait_for(lambda: phase_rows(qconn, ticker, "tick"), what="the ticker to tick")
    if ended_by == "operator cancel":
        with qconn.transaction():
            cancel_tasks(qconn, ids=[ticker], by="tester@tests")
    wait_for(
        lambda: qconn.execute(
            "SELECT 1 FROM slotd_tasks WHERE id = %s AND lease_token IS NULL", (ticker,)
        ).fetchone(),
        what="the attempt's settlement",
    )
    cancelled = phase_rows(qconn, ticker, "ticker_cancelled")  # read right at the settlement
    nap = slotd.enqueue(qconn, "rt.async_nap", {"seconds": 0.5})
    wait_for(lambda: task_row(qconn, nap) is None, what="the next async task to finish")
    ((nap_pid, _, began),) = phase_rows(qconn, nap, "start")
    ((_, _, ended),) = phase_rows(qconn, nap, "end")
    during = [at for _, _, at in phase_rows(qconn, ticker, "tick") if began <= at <= ended]
    assert during == []
    assert cancelled  # awaited, not just asked: its own cleanup ran before the settlement
    assert nap_pid == phase_rows(qconn, ticker, "start")[0][0]  # the same runner, kept warm


def test_a_thread_a_timed_out_attempt_started_ends_with_its_runner_before_the_settlement(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """A thread cannot be stopped from outside: the runner it lives in is killed before the
    attempt is settled, so nothing the attempt started writes after it, and a fresh
    runner serves the next task."""
    daemon = Daemon(db_url, slots=1)
    daemons.append(daemon)
    daemon.start()
    task_id = slotd.enqueue(qconn, "rt.thread_ticker", max_attempts=1)
    ((runner_pid, _, _),) = wait_for(lambda: phase_rows(qconn, task_id, "start"))
    wait_for(lambda: phase_rows(qconn, task_id, "tick"), what="the thread to tick")
    row = wait_for(lambda: settled(qconn, task_id), what="the timeout's settlement")
    assert gone(runner_pid)  # already when the settlement became visible
    assert "DeadlineExceeded" in row["last_error"]  # interrupted in its frame, then replaced
    daemon.wait_line(rf"rt\.thread_ticker#{task_id} attempt 1 ended, but threads .* replacing")
    follow = slotd.enqueue(qconn, "rt.noop")
    wait_for(lambda: task_row(qconn, follow) is None, what="a fresh runner to serve")
    ((follow_pid, _, _),) = phase_rows(qconn, follow, "start")
    assert follow_pid != runner_pid


def test_module_level_pools_and_background_tasks_keep_working_across_attempts(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """What a successful attempt starts is left running: the connection pool, thread pool
    and heartbeat task the first attempt made serve every later one, a timed-out attempt of
    another task in between included (its cleanup cancels only what it started)."""
    # The kill grace the cancel and its awaiting fit in on a loaded machine: a kill would
    # end the runner, which the test asserts is kept.
    daemon = Daemon(db_url, slots=1, env={"SLOTD_KILL_GRACE": "2s"})
    daemons.append(daemon)
    daemon.start()
    first = [slotd.enqueue(qconn, "rt.async_pooled", {"n": n}) for n in range(2)]
    wait_for(lambda: all(task_row(qconn, i) is None for i in first), what="two pooled tasks")
    timed_out = slotd.enqueue(qconn, "rt.async_sleep", max_attempts=1)
    wait_for(lambda: settled(qconn, timed_out), what="the timeout's settlement")
    last = slotd.enqueue(qconn, "rt.async_pooled", {"n": 2})
    wait_for(lambda: task_row(qconn, last) is None, what="the pooled task after the timeout")
    rows = [phase_rows(qconn, i, "start") for i in [*first, last]]
    assert all(len(r) == 1 for r in rows)  # each done on its first attempt
    pids = {r[0][0] for r in rows} | {phase_rows(qconn, timed_out, "start")[0][0]}
    notes = {r[0][1] for r in rows}
    assert len(pids) == 1  # one runner throughout
    assert len(notes) == 1  # one pool connection, one worker thread, the heartbeat beating
    assert notes.pop().endswith(" True")


def test_a_deadline_interrupt_after_the_handler_returned_leaves_it_done(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """The handler returned before its deadline; the interrupt lands while the runner is
    still looking at what it returned. The task is done, once: not a timeout run again."""
    daemon = Daemon(db_url, slots=1, env={"SLOTD_KILL_GRACE": "2s"})
    daemons.append(daemon)
    daemon.start()
    task_id = slotd.enqueue(qconn, "rt.slow_return")
    row = wait_for(lambda: settled(qconn, task_id), what="the settlement")
    assert row == {"deleted": True}, row.get("last_error")
    assert phase_rows(qconn, task_id, "interrupted_after_return")[0][1] == "True"  # in the window
    assert len(phase_rows(qconn, task_id, "start")) == 1
    daemon.wait_line(rf"rt\.slow_return#{task_id} attempt 1: success")
