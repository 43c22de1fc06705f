"""Operator control against real `slotd run` daemons: cancelled tasks never start, paused
types are not claimed by any replica (started before or after the pause) and resume."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from typing import Any

import psutil
import psycopg

import slotd
from slotd.repository import Repository, cancel_tasks
from tests.daemon import ROOT, Daemon, gone, wait_for


def start(daemons: list[Daemon], db_url: str, **kw: Any) -> Daemon:
    daemon = Daemon(db_url, **kw)
    daemons.append(daemon)
    return daemon.start()


def started(conn: psycopg.Connection[Any], ids: list[int]) -> set[int]:
    rows = conn.execute(
        "SELECT DISTINCT task_id FROM executions WHERE phase = 'start' AND task_id = ANY(%s)",
        (ids,),
    ).fetchall()
    return {r[0] for r in rows}


def remaining(conn: psycopg.Connection[Any], ids: list[int]) -> int:
    row = conn.execute("SELECT count(*) FROM slotd_tasks WHERE id = ANY(%s)", (ids,)).fetchone()
    return int(row[0]) if row else 0


def cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command as an operator types it, in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "slotd", *args],
        env={"PATH": "/usr/bin:/bin", "SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cancelled_pending_tasks_never_start(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    ids = slotd.enqueue_many(qconn, [("rt.noop", {"n": n}) for n in range(40)])
    cancelled, kept = ids[::2], ids[1::2]
    done = cli(db_url, "cancel", *[f"--id={i}" for i in cancelled])
    assert done.returncode == 0, done.stderr
    start(daemons, db_url, slots=2)
    wait_for(lambda: remaining(qconn, kept) == 0, what="the kept tasks to run")
    # The daemon drained everything it could, past the cancelled ones, and started none.
    assert started(qconn, kept) == set(kept)
    assert started(qconn, cancelled) == set()
    dead = {d["id"]: d for d in Repository(qconn).dead_list(limit=100)}
    assert set(dead) == set(cancelled)
    assert all(d["last_error"].startswith("cancelled by ") for d in dead.values())


def test_type_paused_before_a_replica_starts_is_not_claimed_and_resumes_at_until(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # The paused type's backlog sits at the head of the queue (oldest first); the other type
    # must flow past it.
    held = slotd.enqueue_many(qconn, [("rt.noop", {"n": n}) for n in range(300)])
    # Paused for longer than any start-up takes, however loaded the machine: the replica
    # must find the pause in force when it starts.
    paused = cli(db_url, "pause", "rt.noop", "--until", "1h")
    assert paused.returncode == 0, paused.stderr
    flowing = slotd.enqueue_many(qconn, [("rt.quick", {"n": n}) for n in range(100)])
    daemon = start(daemons, db_url, slots=2)
    daemon.wait_line(r"task type rt\.noop is paused \(by \S+@\S+ since .*, until ")
    wait_for(lambda: remaining(qconn, flowing) == 0, what="the other type to drain")
    assert started(qconn, held) == set()
    # Then the pause is cut short to a near end (the same upsert an operator's second
    # `slotd pause` makes); nothing announces its end, so the poll must find it.
    shortened = cli(db_url, "pause", "rt.noop", "--until", "2s")
    assert shortened.returncode == 0, shortened.stderr
    # Read from the table: the pause may be over already (2 s) when this looks.
    until = qconn.execute(
        "SELECT until FROM slotd_paused_types WHERE task_type = 'rt.noop'"
    ).fetchone()
    assert until is not None
    pause = {"until": until[0]}
    # At the pause's end the backlog is claimed (by the poll: nothing announces the end).
    wait_for(lambda: remaining(qconn, held) == 0, timeout=60, what="the paused type to resume")
    assert _after(qconn, held, pause["until"])


def _after(conn: psycopg.Connection[Any], ids: list[int], until: Any) -> bool:
    first = conn.execute(
        "SELECT min(at) FROM executions WHERE phase = 'start' AND task_id = ANY(%s)", (ids,)
    ).fetchone()
    assert first is not None and first[0] is not None
    assert first[0] >= until, (first[0], until)
    return True


def test_pause_stops_claims_of_a_running_replica_and_resume_wakes_it(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=2, env={"SLOTD_POLL_INTERVAL": "1h"})
    assert cli(db_url, "pause", "rt.noop").returncode == 0
    line = daemon.wait_line(r"task type rt\.noop paused by ")
    assert "@" in line
    held = slotd.enqueue_many(qconn, [("rt.noop", {}) for _ in range(5)])
    flowing = slotd.enqueue_many(qconn, [("rt.quick", {}) for _ in range(20)])
    wait_for(lambda: remaining(qconn, flowing) == 0, what="the other type to drain")
    assert started(qconn, held) == set()
    assert cli(db_url, "resume", "rt.noop").returncode == 0
    # The poll is an hour away: only resume's wake can have started these.
    wait_for(lambda: remaining(qconn, held) == 0, what="the resumed type to drain")
    daemon.wait_line(r"task type rt\.noop resumed by ")


# --- cancelling running tasks ----------------------------------------------------------------


def cancel_now(conn: psycopg.Connection[Any], task_id: int) -> list[Any]:
    with conn.transaction():
        return cancel_tasks(conn, ids=[task_id], by="tester@tests")


def row_of(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM slotd_tasks WHERE id = %s", (task_id,))
    found = cur.fetchone()
    assert found is not None, f"task {task_id} is gone"
    return dict(zip([c.name for c in cur.description], found, strict=True))


def settled_cancelled(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any] | None:
    found = row_of(conn, task_id)
    return found if found["lease_token"] is None else None


def executions(conn: psycopg.Connection[Any], task_id: int) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT phase, pid, note, at FROM executions WHERE task_id = %s ORDER BY at", (task_id,)
    ).fetchall()


def test_cancelled_cooperative_handler_stops_at_once_and_is_never_retried(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1, env={"SLOTD_KILL_GRACE": "2s"})
    task_id = slotd.enqueue(qconn, "rt.polite")
    wait_for(lambda: executions(qconn, task_id), what="the handler to start")
    [cancelled] = cancel_now(qconn, task_id)
    assert cancelled.running
    row = wait_for(lambda: settled_cancelled(qconn, task_id), what="the cancel settlement")
    # It saw ctx.cancelled and ended by itself (its "end" row), long before the 2 s kill.
    (_, pid, _, _), (phase, _, note, ended) = executions(qconn, task_id)
    assert (phase, note) == ("end", "cancelled")
    stop_s = (ended - row["cancelled_at"]).total_seconds()
    assert stop_s < 2.0, stop_s
    assert psutil.pid_exists(pid)  # the runner was not killed: it serves the next task
    assert row["attempt_count"] >= row["max_attempts"]
    assert row["last_error"].startswith("cancelled by tester@tests")
    daemon.wait_line(rf"rt\.polite#{task_id} attempt 1: cancelled .*not retried")
    follow = slotd.enqueue(qconn, "rt.noop")
    wait_for(lambda: remaining(qconn, [follow]) == 0, what="the slot to serve again")
    assert len(executions(qconn, task_id)) == 2  # never retried
    assert [d["id"] for d in Repository(qconn).dead_list()] == [task_id]


def test_cancelled_handler_that_ignores_it_is_killed_after_the_kill_grace(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1, env={"SLOTD_KILL_GRACE": "1s"})
    task_id = slotd.enqueue(qconn, "rt.stubborn_long")  # ignores ctx.cancelled; 60 s ceiling
    [(_, runner_pid, _, _)] = wait_for(lambda: executions(qconn, task_id), what="a start")
    cancel_now(qconn, task_id)
    row = wait_for(lambda: settled_cancelled(qconn, task_id), what="the kill and settlement")
    wait_for(lambda: gone(runner_pid), what="the runner to be killed")
    assert row["last_error"].startswith("cancelled by tester@tests")
    line = daemon.wait_line(rf"rt\.stubborn_long#{task_id} attempt 1: cancelled")
    assert "not retried" in line
    follow = slotd.enqueue(qconn, "rt.noop")
    wait_for(lambda: remaining(qconn, [follow]) == 0, what="a fresh runner to serve")
    assert len(executions(qconn, task_id)) == 1
    [dead] = Repository(qconn).dead_list()
    assert dead["id"] == task_id and "while attempt 1 was running" in dead["last_error"]


def test_a_cancel_whose_notification_was_lost_still_stops_the_task(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # The row says cancelled but no notification went out (as when the replica's LISTEN
    # connection was down at the time): the slot's own periodic look finds it.
    start(daemons, db_url, slots=1)
    task_id = slotd.enqueue(qconn, "rt.polite")
    wait_for(lambda: executions(qconn, task_id), what="the handler to start")
    qconn.execute(
        "UPDATE slotd_tasks SET attempt_count = max_attempts, cancelled_at = now(),"
        " last_error = 'cancelled by tester@tests (notification lost)' WHERE id = %s",
        (task_id,),
    )
    wait_for(lambda: settled_cancelled(qconn, task_id), timeout=30, what="the slot to notice")
    assert [e[0] for e in executions(qconn, task_id)] == ["start", "end"]


def test_a_cancel_while_its_replica_is_frozen_then_dead_is_never_run_again(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    first = start(daemons, db_url, slots=1)
    task_id = slotd.enqueue(qconn, "rt.recv")  # 1 s ceiling: its lease lapses in 4 s
    wait_for(lambda: executions(qconn, task_id), what="the handler to start")
    family = [psutil.Process(first.pid), *first.tree()]
    for p in family:
        p.suspend()  # the replica hangs: it cannot act on the cancel
    [cancelled] = cancel_now(qconn, task_id)
    assert cancelled.running
    for p in family:
        p.kill()  # and then dies without settling anything
    second = start(daemons, db_url, slots=1, env={"SLOTD_HEARTBEAT_INTERVAL": "1s"})
    # The lease lapses; the new replica's claims (the poll's, every second) must refuse the
    # row, and its lapse sweep (once a heartbeat) settles it as the cancel it was.
    second.wait_line(r"1 rt\.recv task\(s\) became dead letters \(cancelled\)", timeout=30)
    row = qconn.execute(
        "SELECT lease_token, dead_reason FROM slotd_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    assert row == (None, "cancelled")
    follow = slotd.enqueue(qconn, "rt.noop")
    wait_for(lambda: remaining(qconn, [follow]) == 0, what="the new replica to serve")
    assert [e[0] for e in executions(qconn, task_id)] == ["start"]
    assert [d["id"] for d in Repository(qconn).dead_list()] == [task_id]
    assert second.proc is not None and second.proc.poll() is None


def test_cancel_racing_claims_of_a_live_daemon_never_lets_an_attempt_start_after_it(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    start(daemons, db_url, slots=2)
    rng = random.Random(15)
    verdicts: dict[int, str] = {}
    for _ in range(30):  # 30 bursts of 5: cancels land before, during and after the claims
        ids = slotd.enqueue_many(qconn, [("rt.work", {"ms": 30}) for _ in range(5)])
        for task_id in ids:
            time.sleep(rng.random() * 0.02)  # jitter, not synchronisation
            done = cancel_now(qconn, task_id)
            verdict = "running" if done and done[0].running else "pending"
            verdicts[task_id] = verdict if done else "finished"
    every = list(verdicts)
    wait_for(
        lambda: (
            qconn.execute(
                "SELECT count(*) FROM slotd_tasks WHERE id = ANY(%s) AND lease_token IS NOT NULL",
                (every,),
            ).fetchone()
            == (0,)
        ),
        timeout=60,
        what="every attempt to be settled",
    )
    for task_id, verdict in verdicts.items():
        starts = [e for e in executions(qconn, task_id) if e[0] == "start"]
        if verdict == "pending":
            assert starts == [], f"task {task_id} started after a cancel found it pending"
        elif verdict == "running":
            # Stopped and kept as a dead letter, or it finished its work before the cancel
            # reached it (a success, deleted): one attempt either way, never a retry.
            assert len(starts) <= 1, task_id
        else:
            assert len(starts) == 1 and remaining(qconn, [task_id]) == 0, task_id
    assert "pending" in set(verdicts.values()), verdicts
    left = qconn.execute(
        "SELECT id FROM slotd_tasks WHERE id = ANY(%s) AND NOT (attempt_count >= max_attempts"
        " AND cancelled_at IS NOT NULL)",
        (every,),
    ).fetchall()
    assert left == []  # whatever is left of them is a cancelled dead letter


def test_a_slot_that_dies_while_stopping_a_cancelled_task_is_settled_as_the_cancel(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1)
    task_id = slotd.enqueue(qconn, "rt.polite")
    wait_for(lambda: executions(qconn, task_id), what="the handler to start")
    slot = wait_for(lambda: daemon.titled("slot 0 running"), what="the busy slot")[0]
    slot.suspend()  # it cannot act on the cancel...
    cancel_now(qconn, task_id)
    slot.kill()  # ...and dies holding the lease: its supervisor settles it
    wait_for(lambda: settled_cancelled(qconn, task_id), what="the supervisor's settlement")
    daemon.wait_line(rf"rt\.polite#{task_id} attempt 1: cancelled .*not retried")
    assert row_of(qconn, task_id)["last_error"].startswith("cancelled by tester@tests")
