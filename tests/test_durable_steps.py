"""Durable steps (#38) through a real `slotd run`: a step's side effect happens once per task
across whatever ends its attempt after the step (its runner's crash, a kill -9 of its slot,
a raise), and the next attempt gets the stored value back; the handler's own mistakes (a
name taken twice, a value that is not JSON, steps changed under a task) fail it clearly.
The same through the eager test mode."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.testing import eager
from slotd.testing.manual import ManualQueue
from tests.apps import durable
from tests.daemon import Daemon, wait_for

APP = "tests.apps.durable:registry"


def _phases(conn: psycopg.Connection[Any], task_id: int) -> list[str]:
    rows = conn.execute(
        "SELECT phase FROM executions WHERE task_id = %s ORDER BY at, phase", (task_id,)
    ).fetchall()
    return [r[0] for r in rows]


def _done(conn: psycopg.Connection[Any], task_id: int) -> str | None:
    row = conn.execute(
        "SELECT note FROM executions WHERE task_id = %s AND phase = 'done'", (task_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def _gone(conn: psycopg.Connection[Any], task_id: int) -> bool:
    return conn.execute("SELECT 1 FROM slotd_tasks WHERE id = %s", (task_id,)).fetchone() is None


def _row(conn: psycopg.Connection[Any], task_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT steps, last_error, attempt_count FROM slotd_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


def _daemon(db_url: str, daemons: list[Daemon], slots: int = 1) -> Daemon:
    daemon = Daemon(db_url, slots=slots, app=APP)
    daemons.append(daemon)
    return daemon.start()


@pytest.mark.parametrize("task_type", ["dur.order", "dur.order_async"])
@pytest.mark.parametrize("then", ["crash", "raise"])
def test_a_step_runs_once_across_a_runner_crash_or_a_raise_after_it(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], then: str, task_type: str
) -> None:
    task_id = slotd.enqueue(qconn, task_type, {"then": then, "amount": 5})
    _daemon(db_url, daemons)
    note = wait_for(lambda: _done(qconn, task_id), what="the second attempt to finish")
    wait_for(lambda: _gone(qconn, task_id), what="the success's dequeue")
    phases = _phases(qconn, task_id)
    assert phases.count("side:charge") == 1, phases  # not charged again by attempt 2
    assert phases.count("side:ship") == 1, phases
    assert phases.count(f"then:{then}") == 1
    # Attempt 2 got the stored value back: what the charge returned on attempt 1.
    assert note.split(":")[0] == "5"


def test_a_step_runs_once_across_a_kill_of_its_slot(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "dur.order", {"then": "hang", "amount": 9})
    daemon = _daemon(db_url, daemons)
    wait_for(lambda: "then:hang" in _phases(qconn, task_id), what="the step, then the hang")
    steps, _, _ = _row(qconn, task_id)
    assert [s["name"] for s in steps] == ["charge"]  # stored before the handler went on
    assert steps[0]["value"] == {"charged": 9}
    (slot,) = daemon.titled(f"slot 0 running dur.order#{task_id}")
    os.kill(slot.pid, signal.SIGKILL)
    note = wait_for(lambda: _done(qconn, task_id), what="the retry on a respawned slot")
    phases = _phases(qconn, task_id)
    assert phases.count("side:charge") == 1, phases
    assert note == "9:7"
    wait_for(lambda: _gone(qconn, task_id), what="the task and its steps pruned")


def test_a_step_taken_twice_in_one_run_is_the_handlers_error(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "dur.repeat", {})
    _daemon(db_url, daemons)
    error = wait_for(lambda: _row(qconn, task_id)[1], what="the dead letter")
    assert "step 'a' taken twice in one run" in error
    assert _phases(qconn, task_id) == ["side:a"]


def test_a_step_whose_value_is_not_json_is_the_handlers_error(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "dur.not_json", {})
    _daemon(db_url, daemons)
    error = wait_for(lambda: _row(qconn, task_id)[1], what="the dead letter")
    assert "step 'a': value is not JSON-serializable" in error
    assert _row(qconn, task_id)[0] is None  # nothing stored


def test_steps_changed_under_a_task_fail_it_naming_the_step(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "dur.changed", {})
    _daemon(db_url, daemons)
    wait_for(
        lambda: _row(qconn, task_id)[2] >= 2 and "StepMismatch" in (_row(qconn, task_id)[1] or ""),
        what="the second attempt's failure",
    )
    error = _row(qconn, task_id)[1]
    assert "step 1 of this run is 'reserve', but an earlier attempt stored 'charge'" in error
    assert "side:reserve" not in _phases(qconn, task_id)


def test_steps_in_the_test_modes(
    qconn: psycopg.Connection[Any], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eager mode takes a step through the same fenced write; manual mode's retry replays it."""
    monkeypatch.setenv("SLOTD_DATABASE_URL", db_url)  # the handlers' own connection
    with eager(durable.registry, qconn):
        task_id = slotd.enqueue(qconn, "dur.order", {"then": "raise", "amount": 3})
    assert _row(qconn, task_id)[0][0]["name"] == "charge"  # attempt 1 failed after it
    queue = ManualQueue(qconn, durable.registry)
    queue.advance_time(timedelta(seconds=1))  # past its backoff
    (settled,) = queue.deliver_all()
    assert settled.outcome is slotd.Outcome.SUCCESS
    assert _phases(qconn, task_id).count("side:charge") == 1
    assert _done(qconn, task_id) == "3:7"
    assert _gone(qconn, task_id)
