"""Durable sleeps and events (#38) through a real `slotd run`: a sleeping task frees its only
slot for other work and resumes on time without spending an attempt; an event emitted
before or after the wait is seen, a rolled-back emit wakes nobody, a timeout returns None."""

from __future__ import annotations

import signal
from typing import Any

import psycopg

import slotd
from tests.daemon import Daemon, wait_for
from tests.test_control_runtime import cli

APP = "tests.apps.durable:registry"


def _daemon(db_url: str, daemons: list[Daemon], slots: int = 1) -> Daemon:
    daemon = Daemon(db_url, slots=slots, app=APP)
    daemons.append(daemon)
    return daemon.start()


def _at(conn: psycopg.Connection[Any], task_id: int, phase: str) -> list[Any]:
    rows = conn.execute(
        "SELECT at, note FROM executions WHERE task_id = %s AND phase = %s ORDER BY at",
        (task_id, phase),
    ).fetchall()
    return [tuple(r) for r in rows]


def _state(conn: psycopg.Connection[Any], task_id: int) -> str:
    return slotd.result(conn, task_id).state


def test_a_sleeping_task_frees_its_slot_and_resumes_on_time(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    sleeper = slotd.enqueue(qconn, "dur.sleeper", {"s": 3})
    daemon = _daemon(db_url, daemons, slots=1)
    wait_for(lambda: _at(qconn, sleeper, "start"), what="the sleeper's first run")
    wait_for(lambda: _state(qconn, sleeper) == "waiting", what="the sleeper waiting")
    other = slotd.enqueue(qconn, "dur.snoozer", {"snoozes": 0})
    # The one slot runs other work while the sleeper sleeps.
    wait_for(lambda: _at(qconn, other, "done"), what="other work on the only slot")
    assert not _at(qconn, sleeper, "done")
    ((done_at, _),) = wait_for(lambda: _at(qconn, sleeper, "done"), what="the wake")
    (first_at, _), second = _at(qconn, sleeper, "start")
    slept = (done_at - first_at).total_seconds()
    assert 3 <= slept < 3 + 5, slept  # on time: within a poll interval or so of its wake
    # max_attempts=1 and it ran twice: the sleep spent no attempt; its step ran once.
    assert len(_at(qconn, sleeper, "side:before")) == 1
    daemon.wait_line(rf"dur\.sleeper#{sleeper} attempt 1: suspended")
    daemon.wait_line(rf"dur\.sleeper#{sleeper} attempt 1: success")


def test_an_event_emitted_before_and_after_the_wait_a_rollback_and_a_timeout(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    slotd.emit(qconn, "approved:1", {"by": "ann"})  # before the wait began (autocommit)
    early = slotd.enqueue(qconn, "dur.approval", {"event": "approved:1"})
    late = slotd.enqueue(qconn, "dur.approval", {"event": "approved:2"})
    timed = slotd.enqueue(qconn, "dur.approval", {"event": "approved:3", "timeout_s": 2})
    _daemon(db_url, daemons)
    assert wait_for(lambda: _at(qconn, early, "done"), what="the early emit seen")[0][1] == "ann"
    wait_for(lambda: _state(qconn, late) == "waiting", what="the late one waiting")
    with qconn.transaction(force_rollback=True):  # a rolled-back emit wakes nobody
        assert slotd.emit(qconn, "approved:2", {"by": "rolled back"}) == 1
    wait_for(lambda: _at(qconn, timed, "done"), what="the timeout")
    assert _at(qconn, timed, "done")[0][1] is None  # None at the timeout
    assert _state(qconn, late) == "waiting" and not _at(qconn, late, "done")
    assert slotd.emit(qconn, "approved:2", {"by": "bob"}) == 1
    assert wait_for(lambda: _at(qconn, late, "done"), what="the late emit")[0][1] == "bob"
    # From SQL too, in any transaction.
    again = slotd.enqueue(qconn, "dur.approval", {"event": "approved:4"})
    wait_for(lambda: _state(qconn, again) == "waiting", what="waiting on the SQL emit")
    qconn.execute("""SELECT slotd_emit('approved:4', '{"by": "sql"}')""")
    assert wait_for(lambda: _at(qconn, again, "done"), what="the SQL emit")[0][1] == "sql"
    # And from the command line, committed.
    cmd = slotd.enqueue(qconn, "dur.approval", {"event": "approved:5"})
    wait_for(lambda: _state(qconn, cmd) == "waiting", what="waiting on the command's emit")
    done = cli(db_url, "emit", "approved:5", '{"by": "cli"}')
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr
    assert wait_for(lambda: _at(qconn, cmd, "done"), what="the command's emit")[0][1] == "cli"
    bad = cli(db_url, "emit", "approved:6", "{nope")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("slotd: bad JSON"), bad.stderr


def test_a_rollout_while_a_task_sleeps(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """The old replica stops (SIGTERM) while the task sleeps; the new one resumes it: a
    sleeping task holds no lease, so nothing is handed over and no attempt is spent."""
    sleeper = slotd.enqueue(qconn, "dur.sleeper", {"s": 3})
    old = _daemon(db_url, daemons)
    wait_for(lambda: _state(qconn, sleeper) == "waiting", what="the sleeper waiting")
    old.signal(signal.SIGTERM)
    assert old.wait(30) == 0
    new = _daemon(db_url, daemons)
    wait_for(lambda: _at(qconn, sleeper, "done"), what="the new replica's resume")
    assert len(_at(qconn, sleeper, "side:before")) == 1  # its step was not run again
    new.wait_line(rf"dur\.sleeper#{sleeper} attempt 1: success")  # max_attempts=1: none spent
