"""A rolling upgrade from the previous release, played for real: replicas of the release
CHANGELOG.md names (its commit unpacked from this repository's history) drain while this
checkout's `slotd migrate` runs under them, then new replicas join them, then the old ones
are stopped. Migrations only add within a release line; this is the test that says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import slotd
from slotd import repository
from slotd.dev.localpg import LocalPostgres
from tests.daemon import EXECUTIONS, ROOT, Daemon, wait_for
from tests.release import Release, unpack

# What both releases' replicas run with: quick ticks and backoff, heartbeats every second
# (so `slotd status` sees the fleet at once), JSON logs (every record's level is read).
FLEET = {
    "SLOTD_POLL_INTERVAL": "500ms",
    "SLOTD_BACKOFF_BASE": "100ms",
    "SLOTD_BACKOFF_CAP": "200ms",
    "SLOTD_HEARTBEAT_INTERVAL": "1s",
    "SLOTD_LOG_FORMAT": "json",
}
APP = "tests.apps.upgrade:registry"

# An old producer: the previous release's slotd.enqueue in an application process that
# keeps running through the rollout. Prints the ids it enqueued; stops at EOF on stdin.
OLD_PRODUCER = """
import os, sys, threading, time
import psycopg, slotd
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
    while not stop.is_set():
        with conn.transaction():
            ids = slotd.enqueue_many(conn, [("up.work", {"ms": 10})] * 3 + [("up.flaky", {})])
        print(*ids, flush=True)
        stop.wait(0.05)  # pacing: about 80 tasks/s
"""


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return unpack(tmp_path_factory.mktemp("previous-release"))


@pytest.fixture
def bare_url(pg_server: LocalPostgres) -> Iterator[str]:
    """An empty database (not the checkout's migrated template): the previous release
    creates its own schema, as the deployment being upgraded did."""
    name = f"slotd_upgrade_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        repository.create_database(conn, name)
    yield str(pg_server.url(name))


def _new_slotd(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLOTD_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "slotd", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _ends(conn: psycopg.Connection[Any], side: str, since: Any = None) -> int:
    row = conn.execute(
        "SELECT count(*) FROM executions WHERE phase = 'end' AND note = %s"
        " AND (%s::timestamptz IS NULL OR at > %s::timestamptz)",
        (side, since, since),
    ).fetchone()
    return row[0] if row else 0


def _start(fleet: list[Daemon]) -> None:
    # Side by side, as a deployment starts them: their imports overlap.
    for daemon in fleet:
        daemon.start(wait_ready=False)
    for daemon in fleet:
        daemon.wait_line(r"serving ", timeout=60)


def _complaints(daemon: Daemon) -> list[str]:
    """Every record above INFO, and anything that is not a JSON record (a traceback),
    except the failures up.flaky makes on purpose."""
    found = []
    for line in daemon.lines:
        try:
            record = json.loads(line)
        except ValueError:
            found.append(line)
            continue
        if record.get("level") in ("debug", "info"):
            continue
        if record.get("task_type") == "up.flaky" and record.get("outcome") == "failure":
            continue
        # Two releases' schedule threads meeting on the schedule's row can deadlock;
        # PostgreSQL ends one statement and that replica retries it (a warning, no fire lost
        # or doubled: the fire is a compare-and-set, sql `schedules_fire`). Seen once in the CI run
        # of 2026-12-02 04:58; its cause is open in #26's note, the retry is the rule here.
        if (
            record.get("logger") == "slotd.schedules"
            and record.get("level") == "warning"
            and "deadlock detected; retrying" in str(record.get("message"))
        ):
            continue
        found.append(line)
    return found


# Two releases' fleets, five `slotd` starts and a drain: ~60 s on a quiet machine.
@pytest.mark.timeout(300)
def test_the_previous_release_keeps_draining_through_migrate_and_beside_new_replicas(
    previous: Release, bare_url: str, daemons: list[Daemon]
) -> None:
    url = bare_url
    migrated = previous.run("migrate", env={"SLOTD_DATABASE_URL": url})
    assert migrated.returncode == 0, migrated.stderr
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(EXECUTIONS)

    old_env = {**FLEET, "UPGRADE_SIDE": "old", "PYTHONPATH": previous.env()["PYTHONPATH"]}
    old = [Daemon(url, slots=2, app=APP, env=old_env, cwd=previous.tree) for _ in range(2)]
    daemons += old
    _start(old)
    producer = subprocess.Popen(
        [sys.executable, "-c", OLD_PRODUCER],
        env=previous.env(SLOTD_DATABASE_URL=url),
        cwd=previous.tree,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    new: list[Daemon] = []
    new_ids: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        with psycopg.connect(url, autocommit=True) as pconn:
            while not stop.is_set():
                with pconn.transaction():
                    items = [("up.work", {"ms": 10})] * 3 + [("up.flaky", {})]
                    new_ids.extend(slotd.enqueue_many(pconn, items))
                stop.wait(0.05)

    thread = threading.Thread(target=produce, daemon=True)
    try:
        wait_for(lambda: _ends(conn, "old") >= 20, what="the old fleet to drain tasks")

        # This checkout's migrate, under a live fleet of the previous release.
        result = _new_slotd("migrate", url=url)
        assert result.returncode == 0, f"slotd migrate under the old fleet: {result.stderr}"
        since = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        wait_for(
            lambda: _ends(conn, "old", since) >= 20,
            what="the old replicas to keep draining on the migrated schema",
        )
        # The rows the old release writes read their state through the database's own
        # definition (sql/090), with no backfill: leased ones running, the others live.
        states = conn.execute(
            "SELECT slotd_task_state(t), coalesce(t.lease_expires_at > now(), false)"
            " FROM slotd_tasks t"
        ).fetchall()
        assert all((state == "running") == live for state, live in states), states
        assert {state for state, _ in states} <= {"pending", "running", "retrying"}, states

        # New replicas beside the old ones, and a producer of this checkout.
        new_env = {**FLEET, "UPGRADE_SIDE": "new"}
        new += [Daemon(url, slots=2, app=APP, env=new_env) for _ in range(2)]
        daemons += new
        _start(new)

        thread.start()
        side_by_side = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        wait_for(
            lambda: _ends(conn, "old", side_by_side) >= 20 and _ends(conn, "new") >= 20,
            what="old and new replicas draining side by side",
        )
        # Each release's `slotd status` reads the mixed fleet; the new one names versions.
        wait_for(
            lambda: "versions:" in _new_slotd("status", url=url).stdout,
            what="`slotd status` to show the fleet's two versions",
        )
        report = _new_slotd("status", url=url).stdout
        assert f"{slotd.__version__} x2" in report and "0.1.x x2" in report, report
        old_status = previous.run("status", env={"SLOTD_DATABASE_URL": url})
        assert old_status.returncode == 0, f"the old `slotd status`: {old_status.stderr}"

        # The rollout: the old replicas stop as Kubernetes stops them.
        for daemon in old:
            daemon.signal(signal.SIGTERM)
        codes = [daemon.wait(30) for daemon in old]
        assert codes == [0, 0], f"old replicas exited {codes}"
    finally:
        out, err = producer.communicate(timeout=30)  # EOF on its stdin stops it
        stop.set()
        if thread.is_alive():
            thread.join(10)
    assert producer.returncode == 0, f"the old producer: {err}"
    ids = [int(x) for line in out.split() for x in line.split()] + new_ids
    # Read first: an incompatible migration shows here, as the old replicas' own words.
    for side, fleet in (("old", old), ("new", new)):
        for daemon in fleet:
            complaints = _complaints(daemon)
            assert not complaints, f"a replica of the {side} release logged errors:\n" + "\n".join(
                complaints[:20]
            )

    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(DISTINCT task_id) FROM executions"
                " WHERE phase = 'end' AND task_id = ANY(%s)",
                (ids,),
            ).fetchone()[0]
            == len(ids)
        ),
        timeout=60,
        what=f"the new replicas to finish all {len(ids)} tasks",
    )
    twice = conn.execute(
        "SELECT task_id, count(*) FROM executions WHERE phase = 'end'"
        " GROUP BY task_id HAVING count(*) > 1"
    ).fetchall()
    assert twice == [], f"tasks that succeeded more than once: {twice[:10]}"
    dead = conn.execute(
        "SELECT to_jsonb(t) FROM slotd_tasks t WHERE attempt_count >= max_attempts"
    ).fetchall()
    assert dead == [], f"dead letters: {dead[:5]}"
    conn.close()


def test_the_previous_release_is_the_changelogs_newest(previous: Release) -> None:
    # The directory really holds the old code: its own version, not this checkout's.
    out = subprocess.run(
        [sys.executable, "-c", "import slotd; print(slotd.__version__, slotd.__file__)"],
        env=previous.env(),
        cwd=Path("/"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == previous.version and out[1].startswith(str(previous.tree)), out
