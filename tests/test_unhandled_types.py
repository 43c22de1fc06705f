"""A task type no live replica handles (a typo, a handler not deployed yet): `slotd enqueue`
and `slotd pause` still do what they were asked and say so on stderr, naming the types the
fleet does handle; `slotd status` shows the waiting work. Through the real command line,
beside a real `slotd run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg

from tests.daemon import ROOT, Daemon, wait_for

KNOWN = "example.flaky, example.plain, example.sliced, example.stubborn"


def slotd(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLOTD_DATABASE_URL": db_url}
    return subprocess.run(
        [sys.executable, "-m", "slotd", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def live_replicas(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM slotd_replicas WHERE seen_at >= now() - interval '1 minute'"
    ).fetchone()
    return int(row[0]) if row else 0


def test_no_replica_live_means_no_warning(db_url: str) -> None:
    """With no replica live every type is unhandled: the fleet is what is missing, and the
    README's order (enqueue, then start a worker) must stay quiet."""
    done = slotd(db_url, "enqueue", "no_such_type")
    assert done.returncode == 0 and done.stdout.strip().isdigit()
    assert done.stderr == ""


def test_unhandled_type_warns_at_enqueue_and_pause_and_shows_in_status(
    db_url: str, conn: psycopg.Connection[Any], daemons: list[Daemon]
) -> None:
    daemons.append(Daemon(db_url, app="slotd.examples:registry", slots=1).start())
    wait_for(lambda: live_replicas(conn) == 1, what="the replica's heartbeat")

    done = slotd(db_url, "enqueue", "no_such_type", '{"n": 1}')
    assert done.returncode == 0, done.stderr  # enqueued: the type may be deployed later
    task_id = int(done.stdout)
    assert conn.execute("SELECT task_type FROM slotd_tasks WHERE id = %s", (task_id,)).fetchone()
    assert done.stderr.splitlines() == [
        f"slotd: warning: no live replica handles no_such_type (the fleet handles: {KNOWN}); "
        "it waits until a replica with its handler starts"
    ]

    handled = slotd(db_url, "enqueue", "example.plain")
    assert handled.returncode == 0 and handled.stderr == ""

    paused = slotd(db_url, "pause", "typo_type")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout == "paused typo_type\n"
    assert len(paused.stderr.splitlines()) == 1
    assert paused.stderr.startswith("slotd: warning: no live replica handles typo_type (")
    assert KNOWN in paused.stderr
    assert slotd(db_url, "pause", "example.plain").stderr == ""

    status = slotd(db_url, "status")
    assert status.returncode == 0, status.stderr
    assert (
        "! no live replica handles no_such_type (1 task): a typo, or a handler not deployed"
        in status.stdout.splitlines()
    )
    report = json.loads(slotd(db_url, "status", "--json").stdout)
    assert report["unhandled"] == ["no_such_type"]
