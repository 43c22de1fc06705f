"""Runtime schedules (#40): slotd.put_schedule / delete_schedule in the caller's
transaction and `slotd schedules add|delete`, beside schedules declared in code (the two
never overwrite each other), fired by every replica's runtime-schedule thread: across two
real `slotd run` replicas each fire time becomes one task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.producer.schedules import ScheduleNameTaken
from slotd.repository import Repository
from slotd.schedule import build
from tests.daemon import ROOT, Daemon, wait_for

APP = "tests.apps.typed:registry"


def _fires(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """(fire time, key) of every tick task that ran, from its kept result."""
    rows = conn.execute("SELECT value FROM slotd_results ORDER BY task_id").fetchall()
    return [(r[0]["fire"], r[0]["key"]) for r in rows if "fire" in (r[0] or {})]


def test_put_and_delete_in_the_callers_transaction(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    with psycopg.connect(db_url) as tx:
        assert slotd.put_schedule(tx, "nightly", task_type="audit", cron="0 3 * * *")
        tx.rollback()
    assert conn.execute("SELECT count(*) FROM slotd_runtime_schedules").fetchone() == (0,)
    assert slotd.put_schedule(
        conn,
        "nightly",
        task_type="audit",
        cron="0 3 * * *",
        timezone="Europe/Berlin",
        payload={"scope": "all"},
    )
    row = conn.execute(
        "SELECT expression, timezone, payload, next_fire_at FROM slotd_runtime_schedules"
    ).fetchone()
    assert row[:3] == ("0 3 * * *", "Europe/Berlin", {"scope": "all"})
    assert (
        row[3]
        .astimezone(
            build(
                "x",
                task_type="x",
                cron="0 3 * * *",
                every=None,
                payload=None,
                timezone="Europe/Berlin",
                catch_up="latest",
                overlap="skip",
            ).zone
        )
        .hour
        == 3
    )
    # replaced: same fire times keep their next fire; the payload changes
    assert not slotd.put_schedule(
        conn, "nightly", task_type="audit", cron="0 3 * * *", timezone="Europe/Berlin"
    )
    assert conn.execute("SELECT next_fire_at, payload FROM slotd_runtime_schedules").fetchone() == (
        row[3],
        {},
    )
    with pytest.raises(ValueError, match=r"give exactly one of cron= or every="):
        slotd.put_schedule(conn, "bad", task_type="audit")
    with pytest.raises(ValueError, match=r"invalid schedule name"):
        slotd.put_schedule(conn, "Bad Name", task_type="audit", every=timedelta(minutes=1))
    assert slotd.delete_schedule(conn, "nightly")
    assert not slotd.delete_schedule(conn, "nightly")


def test_a_name_declared_in_code_is_refused(
    repo: Repository, conn: psycopg.Connection[Any]
) -> None:
    declared = build(
        "sweep",
        task_type="rebuild",
        cron=None,
        every=timedelta(minutes=5),
        payload=None,
        timezone="UTC",
        catch_up="latest",
        overlap="skip",
    )
    repo.declare_schedules("replica-1", "host", 1, [declared])
    with pytest.raises(ScheduleNameTaken, match=r"schedule 'sweep' is declared in code"):
        slotd.put_schedule(conn, "sweep", task_type="rebuild", every=timedelta(minutes=1))
    # and a runtime schedule never touches the declared one's row
    slotd.put_schedule(conn, "sweep-2", task_type="rebuild", every=timedelta(minutes=1))
    assert conn.execute("SELECT name FROM slotd_schedules").fetchall() == [("sweep",)]


def test_two_replicas_fire_each_fire_time_once(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    for _ in range(2):
        daemons.append(Daemon(db_url, app=APP).start())
    slotd.put_schedule(
        conn, "tick", task_type="typed.tick", every=timedelta(seconds=1), payload={"who": "runtime"}
    )
    wait_for(lambda: len(_fires(conn)) >= 6, timeout=60, what="six fires")
    # both replicas' schedule threads were there to race for each fire time
    firing = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = 'slotd runtime schedules' AND datname = current_database()"
    ).fetchone()[0]
    assert firing == 2
    assert slotd.delete_schedule(conn, "tick")
    fires = _fires(conn)
    times = [datetime.fromisoformat(f) for f, _ in fires]
    assert len(set(times)) == len(times), fires  # each fire time once
    assert all(k.startswith("schedule:runtime:tick:") for _, k in fires)
    steps = {
        (b - a).total_seconds() for a, b in zip(sorted(times), sorted(times)[1:], strict=False)
    }
    assert steps == {1.0}, sorted(times)  # and none missed between the first and the last
    last = len(fires)
    # deleted: no more fires (a fire in flight at the delete has been counted already)
    before = conn.execute("SELECT max(task_id) FROM slotd_results").fetchone()[0]
    slotd.enqueue(conn, "typed.plain", {"marker": 1})  # a task both replicas would run
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM slotd_results WHERE task_id > %s", (before,)
            ).fetchone()[0]
            >= 1
        ),
        what="the marker",
    )
    assert len(_fires(conn)) <= last + 1


def test_schedules_add_and_delete_on_the_command_line(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    env = {**os.environ, "SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "slotd", "schedules", *args],
            env=env,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )

    added = run("add", "hourly", "--type", "report", "--every", "1h", "--payload", '{"a": 1}')
    assert added.returncode == 0 and "added runtime schedule hourly" in added.stdout, added.stderr
    listed = json.loads(run("--json").stdout)
    assert [(r["name"], r["kind"], r["expression"]) for r in listed] == [
        ("hourly", "runtime", "every 3600s")
    ]
    assert "RUNTIME" in run().stdout
    bad = run("add", "x", "--type", "report", "--every", "soon")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert run("delete", "hourly").returncode == 0
    again = run("delete", "hourly")
    assert again.returncode == 1 and "no runtime schedule named 'hourly'" in again.stderr


def test_a_schedule_added_on_the_command_line_fires_at_once_on_an_idle_replica(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """An idle replica's schedule thread looks twice a minute (an idle replica's cost is
    counted in statements), yet a schedule put meanwhile fires its first time at once: the
    put's control notification reaches the supervisor's LISTEN, which pokes the thread."""
    daemons.append(Daemon(db_url, app=APP).start())

    def quiet_for() -> float:
        """Seconds since the schedule thread's last statement."""
        row = conn.execute(
            "SELECT extract(epoch FROM now() - query_start)::float8 FROM pg_stat_activity"
            " WHERE application_name = 'slotd runtime schedules'"
            " AND datname = current_database()"
        ).fetchone()
        conn.commit()  # now() is the transaction's: a new one per look
        return -1.0 if row is None or row[0] is None else float(row[0])

    # At the one-second poll this never holds; at the idle poll it does within 30 s.
    wait_for(lambda: quiet_for() > 3.0, timeout=45, what="the schedule thread idle for 3 s")
    env = {**os.environ, "SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    added = subprocess.run(
        [sys.executable, "-m", "slotd", "schedules", "add", "tick", "--type", "typed.tick",
         "--every", "1s", "--payload", '{"who": "cli"}'],
        env=env, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    # Without the poke the thread sleeps up to 27 s more; told, it fires within a second.
    wait_for(lambda: len(_fires(conn)) >= 1, timeout=8, what="the first fire, told at once")
    assert all(k.startswith("schedule:runtime:tick:") for _, k in _fires(conn))
    gone = subprocess.run(
        [sys.executable, "-m", "slotd", "schedules", "delete", "tick"],
        env=env, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert gone.returncode == 0, gone.stderr
