"""`async def` handlers through a real `slotd run`: awaited on the runner's one event loop,
cancelled at their deadline and at shutdown, killed when they block the loop."""

from __future__ import annotations

import signal
import time
from typing import Any

import psutil
import psycopg
import pytest

import slotd
from tests.daemon import Daemon, gone, wait_for
from tests.test_runtime import settled, start, starts, task_row

RETRY_FAST = {"SLOTD_BACKOFF_BASE": "10ms", "SLOTD_BACKOFF_CAP": "20ms"}


def phases(conn: psycopg.Connection[Any], task_id: int, phase: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT attempt, pid, note, at FROM executions WHERE task_id = %s AND phase = %s"
        " ORDER BY at",
        (task_id, phase),
    ).fetchall()


def test_async_handlers_run_on_one_loop_kept_for_the_runners_life(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    start(daemons, db_url, slots=1)
    ids = [slotd.enqueue(qconn, "rt.async_noop", {"n": n}) for n in range(3)]
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
        what="the async tasks to finish",
    )
    # Each ran to its end (not settled as a success without ever running)...
    assert [len(phases(qconn, i, "end")) for i in ids] == [1, 1, 1]
    # ...in one runner, on one loop.
    loops = {(pid, note) for i in ids for _, pid, note, _ in phases(qconn, i, "start")}
    assert len(loops) == 1


@pytest.mark.parametrize("task_type", ["rt.async_sleep", "rt.async_block"])
def test_async_handler_is_cancelled_at_its_deadline_or_killed_when_it_blocks(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], task_type: str
) -> None:
    daemon = start(daemons, db_url, slots=1, env=RETRY_FAST)
    task_id = slotd.enqueue(qconn, task_type, max_attempts=2)
    daemon.wait_line(rf"{task_type}#{task_id} attempt 1: timeout")
    runs = wait_for(lambda: (r := starts(qconn, task_id)) and len(r) == 2 and r, what="a retry")
    (_, first_pid, _, _), (_, _, _, second_at) = runs
    row = wait_for(lambda: settled(qconn, task_id), what="the retry's settlement")
    assert row["attempt_count"] == 2
    if task_type == "rt.async_sleep":
        # The await raised CancelledError in the handler, with ctx.cancelled true, and the
        # call ended as DeadlineExceeded; the runner and its loop live on.
        (_, _, saw_cancelled, cancelled_at), *_ = phases(qconn, task_id, "cancelled")
        assert saw_cancelled == "True"
        assert "interrupted at the deadline" in row["last_error"]
        assert "CancelledError" in row["last_error"]  # the await it was stuck in
        assert cancelled_at < second_at  # no overlap with its retry
        assert "slotd: runner 0" in " ".join(psutil.Process(first_pid).cmdline())
    else:
        # Stuck in a blocking call, the loop never yields: the kill grace ends the runner.
        assert "killed" in row["last_error"]
        assert gone(first_pid)
    follow = slotd.enqueue(qconn, "rt.async_noop")
    wait_for(lambda: task_row(qconn, follow) is None, what="the slot to serve again")


def test_sigterm_cancels_an_async_handler_and_releases_its_lease(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1, env={"SLOTD_SHUTDOWN_GRACE": "30s"})
    task_id = slotd.enqueue(qconn, "rt.async_polite")
    wait_for(lambda: starts(qconn, task_id), what="the handler to start")
    began = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(60) == 0
    # Cancelled at its await, not killed at the end of the 30 s grace.
    assert time.monotonic() - began < 30
    assert [note for _, _, note, _ in phases(qconn, task_id, "end")] == ["cancelled True"]
    row = task_row(qconn, task_id)
    assert row is not None and row["lease_token"] is None and row["attempt_count"] == 1
    daemon.wait_line(rf"rt.async_polite#{task_id} attempt 1: cancelled")


def test_sync_handler_returning_a_coroutine_is_an_error_not_a_success(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1)
    task_id = slotd.enqueue(qconn, "rt.returns_coroutine")
    row = wait_for(lambda: settled(qconn, task_id), what="the failure")
    assert "handler returned a coroutine: declare it async def" in row["last_error"]
    daemon.wait_line(rf"rt.returns_coroutine#{task_id} attempt 1: failure")
    assert not any("never awaited" in line for line in daemon.lines)
