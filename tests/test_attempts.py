"""Attempts remembered (#37, sql/030): slotd.result(...).attempts lists every attempt that ran,
with its outcome, error (traceback included), worker and times, through a real `slotd run`:
a failure then a success kept by keep_history, a runner killed mid-attempt, a lapsed lease,
the attempt running now; `slotd result ID --json` shows them; retention prunes the attempts
of tasks no longer answerable."""

from __future__ import annotations

import json
import os
import signal
import socket
from datetime import timedelta
from typing import Any

import psycopg

import slotd
from slotd.repository import Repository
from slotd.supervisor.maintenance import prune
from tests.apps.life import GATE
from tests.daemon import Daemon, wait_for
from tests.test_control_runtime import cli
from tests.test_task_life import _daemon, _freeze, _lapsed, _leased, _starts


def _attempts(conn: psycopg.Connection[Any], task_id: int) -> tuple[slotd.Attempt, ...]:
    got = slotd.result(conn, task_id)
    return () if got is None else got.attempts


def test_a_failure_then_a_success_kept_by_keep_history(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = _daemon(db_url, daemons, slots=1)
    task_id = slotd.enqueue(qconn, "lc.flaky", {})
    got = slotd.wait_result(qconn, task_id, timeout=30)
    assert got is not None and got.state == "succeeded"
    assert got.value is None  # keep_history keeps the state and attempts, not the value
    first, second = got.attempts
    assert (first.number, first.outcome, second.number, second.outcome) == (
        1,
        "failure",
        2,
        "success",
    )
    assert first.error is not None and "Traceback (most recent call last)" in first.error
    assert f"ValueError: first attempt of {task_id} fails" in first.error
    assert second.error is None
    host = socket.gethostname()
    assert first.worker == second.worker == f"{host}:{daemon.pid}:0"
    for a in got.attempts:
        assert a.started_at is not None and a.ended_at is not None
        assert a.started_at <= a.ended_at
    assert first.ended_at <= second.started_at  # type: ignore[operator]

    answer = json.loads(cli(db_url, "result", str(task_id), "--json").stdout)
    assert answer["state"] == "succeeded"
    assert [(a["number"], a["outcome"]) for a in answer["attempts"]] == [
        (1, "failure"),
        (2, "success"),
    ]
    text = cli(db_url, "result", str(task_id)).stdout
    assert "#1 failure" in text and "#2 success" in text


def test_a_runner_killed_mid_attempt_is_a_crashed_attempt_and_the_running_one_is_listed(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = _daemon(db_url, daemons, slots=1)
    task_id = slotd.enqueue(qconn, "lc.killed", {})
    wait_for(lambda: _starts(qconn, task_id) == 1, what="the first attempt")
    # The attempt running now, with its worker once the replica's heartbeat names it.
    running = wait_for(
        lambda: [a for a in _attempts(qconn, task_id) if a.worker is not None],
        what="the running attempt's worker",
    )
    assert [(a.number, a.outcome, a.ended_at) for a in running] == [(1, None, None)]
    assert slotd.result(qconn, task_id).state == "running"  # type: ignore[union-attr]
    row = qconn.execute(
        "SELECT pid FROM executions WHERE task_id = %s AND phase = 'start'", (task_id,)
    ).fetchone()
    assert row is not None
    os.kill(row[0], signal.SIGKILL)  # the runner, under its handler
    got = slotd.wait_result(qconn, task_id, timeout=30)
    assert got is not None and got.state == "succeeded"
    assert [(a.number, a.outcome) for a in got.attempts] == [(1, "crashed"), (2, "success")]
    assert got.attempts[0].worker == f"{socket.gethostname()}:{daemon.pid}:0"


def test_a_lapsed_final_attempt_is_remembered_crashed_with_no_worker(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "lc.member", {"ms": 60_000}, max_attempts=1)
    victim = _daemon(db_url, daemons, slots=1)
    wait_for(lambda: _leased(qconn, task_id), what="the final attempt running")
    _freeze(victim)
    wait_for(lambda: _lapsed(qconn, task_id), what="its lease to lapse")
    _daemon(db_url, daemons, slots=1).wait_line(r"became dead letters \(exhausted\)")
    got = slotd.result(qconn, task_id)
    assert got is not None and got.state == "failed"
    (only,) = got.attempts
    assert (only.number, only.outcome, only.worker) == (1, "crashed", None)
    assert only.error is not None and "its lease lapsed" in only.error


def test_a_lapsed_attempt_with_attempts_left_is_remembered_by_the_claim_that_takes_it_over(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    task_id = slotd.enqueue(qconn, "lc.frozen_once", {})
    victim = _daemon(db_url, daemons, slots=1)
    wait_for(lambda: _starts(qconn, task_id) == 1, what="the first attempt")
    _freeze(victim)  # the whole replica: nobody is left to settle the attempt
    row = qconn.execute(
        "SELECT lease_expires_at FROM slotd_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    assert row is not None
    wait_for(lambda: _lapsed(qconn, task_id), what="its lease to lapse")
    daemon = _daemon(db_url, daemons, slots=1)
    got = slotd.wait_result(qconn, task_id, timeout=30)
    assert got is not None and got.state == "succeeded"
    first, second = got.attempts
    assert (first.number, first.outcome, first.worker) == (1, "crashed", None)
    assert first.error is not None and "its lease lapsed" in first.error
    assert first.ended_at == row[0]  # when its lease lapsed
    assert first.started_at is not None and first.started_at < first.ended_at
    assert (second.number, second.outcome) == (2, "success")
    assert second.worker == f"{socket.gethostname()}:{daemon.pid}:0"


def test_a_plain_success_leaves_nothing_and_retention_prunes_its_attempts(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    gate = psycopg.connect(db_url, autocommit=True)
    try:
        gate.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        held = slotd.enqueue(qconn, "lc.gated", {})
        plain = slotd.enqueue(qconn, "lc.plain_flaky", {})
        _daemon(db_url, daemons, slots=2)
        wait_for(lambda: _starts(qconn, plain) == 2, what="both attempts")
        wait_for(lambda: slotd.result(qconn, plain) is None, what="the plain success")

        def remembered() -> list[Any]:
            return qconn.execute(
                "SELECT task_id, outcome FROM slotd_attempts ORDER BY id"
            ).fetchall()

        # The plain success wrote nothing; its failure stays until the retention chore.
        assert remembered() == [(plain, "failure")]
        _, error = prune(Repository(qconn), timedelta(days=7))
        assert error is None and remembered() == []
        gate.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
        got = slotd.wait_result(qconn, held, timeout=30)
        assert [(a.number, a.outcome) for a in got.attempts] == [(1, "success")]  # type: ignore[union-attr]
    finally:
        gate.close()


def test_slotd_keep_history_keeps_plain_successes_answerable(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """SLOTD_KEEP_HISTORY on the worker: a type without keep_history= is answerable after
    its success (state, attempts), its value not stored."""
    _daemon(db_url, daemons, slots=1, SLOTD_KEEP_HISTORY="1h")
    task_id = slotd.enqueue(qconn, "lc.plain_flaky", {})
    got = slotd.wait_result(qconn, task_id, timeout=30)
    assert got is not None and (got.state, got.value) == ("succeeded", None)
    assert [(a.number, a.outcome) for a in got.attempts] == [(1, "failure"), (2, "success")]
