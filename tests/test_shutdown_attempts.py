"""A task that a stopping replica claims but never starts keeps its attempts (slotd/lifecycle/,
"released").

Found by the public job-queue benchmark (tests/bench/portable): at a replica's SIGTERM, a
claim already in flight (riding on the settlement of the task before it) returns a task the
slot then refuses to start ("not started: the replica is stopping"). The release leaves the
claim's attempt counted, so each rollout can burn an attempt of a task that never ran, and
one on its last attempt becomes a dead letter without having run."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg

import slotd
from tests.daemon import Daemon, wait_for

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def _sigterm_pending(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    return any(int(fields[k].strip(), 16) & SIGTERM_BIT for k in ("SigPnd", "ShdPnd"))


def test_a_claim_that_meets_a_shutdown_before_it_starts_costs_no_attempt(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # One slot, both tasks due before it starts: its first discovery holds both, so the claim
    # of the second rides on the settlement of the first.
    first, second = slotd.enqueue_many(qconn, [("rt.work", {"ms": 1500}), ("rt.noop", {})])
    daemon = Daemon(db_url, slots=1, env={"SLOTD_POLL_INTERVAL": "60s"})
    daemons.append(daemon)
    daemon.start()
    wait_for(
        lambda: qconn.execute(
            "SELECT 1 FROM executions WHERE task_id = %s AND phase = 'start'", (first,)
        ).fetchone(),
        what="the first task to start",
    )
    with psycopg.connect(db_url) as holder:
        # The settlement (and the claim riding on it) waits behind this row lock...
        holder.execute("SELECT 1 FROM slotd_tasks WHERE id = %s FOR UPDATE", (first,))
        wait_for(
            lambda: qconn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            ).fetchone(),
            timeout=30,
            what="the settlement to wait on the lock",
        )
        # ...while the replica is told to stop, and the slot has taken the signal.
        daemon.signal(signal.SIGTERM)
        daemon.wait_line(r"stopping: cancelling")
        (slot_proc,) = daemon.titled("slot 0")
        wait_for(lambda: not _sigterm_pending(slot_proc.pid), what="the slot to take SIGTERM")
        holder.commit()
    assert daemon.wait(30) == 0
    ran = qconn.execute("SELECT count(*) FROM executions WHERE task_id = %s", (second,)).fetchone()[
        0
    ]
    attempts = qconn.execute(
        "SELECT attempt_count FROM slotd_tasks WHERE id = %s", (second,)
    ).fetchone()[0]
    assert ran == 0
    assert attempts == 0
