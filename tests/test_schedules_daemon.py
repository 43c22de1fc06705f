"""Schedules as users run them: real `slotd run` replicas sharing one database, no leader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

import psycopg

from tests.daemon import ROOT, Daemon, wait_for

APP = "tests.apps.schedules:registry"


def replica(db_url: str, schedules: list[dict[str, Any]], **env: str) -> Daemon:
    return Daemon(
        db_url, slots=1, app=APP, env={"SLOTD_TEST_SCHEDULES": json.dumps(schedules), **env}
    )


def fire_times(conn: psycopg.Connection[Any]) -> dict[datetime, set[int]]:
    """Every task the schedule produced, by its run_at: the ones that ran (their handler
    recorded the run_at it saw) and the ones still in the queue."""
    seen: dict[datetime, set[int]] = {}
    ran = conn.execute("SELECT DISTINCT task_id, note FROM executions WHERE phase = 'start'")
    for task_id, note in ran.fetchall():
        seen.setdefault(datetime.fromisoformat(note), set()).add(task_id)
    queued = conn.execute("SELECT id, run_at FROM slotd_tasks WHERE key LIKE 'schedule:%'")
    for task_id, run_at in queued.fetchall():
        seen.setdefault(run_at, set()).add(task_id)
    return seen


def schedules_json(db_url: str) -> list[dict[str, Any]]:
    env = {**os.environ, "SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "slotd", "schedules", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_two_replicas_enqueue_each_fire_time_exactly_once_even_when_one_is_killed(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    tick = [{"name": "tick", "every": 1, "overlap": "allow"}]
    a, b = replica(db_url, tick), replica(db_url, tick)
    daemons += [a, b]
    a.start(), b.start()

    def fired() -> int:
        return len(fire_times(qconn))

    wait_for(lambda: fired() >= 5, timeout=60, what="five fire times with both replicas")
    # Both replicas evaluate the schedule: each has declared it.
    assert len(schedules_json(db_url)[0]["declared_by"]) == 2
    os.killpg(a.pid, signal.SIGKILL)  # the whole replica, mid-whatever it was doing
    a.wait(30)
    after_kill = fired()
    wait_for(lambda: fired() >= after_kill + 5, timeout=60, what="five more after the kill")
    b.signal(signal.SIGTERM)
    assert b.wait(60) == 0

    seen = fire_times(qconn)
    times = sorted(seen)
    assert all(len(ids) == 1 for ids in seen.values()), {
        t: i for t, i in seen.items() if len(i) > 1
    }
    every_second = [times[0] + timedelta(seconds=n) for n in range(len(times))]
    assert times == every_second  # no gap, no duplicate, whole seconds: the fire times
    assert len(times) >= 10
    row = qconn.execute("SELECT last_fire_at FROM slotd_schedules WHERE name = 'tick'").fetchone()
    assert row is not None and row[0] == times[-1]


def _stop_fleet_for_five_hours(conn: psycopg.Connection[Any]) -> None:
    """What a fleet stopped for five hours leaves behind: rows whose last fire is five
    hourly fire times ago. Done while no replica runs, then the fleet starts again."""
    wait_for(
        lambda: (
            conn.execute(
                "SELECT extract(minute FROM now()) * 60 + extract(second FROM now())"
            ).fetchone()[0]  # type: ignore[index]
            > 30
        ),
        timeout=40,
        what="an instant well past the hour (a fire time younger than the grace is late)",
    )
    conn.execute(
        "UPDATE slotd_schedules SET last_fire_at = date_trunc('hour', now()) - interval '5 hours',"
        " anchor_at = anchor_at - interval '6 hours'"
    )


def test_a_stopped_fleet_catches_up_as_each_policy_says(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # overlap "allow": under "skip" (the default) a catch-up folds into one task.
    hourly = [
        {"name": f"hourly-{policy}", "every": 3600, "catch_up": policy, "overlap": "allow"}
        for policy in ("skip", "latest", "all")
    ]
    first = replica(db_url, hourly)
    daemons.append(first)
    first.start()
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0
    assert qconn.execute("SELECT count(*) FROM slotd_schedules").fetchone() == (3,)
    _stop_fleet_for_five_hours(qconn)

    again = replica(db_url, hourly)
    daemons.append(again)
    again.start()
    caught_up = (
        "SELECT count(*) FROM slotd_schedules WHERE last_fire_at = date_trunc('hour', now())"
    )
    wait_for(lambda: qconn.execute(caught_up).fetchone() == (3,), what="every schedule caught up")
    wait_for(lambda: not qconn.execute("SELECT 1 FROM slotd_tasks").fetchall(), what="drained")
    again.signal(signal.SIGTERM)
    assert again.wait(60) == 0
    runs = qconn.execute("SELECT note FROM executions WHERE phase = 'end' ORDER BY note").fetchall()
    now = qconn.execute("SELECT date_trunc('hour', now())").fetchone()[0]  # type: ignore[index]
    hours = [now - timedelta(hours=h) for h in (4, 3, 2, 1, 0)]
    # skip: nothing; latest: the most recent hour; all: each missed hour, oldest first.
    assert [datetime.fromisoformat(n) for (n,) in runs] == sorted([*hours, now])


def test_a_fire_while_the_previous_run_is_live_folds_into_it(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # Every second, a handler taking 2.5 s, overlap "skip" (the default): the schedule
    # never has two live tasks, and the fires in between enqueue nothing.
    slow = replica(db_url, [{"name": "slow", "every": 1}], SLOTD_TEST_HANDLER_SECONDS="2.5")
    daemons.append(slow)
    slow.start()
    live = "SELECT count(*) FROM slotd_tasks WHERE key LIKE 'schedule:slow:%'"
    most = 0

    def three_runs() -> bool:
        nonlocal most
        most = max(most, qconn.execute(live).fetchone()[0])  # type: ignore[index]
        return (
            qconn.execute("SELECT count(*) FROM executions WHERE phase = 'end'").fetchone()[0] >= 3
        )  # type: ignore[index]

    wait_for(three_runs, timeout=60, what="three runs of the slow schedule")
    slow.wait_line(r"folded into its previous task")
    slow.signal(signal.SIGTERM)
    assert slow.wait(60) == 0
    assert most == 1
    spans = qconn.execute(
        "SELECT task_id, min(at), max(at) FROM executions GROUP BY task_id ORDER BY 2"
    ).fetchall()
    for (_, _, end), (_, start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end  # runs never overlap
    starts = [s for _, s, _ in spans]
    assert starts[-1] - starts[0] >= timedelta(seconds=2 * len(starts[1:]))


def test_slotd_schedules_json_shows_last_and_next_fire_and_orphans(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    d = replica(
        db_url,
        [
            {"name": "tick", "every": 1},
            {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin"},
        ],
    )
    daemons.append(d)
    d.start()
    wait_for(lambda: qconn.execute("SELECT 1 FROM executions").fetchall(), what="a first run")
    by_name = {s["name"]: s for s in schedules_json(db_url)}
    tick, nightly = by_name["tick"], by_name["nightly"]
    assert tick["expression"] == "every 1s" and nightly["expression"] == "0 3 * * *"
    last, upcoming = (datetime.fromisoformat(tick[k]) for k in ("last_fire", "next_fire"))
    assert upcoming - last == timedelta(seconds=1)
    assert nightly["last_fire"] is None and nightly["timezone"] == "Europe/Berlin"
    berlin = datetime.fromisoformat(nightly["next_fire"]).astimezone(
        __import__("zoneinfo").ZoneInfo("Europe/Berlin")
    )
    assert (berlin.hour, berlin.minute) == (3, 0)
    assert [r["pid"] for r in tick["declared_by"]] == [d.pid]
    assert not tick["orphaned"] and tick["lag_seconds"] < 5

    d.signal(signal.SIGTERM)
    assert d.wait(60) == 0
    assert all(s["orphaned"] and not s["declared_by"] for s in schedules_json(db_url))
    env = {**os.environ, "SLOTD_DATABASE_URL": db_url}
    pruned = subprocess.run(
        [sys.executable, "-m", "slotd", "schedules", "--prune"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pruned.returncode == 0 and "pruned 2 orphaned schedules" in pruned.stdout
    assert schedules_json(db_url) == []


def test_a_replica_without_schedules_opens_no_connection_and_declares_nothing(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    sessions = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s"
    )
    plain = Daemon(db_url, slots=1)  # tests.apps.runtime: handlers only
    daemons.append(plain)
    plain.start()
    assert qconn.execute(sessions, ("slotd schedules",)).fetchone() == (0,)
    assert qconn.execute("SELECT count(*) FROM slotd_schedule_declarations").fetchone() == (0,)
    with_one = replica(db_url, [{"name": "tick", "every": 60}])
    daemons.append(with_one)
    with_one.start()
    wait_for(
        lambda: qconn.execute(sessions, ("slotd schedules",)).fetchone() == (1,),
        what="the schedule thread's own connection",
    )
    assert "supervisor evaluating 1 schedule(s): tick" in "\n".join(with_one.lines)
