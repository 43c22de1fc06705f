"""Handler-directed outcomes (#38) through a real `slotd run`: Snooze (no attempt spent,
capped, expiring), Discard (a dead letter now, its dependants cancelled, its batch
counted), RetryAfter, and the handler options retry_on / discard_on / backoff."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

import slotd
from slotd.lifecycle import MAX_SNOOZES
from slotd.repository.batches import batch_of
from slotd.testing.manual import ManualQueue
from tests.apps import durable
from tests.daemon import Daemon, wait_for

APP = "tests.apps.durable:registry"


def _daemon(db_url: str, daemons: list[Daemon], slots: int = 1) -> Daemon:
    daemon = Daemon(db_url, slots=slots, app=APP)
    daemons.append(daemon)
    return daemon.start()


def _attempts(conn: psycopg.Connection[Any], task_id: int, phase: str = "start") -> list[int]:
    rows = conn.execute(
        "SELECT attempt FROM executions WHERE task_id = %s AND phase = %s ORDER BY at",
        (task_id, phase),
    ).fetchall()
    return [r[0] for r in rows]


def _dead(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT dead_reason, dead_attempts, last_error, lease_token IS NULL FROM slotd_tasks"
        " WHERE id = %s AND dead_reason IS NOT NULL",
        (task_id,),
    ).fetchone()
    if row is None or not row[3]:
        return None
    return {"reason": row[0], "attempts": row[1], "error": row[2]}


def _due_in(conn: psycopg.Connection[Any], task_id: int) -> float | None:
    """Seconds from the last attempt's start to the next's due time, once it failed."""
    row = conn.execute(
        "SELECT extract(epoch FROM run_at - last_attempted_at), lease_token FROM slotd_tasks"
        " WHERE id = %s",
        (task_id,),
    ).fetchone()
    return float(row[0]) if row and row[1] is None and row[0] and row[0] > 1 else None


def test_a_task_of_max_attempts_2_still_succeeds_after_3_snoozes(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "dur.snoozer", {"snoozes": 3})
    daemon = _daemon(db_url, daemons)
    wait_for(lambda: _attempts(qconn, task_id, "done"), what="the fourth run's success")
    # Every run was attempt 1: a snooze gives back the attempt its claim took.
    assert _attempts(qconn, task_id) == [1, 1, 1, 1]
    assert _attempts(qconn, task_id, "done") == [1]
    snoozed = [x for x in daemon.lines if f"dur.snoozer#{task_id} attempt 1: snoozed" in x]
    assert len(snoozed) == 3
    daemon.wait_line(rf"dur\.snoozer#{task_id} attempt 1: success")


def test_a_snooze_past_expires_in_expires(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    _daemon(db_url, daemons)  # serving first: the task must start before it expires
    task_id = slotd.enqueue(
        qconn, "dur.snoozer", {"snoozes": 1, "for_s": 60}, expires_in=timedelta(seconds=3)
    )
    dead = wait_for(lambda: _dead(qconn, task_id), what="the expiry")
    assert dead["reason"] == "expired"
    assert _attempts(qconn, task_id) == [1]  # the snooze's wake never came


def test_snoozes_are_capped_with_a_clear_dead_letter(
    qconn: psycopg.Connection[Any], db_url: str, monkeypatch: Any
) -> None:
    monkeypatch.setenv("SLOTD_DATABASE_URL", db_url)
    qconn.execute("TRUNCATE executions")
    task_id = slotd.enqueue(qconn, "dur.snoozer", {"snoozes": 10_000, "for_s": 0})
    queue = ManualQueue(qconn, durable.registry)
    outcomes = [s.outcome for s in queue.deliver_all(limit=MAX_SNOOZES + 5)]
    assert outcomes == [slotd.Outcome.SNOOZED] * MAX_SNOOZES + [slotd.Outcome.DISCARDED]
    dead = _dead(qconn, task_id)
    assert dead is not None and dead["reason"] == "discarded"
    assert f"snoozed {MAX_SNOOZES} times" in dead["error"]


def test_discard_is_a_dead_letter_now_its_dependants_cancelled_its_batch_counted(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    with slotd.batch(qconn, on_complete=("dur.snoozer", {"snoozes": 0})) as b:
        task_id = b.enqueue("dur.discard", {})
    dependant = slotd.enqueue(qconn, "dur.snoozer", {"snoozes": 0}, after=[task_id])
    daemon = _daemon(db_url, daemons)
    dead = wait_for(lambda: _dead(qconn, task_id), what="the discard")
    assert dead["reason"] == "discarded" and dead["attempts"] == 1
    assert "customer deleted" in dead["error"]
    assert _attempts(qconn, task_id) == [1]  # ran once, of its 5 attempts
    assert wait_for(lambda: _dead(qconn, dependant), what="the dependant's cancel")["reason"] == (
        "parent_failed"
    )
    state = wait_for(lambda: (s := batch_of(qconn, b.id)) and s.completed_at and s, what="batch")
    assert (state.failed, state.total) == (1, 1)
    daemon.wait_line(rf"dur\.discard#{task_id} attempt 1: discarded")
    assert slotd.result(qconn, task_id).state == "failed"


def test_retry_on_retries_only_what_it_names(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "dur.retry_on", {})
    _daemon(db_url, daemons)
    dead = wait_for(lambda: _dead(qconn, task_id), what="the ValueError's discard")
    assert dead["reason"] == "discarded" and "ValueError: bad invoice" in dead["error"]
    assert _attempts(qconn, task_id) == [1, 2]  # the ConnectionError was retried


def test_discard_on_discards_at_once(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "dur.discard_on", {})
    _daemon(db_url, daemons)
    dead = wait_for(lambda: _dead(qconn, task_id), what="the discard")
    assert dead["reason"] == "discarded"
    assert _attempts(qconn, task_id) == [1]


def test_backoff_and_retry_after_set_the_next_attempts_due_time(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    by_backoff = slotd.enqueue(qconn, "dur.backoff", {})
    by_header = slotd.enqueue(qconn, "dur.backoff", {"retry_after": 321})
    _daemon(db_url, daemons)
    # backoff=(attempt, exc) -> 100 s * attempt, exactly (no jitter); RetryAfter wins over it.
    assert 99 < wait_for(lambda: _due_in(qconn, by_backoff), what="its backoff") < 101
    assert 320 < wait_for(lambda: _due_in(qconn, by_header), what="its retry") < 322
    result = slotd.result(qconn, by_header)
    assert result.state == "retrying"
