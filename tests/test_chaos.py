"""Fault injection against a real daemon: refused unless allowed; when allowed, every task
still ends done, and every injected fault is counted."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from typing import Any

import psycopg
import pytest

import slotd
from tests.daemon import ROOT, Daemon, wait_for


def noop_outcomes(metrics_url: str) -> dict[str, float]:
    """slotd_task_outcomes_total of rt.noop by outcome, from a replica's /metrics."""
    body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return {
        line.split('outcome="')[1].split('"')[0]: float(line.split()[-1])
        for line in body.splitlines()
        if line.startswith("slotd_task_outcomes_total{") and 'task_type="rt.noop"' in line
    }


def test_run_refuses_faults_unless_allowed(db_url: str) -> None:
    env = {"SLOTD_DATABASE_URL": db_url, "SLOTD_FAULT_ERROR": "0.5", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "slotd", "run", "--app", "tests.apps.runtime:registry"],
        env={k: v for k, v in os.environ.items() if k != "SLOTD_ALLOW_FAULTS"} | env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("slotd: ")
    assert "SLOTD_ALLOW_FAULTS" in proc.stderr


def test_chaos_run_loses_nothing_and_counts_every_fault(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    daemon = Daemon(
        db_url,
        slots=2,
        env={
            "SLOTD_ALLOW_FAULTS": "1",
            "SLOTD_FAULT_ERROR": "0.2",
            "SLOTD_FAULT_CRASH": "0.1",
            "SLOTD_BACKOFF_BASE": "10ms",
            "SLOTD_BACKOFF_CAP": "50ms",
            "SLOTD_METRICS_ADDR": "127.0.0.1:0",
        },
    )
    try:
        daemon.start()
        url = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()
        slotd.enqueue_many(conn, [("rt.quick", {}) for _ in range(60)])
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
            timeout=60,
            what="every task done despite the faults",
        )

        # A crashed attempt's outcome reaches the supervisor after its slot has forked the
        # next runner, so it can trail the empty queue: await the counts, do not read once.
        def scrape() -> tuple[dict[str, float], float]:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            counted = {
                line.split('kind="')[1].split('"')[0]: float(line.split()[-1])
                for line in body.splitlines()
                if line.startswith("slotd_faults_injected_total{")
            }
            outcomes = sum(
                float(line.split()[-1])
                for line in body.splitlines()
                if line.startswith("slotd_task_outcomes_total{")
                and ('outcome="failure"' in line or 'outcome="crashed"' in line)
            )
            return counted, outcomes

        def settled_up() -> tuple[dict[str, float], float] | None:
            counted, outcomes = scrape()
            return (counted, outcomes) if outcomes == counted["error"] + counted["crash"] else None

        counted, outcomes = wait_for(settled_up, timeout=20, what="every fault's outcome counted")
        assert counted["error"] > 0 and counted["crash"] > 0
        assert outcomes == counted["error"] + counted["crash"]
    finally:
        daemon.close()


@pytest.mark.parametrize("kill_point", ["SLOT_CRASH", "SLOT_CRASH_SETTLED"])
def test_a_slot_dying_around_its_settlement_counts_each_task_once(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], kill_point: str
) -> None:
    """SLOT_CRASH: the slot exits between leaving the outcome and writing it: the supervisor
    dequeues the succeeded task (fenced) instead of settling it as crashed and running it
    again. SLOT_CRASH_SETTLED: it exits after the settlement is written and counted in its
    ledger, before the lease leaves the ledger: the supervisor does not settle it again
    (which would count it `lost`). Either way every success is counted once: the dead
    slot's own settlements that it had not rung the supervisor about yet are read from its
    ledger, the orphan's from the supervisor's own."""
    daemon = Daemon(
        db_url,
        slots=2,
        env={
            "SLOTD_ALLOW_FAULTS": "1",
            f"SLOTD_FAULT_{kill_point}": "0.25",
            "SLOTD_METRICS_ADDR": "127.0.0.1:0",
        },
    )
    daemons.append(daemon)
    daemon.start()
    url = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()

    counted = lambda: noop_outcomes(url)  # noqa: E731

    ids = slotd.enqueue_many(qconn, [("rt.noop", {"n": n}) for n in range(40)])
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
        timeout=120,
        what="every task settled despite its slot dying",
    )
    daemon.wait_line(rf"injected fault: {kill_point.lower()} ")
    runs = dict(
        qconn.execute(
            "SELECT task_id, count(*) FROM executions WHERE phase = 'start' GROUP BY task_id"
        ).fetchall()
    )
    assert sorted(runs) == sorted(ids)
    assert set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    try:
        wait_for(lambda: counted().get("success", 0) >= 40, timeout=90, what="40 successes")
    except AssertionError:
        raise AssertionError(("counted", counted(), daemon.lines[-30:])) from None
    # A later task's count comes after anything still on its way about the first forty.
    slotd.enqueue(qconn, "rt.noop", {"n": 40})
    wait_for(lambda: counted().get("success", 0) >= 41, timeout=30, what="the 41st counted")
    # `released`: claims a batch's statement took that the dead slot never started, given
    # back with their attempt (each of them ran once, later: the runs above).
    assert {k: v for k, v in counted().items() if v and k != "released"} == {"success": 41}


def test_a_success_whose_answer_was_lost_is_counted_a_success_when_nothing_rode_on_it(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """Every success's answer is lost with its connection, and each task arrives alone, so
    no claim rides on its settlement: the retry finds the row gone, which only its own
    dequeue could do, and counts a success (before, the refused retry counted it `lost`:
    the last task of every backlog, whose chained claim finds nothing)."""
    daemon = Daemon(
        db_url,
        slots=1,
        env={
            "SLOTD_ALLOW_FAULTS": "1",
            "SLOTD_FAULT_ANSWER_LOST": "1",
            "SLOTD_METRICS_ADDR": "127.0.0.1:0",
        },
    )
    daemons.append(daemon)
    daemon.start()
    url = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()

    def gone(task_id: int) -> bool:
        row = qconn.execute("SELECT count(*) FROM slotd_tasks WHERE id = %s", (task_id,))
        return row.fetchone() == (0,)

    for n in range(3):
        task_id = slotd.enqueue(qconn, "rt.noop", {"n": n})
        wait_for(lambda t=task_id: gone(t), timeout=90, what=f"task {n} through a lost answer")
    # The supervisor logs each fault as the slot reports it: a moment after the row is gone.
    faults = lambda: sum("injected fault: answer_lost" in ln for ln in daemon.lines)  # noqa: E731
    wait_for(lambda: faults() >= 3, timeout=30, what="the three faults logged")

    counted = lambda: noop_outcomes(url)  # noqa: E731

    wait_for(lambda: counted().get("success", 0) >= 3, timeout=90, what="3 successes counted")
    assert {k: v for k, v in counted().items() if v} == {"success": 3}
    runs = qconn.execute("SELECT count(*) FROM executions WHERE phase = 'start'").fetchone()
    assert runs == (3,) and faults() == 3


def test_a_chained_claim_whose_answer_was_lost_is_found_by_its_token(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """The connection drops after a success's settlement and the claim riding on it
    committed, before the answer was read: the slot reconnects and finds the lease it took
    by the token it chose, runs that task now and counts the settled one a success (before,
    the retry was refused, counted `lost`, and the new lease sat unrun until ceiling +
    margin, an attempt burnt)."""
    daemon = Daemon(
        db_url,
        slots=2,
        env={
            "SLOTD_ALLOW_FAULTS": "1",
            "SLOTD_FAULT_ANSWER_LOST": "0.3",
            "SLOTD_METRICS_ADDR": "127.0.0.1:0",
        },
    )
    daemons.append(daemon)
    daemon.start()
    url = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()

    counted = lambda: noop_outcomes(url)  # noqa: E731

    ids = slotd.enqueue_many(qconn, [("rt.noop", {"n": n}) for n in range(40)])
    daemon.wait_line(r"injected fault: answer_lost")
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
        timeout=150,
        what="every task settled despite the lost answers",
    )
    runs = dict(
        qconn.execute("SELECT task_id, attempt FROM executions WHERE phase = 'start'").fetchall()
    )
    assert sorted(runs) == sorted(ids)
    assert set(runs.values()) == {1}  # no attempt burnt by a lease nobody ran
    try:
        wait_for(lambda: counted().get("success", 0) >= 40, timeout=90, what="40 successes")
    except AssertionError:
        raise AssertionError(("counted", counted(), daemon.lines[-30:])) from None
    assert {k: v for k, v in counted().items() if v} == {"success": 40}
