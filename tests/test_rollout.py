"""A rolling update played on one machine, and the systemd notify protocol of a real daemon."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import psycopg

import slotd
from tests.daemon import Daemon, wait_for


def test_rolling_update_does_every_task_once_and_releases_every_lease(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # A long tick: prompt pick-up of released work must come from the release's own wake.
    env = {"SLOTD_POLL_INTERVAL": "30s"}
    old = Daemon(db_url, slots=2, env=env).start()
    survivor = Daemon(db_url, slots=2, env=env).start()
    daemons += [old, survivor]
    ids = slotd.enqueue_many(qconn, [("rt.work", {"ms": 150}) for _ in range(60)])
    wait_for(lambda: old.titled("running rt.work"), what="the old replica to be busy")
    old.signal(signal.SIGTERM)  # as Kubernetes and systemd send it
    assert old.wait(30) == 0
    # Nothing the old replica held is left to expire: every lease is released or settled.
    # Every lease the old replica held was released: what is leased now fits in the
    # survivor's two slots.
    leased = qconn.execute(
        "SELECT count(*) FROM slotd_tasks"
        " WHERE lease_token IS NOT NULL AND lease_expires_at > now()"
    ).fetchone()[0]
    assert leased <= 2
    newcomer = Daemon(db_url, slots=2, env=env).start()
    daemons.append(newcomer)
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
        timeout=60,
        what="the fleet to drain",
    )
    done = qconn.execute(
        "SELECT task_id, count(*) FROM executions WHERE phase = 'end' GROUP BY task_id"
    ).fetchall()
    assert sorted(task_id for task_id, _ in done) == sorted(ids)
    assert {count for _, count in done} == {1}
    cancelled = qconn.execute(
        "SELECT count(DISTINCT task_id) FROM executions e WHERE phase = 'start'"
        " AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.task_id = e.task_id"
        "   AND x.phase = 'end' AND x.pid = e.pid)"
    ).fetchone()[0]
    assert cancelled >= 1  # the rollout really interrupted work, which others finished


def test_release_at_shutdown_wakes_another_replica_at_once(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    env = {"SLOTD_POLL_INTERVAL": "60s"}
    old = Daemon(db_url, slots=1, env=env).start()
    daemons.append(old)
    task_id = slotd.enqueue(qconn, "rt.work", {"ms": 60_000})
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM executions").fetchone() == (1,),
        what="the task to start on the old replica",
    )
    survivor = Daemon(db_url, slots=1, env=env).start()
    daemons.append(survivor)
    old.signal(signal.SIGTERM)
    assert old.wait(30) == 0
    # Picked up long before the 60 s tick could have done it.
    starts = wait_for(
        lambda: (
            (
                rows := qconn.execute(
                    "SELECT pid FROM executions WHERE task_id = %s AND phase = 'start'", (task_id,)
                ).fetchall()
            )
            and len(rows) == 2
            and rows
        ),
        timeout=20,
        what="the survivor to take the released task",
    )
    assert starts[0] != starts[1]


def test_daemon_speaks_the_systemd_notify_protocol(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], tmp_path: Path
) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(20)
    daemon = Daemon(db_url, slots=2, env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"})
    daemons.append(daemon)
    daemon.start(wait_ready=False)

    def until(prefix: str) -> list[str]:
        seen: list[str] = []
        while True:
            lines = sock.recv(4096).decode().splitlines()
            seen += lines
            if any(line.startswith(prefix) for line in lines):
                return seen

    before_ready = until("READY=1")
    assert any(line.startswith("STATUS=serving") for line in before_ready + until("STATUS="))
    assert "WATCHDOG=1" in until("WATCHDOG=1")
    daemon.signal(signal.SIGTERM)
    assert any(line.startswith("STOPPING=1") for line in until("STOPPING=1"))
    assert daemon.wait(30) == 0
    sock.close()


def test_a_rollout_never_dead_letters_a_task_on_its_final_attempt_by_itself(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """The seed's rule stays (an interruption costs an attempt), bounded: a release at
    shutdown gives a final attempt back once per task, so a deploy is never what kills it;
    a second rollout on its final attempt dead-letters it, with the reason."""
    task_id = slotd.enqueue(qconn, "rt.polite", max_attempts=1)

    def roll(n: int) -> None:
        daemon = Daemon(db_url, slots=1).start()
        daemons.append(daemon)
        wait_for(
            lambda: (
                qconn.execute("SELECT count(*) FROM executions WHERE phase = 'start'").fetchone()
                == (n,)
            ),
            what=f"start {n} of the task",
        )
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0

    roll(1)
    row = qconn.execute(
        "SELECT attempt_count, max_attempts, last_error, lease_token FROM slotd_tasks"
        " WHERE id = %s",
        (task_id,),
    ).fetchone()
    assert row == (0, 1, None, None)  # released, its one attempt given back: pending, not dead
    roll(2)
    row = qconn.execute(
        "SELECT attempt_count, last_error FROM slotd_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    assert row is not None and row[0] == 1
    assert row[1] == "released at shutdown on its final attempt, a second time"
