"""Timers on an idle fleet (#41 item 6), through a real `slotd run`: a delayed task and a
backoff start when they are due, not at the next poll tick. The ticker is set to 60 s here,
so a start within seconds of due can only come from the supervisor's timer for the next row
due (slotd.supervisor.wake.Tokens.retry_in, told by the slot's discovery). Start-to-due
lags themselves are measured in tests/bench/timers.py; the bound here only tells the timer
from the poll, with room for a loaded machine."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

import slotd
from tests.daemon import EXECUTIONS, Daemon, wait_for

SLOW_TICKER = {"SLOTD_POLL_INTERVAL": "60s", "SLOTD_BACKOFF_BASE": "2s", "SLOTD_BACKOFF_CAP": "2s"}
WITHIN = timedelta(seconds=3)  # the poll would start it ~60 s late


def idle_daemon(daemons: list[Daemon], db_url: str) -> Daemon:
    daemon = Daemon(db_url, slots=2, env=SLOW_TICKER)
    daemons.append(daemon)
    daemon.start()  # "serving": every slot idle, the first discovery done
    return daemon


def start_of(conn: psycopg.Connection[Any], task_id: int, attempt: int) -> datetime | None:
    row = conn.execute(
        "SELECT at FROM executions WHERE task_id = %s AND attempt = %s AND phase = 'start'",
        (task_id, attempt),
    ).fetchone()
    return row[0] if row else None


def test_a_2s_delay_starts_when_due_on_an_idle_fleet(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    conn.execute(EXECUTIONS)
    idle_daemon(daemons, db_url)
    task_id = slotd.enqueue(conn, "rt.noop", delay=timedelta(seconds=2))
    (due,) = conn.execute("SELECT run_at FROM slotd_tasks WHERE id = %s", (task_id,)).fetchone()  # type: ignore[misc]
    started = wait_for(lambda: start_of(conn, task_id, 1), timeout=20, what="the delayed start")
    assert due <= started < due + WITHIN, (due, started)


def test_a_2s_backoff_starts_when_due_on_an_idle_fleet(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    conn.execute(EXECUTIONS)
    idle_daemon(daemons, db_url)
    task_id = slotd.enqueue(conn, "rt.flaky", {"fail_until": 1})

    def backed_off() -> Any:
        return conn.execute(
            "SELECT run_at FROM slotd_tasks WHERE id = %s AND attempt_count = 1"
            " AND lease_token IS NULL",
            (task_id,),
        ).fetchone()

    (due,) = wait_for(backed_off, timeout=20, what="the first attempt's failure")
    started = wait_for(lambda: start_of(conn, task_id, 2), timeout=20, what="the retry's start")
    assert due <= started < due + WITHIN, (due, started)


def test_a_delay_behind_another_not_yet_due_starts_on_time_too(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """The timer is for the soonest row: after it runs, the slot's next discovery sets the
    next one (here 1.5 s later), with no enqueue or tick between them."""
    conn.execute(EXECUTIONS)
    idle_daemon(daemons, db_url)
    first, second = slotd.enqueue_many(
        conn,
        [
            slotd.NewTask("rt.noop", {"n": 1}, delay=timedelta(seconds=1.5)),
            slotd.NewTask("rt.noop", {"n": 2}, delay=timedelta(seconds=3)),
        ],
    )
    rows = conn.execute(
        "SELECT id, run_at FROM slotd_tasks WHERE id = ANY(%s)", ([first, second],)
    ).fetchall()
    due = dict(rows)
    for task_id in (first, second):
        started = wait_for(lambda t=task_id: start_of(conn, t, 1), timeout=20, what="a start")
        assert due[task_id] <= started < due[task_id] + WITHIN, (task_id, due, started)
