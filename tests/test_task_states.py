"""A task's states (#37; docs/ARCHITECTURE.md "A task's states"): slotd.result(...).state
reads each of scheduled, pending, running, retrying, waiting and the terminal succeeded,
failed, cancelled, expired as it happens, through a real `slotd run`; `slotd status`
counts each task in one column."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg

import slotd
from slotd.repository import statements
from slotd.repository.states import STATES, State
from tests.apps.life import GATE
from tests.daemon import Daemon, wait_for
from tests.test_control_runtime import cli
from tests.test_task_life import APP, ENV


def _state(conn: psycopg.Connection[Any], task_id: int) -> str | None:
    got = slotd.result(conn, task_id)
    return None if got is None else got.state


def test_each_state_as_it_happens(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    later = slotd.enqueue(qconn, "lc.record", {"n": 1}, delay=timedelta(hours=1))
    waiting = slotd.enqueue(qconn, "lc.record", {"n": 2}, after=[later])
    due = slotd.enqueue(qconn, "lc.record", {"n": 3})
    stale = slotd.enqueue(qconn, "lc.record", {}, expires_in=timedelta(hours=1))
    qconn.execute(
        "UPDATE slotd_tasks SET expires_at = now() - interval '1s' WHERE id = %s", (stale,)
    )
    assert [_state(qconn, i) for i in (later, waiting, due, stale)] == [
        "scheduled",
        "waiting",
        "pending",
        "expired",  # never to start, before any sweep wrote it
    ]
    got = slotd.result(qconn, stale)
    assert got is not None and got.done and "expired at" in (got.error or "")

    gate = psycopg.connect(db_url, autocommit=True)
    try:
        gate.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        held = slotd.enqueue(qconn, "lc.gated", {})
        retrying = slotd.enqueue(qconn, "lc.retry_later", {})
        failing = slotd.enqueue(qconn, "lc.fail", {})
        daemon = Daemon(db_url, slots=3, app=APP, env=ENV)
        daemons.append(daemon)
        daemon.start()
        wait_for(lambda: _state(qconn, held) == "running", what="running")
        wait_for(lambda: _state(qconn, retrying) == "retrying", what="retrying")
        r = slotd.result(qconn, retrying)
        assert r is not None and not r.done and "attempt 1 fails" in (r.error or "")
        assert slotd.wait_result(qconn, due, timeout=30).state == "succeeded"
        assert slotd.wait_result(qconn, failing, timeout=30).state == "failed"
        assert slotd.wait_result(qconn, stale, timeout=30).state == "expired"

        # Every task in one column of `slotd status`, and in one state of --json.
        report = json.loads(cli(db_url, "status", "--json").stdout)
        assert report["states"]["lc.gated"] == {"running": 1}
        assert report["states"]["lc.retry_later"] == {"retrying": 1}
        assert report["states"]["lc.record"] == {"scheduled": 1, "waiting": 1, "expired": 1}
        assert set(report["states"]["lc.fail"]) == {"failed"}
        table = cli(db_url, "status").stdout.splitlines()
        gated_row = next(line.split() for line in table if line.startswith("lc.gated"))
        assert gated_row[1:7] == ["0", "0", "1", "0", "0", "0"]
        # The database's own definition (sql/090): an operator's SQL reads what slotd reads.
        rows = qconn.execute("SELECT t.id, slotd_task_state(t) FROM slotd_tasks t").fetchall()
        assert len(rows) >= 6 and all(state == _state(qconn, i) for i, state in rows)

        assert slotd.cancel(qconn, later)
        assert _state(qconn, later) == "cancelled"
        assert _state(qconn, waiting) == "cancelled"  # its parent's end
        gate.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
        assert slotd.wait_result(qconn, held, timeout=30).value == {"gated": held}
    finally:
        gate.close()
    seen = {"scheduled", "waiting", "pending", "running", "retrying", "succeeded", "failed"}
    assert seen | {"cancelled", "expired"} == set(STATES) == {s.value for s in State}


def test_the_states_are_the_databases_own_definition_inlined_where_read(
    qconn: psycopg.Connection[Any],
) -> None:
    """Every reader splices slotd_task_state(t) (sql/090); the planner inlines it, so a
    state costs what the CASE written in place cost, and its definition is one."""
    assert "slotd_task_state(t)" in statements()["state_counts"]
    for name in ("state_counts", "result_of"):
        sql = statements()[name]
        params = {"id": 1}
        plan = "\n".join(
            row[0] for row in qconn.execute(f"EXPLAIN (VERBOSE) {sql}", params).fetchall()
        )
        assert "slotd_task_state" not in plan and "CASE WHEN" in plan, plan
    proc = qconn.execute(
        "SELECT p.provolatile, p.proconfig FROM pg_proc p WHERE p.proname = 'slotd_task_state'"
    ).fetchall()
    assert proc == [("s", None)]  # STABLE, no SET clause: both are what inlining needs
