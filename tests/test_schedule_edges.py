"""Schedules at their edges (#25): overlap "skip" across a batch of fire times, a changed
expression, two versions of an application declaring one name, the thread's connection.
The statement path on a real database, then real `slotd run` replicas with real signals."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg

import slotd
from slotd.config import Settings
from slotd.repository import Repository
from slotd.supervisor.scheduler import Evaluator, ScheduleThread
from tests.daemon import Daemon, wait_for
from tests.test_schedules_daemon import replica, schedules_json

# Every insert of a schedule's task, with how many of that schedule's tasks were live right
# after it (the new one included): a live count only grows at an insert, so its maximum
# here is the most the schedule ever had live at once.
INSERTS = """
CREATE TABLE schedule_inserts (
    task_id bigint, key text, run_at timestamptz, payload jsonb, live int,
    at timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION record_schedule_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO schedule_inserts (task_id, key, run_at, payload, live)
    SELECT NEW.id, NEW.key, NEW.run_at, NEW.payload, count(*)
    FROM slotd_tasks t
    WHERE t.key LIKE split_part(NEW.key, ':', 1) || ':' || split_part(NEW.key, ':', 2) || ':%'
      AND t.attempt_count < t.max_attempts;
    RETURN NULL;
END $$;
CREATE TRIGGER record_schedule_insert AFTER INSERT ON slotd_tasks
FOR EACH ROW WHEN (NEW.key LIKE 'schedule:%') EXECUTE FUNCTION record_schedule_insert();
"""


def inserts(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """(run_at, payload, live, at) of every schedule insert, in insert order."""
    return conn.execute(
        "SELECT run_at, payload, live, at FROM schedule_inserts ORDER BY at"
    ).fetchall()


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]


def registry(**declared: Any) -> slotd.Registry:
    reg = slotd.Registry()
    reg.register("audit", lambda task, ctx: None, ceiling=timedelta(minutes=1))
    reg.schedule("tick", task_type="audit", **declared)
    return reg


def row(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    found = conn.execute(
        "SELECT expression, anchor_at, last_fire_at FROM slotd_schedules WHERE name = 'tick'"
    ).fetchone()
    assert found is not None
    return tuple(found)


# the statement path


def test_a_changed_expression_restarts_the_schedule_from_now_without_catch_up(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    # `0 3 * * *` -> `*/5 * * * *` at noon used to enqueue ~120 back-dated tasks with
    # catch_up="all": the old expression's last fire counted as downtime for the new one.
    daily = Evaluator(registry(every=timedelta(hours=1), catch_up="all").schedules, "v1", 20)
    daily.declare(repo)
    conn.execute("UPDATE slotd_schedules SET last_fire_at = now() - interval '50 minutes'")
    minutely = registry(every=timedelta(minutes=1), catch_up="all", overlap="allow")
    v2 = Evaluator(minutely.schedules, "v2", 20)
    v2.declare(repo)
    expression, anchor, last = row(conn)
    assert expression == "every 60s" and last is None
    assert v2.fire_due(repo, db_now(conn)) == []  # nothing back-dated: a new schedule
    v2.offset += 61
    (fired,) = v2.fire_due(repo, db_now(conn) + timedelta(seconds=v2.offset))
    assert 1 <= len(fired.task_ids) <= 2 and min(fired.fire_times) > anchor
    # A change that keeps the fire times (here the payload) keeps the schedule's place.
    same_times = registry(
        every=timedelta(minutes=1), catch_up="all", overlap="allow", payload={"v": 3}
    )
    v3 = Evaluator(same_times.schedules, "v3", 20)
    v3.declare(repo)
    assert row(conn)[1:] == (anchor, fired.fire_times[-1])


def test_the_newest_declaration_wins_and_the_older_one_never_fires(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    old = Evaluator(registry(every=timedelta(seconds=1), payload={"v": "a"}).schedules, "a", 20)
    new = Evaluator(registry(every=timedelta(seconds=2), payload={"v": "b"}).schedules, "b", 20)
    old.declare(repo)
    assert old.rows["tick"].ours
    new.declare(repo)  # its first declare is later: newer
    assert new.rows["tick"].ours and row(conn)[0] == "every 2s"
    # The old replica still believes the row is its own: its fire is refused by the
    # statement, which tells it the row holds another declaration now.
    old.offset = new.offset = 3
    assert old.fire_due(repo, db_now(conn) + timedelta(seconds=3)) == []
    assert not old.rows["tick"].ours
    old.declare(repo)  # and its declaring again does not take the row back
    assert not old.rows["tick"].ours and row(conn)[0] == "every 2s"
    (fired,) = new.fire_due(repo, db_now(conn) + timedelta(seconds=3))
    assert fired.task_ids
    payloads = conn.execute("SELECT DISTINCT payload FROM slotd_tasks").fetchall()
    assert payloads == [({"v": "b"},)]


def test_the_newest_live_declaration_takes_over_when_the_newer_ones_replicas_are_gone(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    old = Evaluator(registry(every=timedelta(seconds=1)).schedules, "a", 20)
    new = Evaluator(registry(every=timedelta(seconds=2)).schedules, "b", 20)
    old.declare(repo)
    new.declare(repo)
    old.declare(repo)
    assert not old.rows["tick"].ours
    repo.schedules_gone("b")  # the new version's replicas stopped (a rollback)
    old.declare(repo)
    assert old.rows["tick"].ours and row(conn)[0] == "every 1s"
    # ...and one whose declaration went stale (no heartbeat for a minute) counts as gone.
    new.declare(repo)  # newer: takes it back
    assert new.rows["tick"].ours
    conn.execute(
        "UPDATE slotd_schedule_declarations SET seen_at = now() - interval '2 minutes'"
        " WHERE replica_id = 'b'"
    )
    old.declare(repo)
    assert old.rows["tick"].ours and row(conn)[0] == "every 1s"


def test_a_row_an_older_release_wrote_is_taken_over_by_a_current_declaration(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    conn.execute(
        "INSERT INTO slotd_schedules (name, task_type, expression, timezone, catch_up)"
        " VALUES ('tick', 'audit', 'every 5s', 'UTC', 'latest')"
    )
    ev = Evaluator(registry(every=timedelta(seconds=1)).schedules, "r", 20)
    ev.declare(repo)
    assert ev.rows["tick"].ours and row(conn)[0] == "every 1s"
    # An older release rewriting the row's columns (it compares only those) is undone.
    conn.execute("UPDATE slotd_schedules SET expression = 'every 5s'")
    ev.declare(repo)
    assert ev.rows["tick"].ours and row(conn)[0] == "every 1s"


def test_the_schedule_thread_honours_slotd_prepare(db_url: str) -> None:
    reg = registry(every=timedelta(seconds=1))
    for prepare, threshold in (("off", None), ("on", 5)):
        settings = Settings(database_url=db_url, prepare=prepare)
        thread = ScheduleThread(reg.schedules, settings, db_url, "r")
        repo = thread._connection()
        try:
            assert repo.write.prepare_threshold == threshold
        finally:
            repo.write.close()


# real replicas


def test_a_stalled_replica_never_has_two_live_tasks_of_a_skip_schedule(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    qconn.execute(INSERTS)
    d = replica(db_url, [{"name": "tick", "every": 1}])
    daemons.append(d)
    d.start()
    wait_for(lambda: len(inserts(qconn)) >= 2, timeout=60, what="two fires before the stall")
    stopped = [d.pid, *(p.pid for p in d.tree())]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(5)  # the stall itself (a long GC, a slow disk): what the test is about
    resumed_at = db_now(qconn)
    for pid in stopped:
        os.kill(pid, signal.SIGCONT)
    # The batch of late fire times folds into one task (or into the previous task, when
    # the stall caught it still pending).
    d.wait_line(r"folded into (one|its previous) task", timeout=60)
    wait_for(
        lambda: sum(1 for r in inserts(qconn) if r[0] > resumed_at) >= 3,
        timeout=60,
        what="three fires after the stall",
    )
    d.signal(signal.SIGTERM)
    assert d.wait(60) == 0
    seen = inserts(qconn)
    assert max(live for _, _, live, _ in seen) == 1, seen
    # The one task for the stall's batch is its most recent fire time, not a stale one.
    first_after = next(r for r in seen if r[3] >= resumed_at)
    assert first_after[0] > resumed_at - timedelta(seconds=1.5), (first_after, resumed_at)


def test_an_expression_change_enqueues_nothing_back_dated(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    qconn.execute(INSERTS)
    v1 = replica(db_url, [{"name": "tick", "every": 3600, "catch_up": "all"}])
    daemons.append(v1)
    v1.start()
    wait_for(lambda: qconn.execute("SELECT 1 FROM slotd_schedules").fetchone(), what="the row")
    v1.signal(signal.SIGTERM)
    assert v1.wait(60) == 0
    # It last fired an hour ago: to the new expression that used to look like downtime.
    qconn.execute("UPDATE slotd_schedules SET last_fire_at = now() - interval '1 hour'")
    started = db_now(qconn)
    v2 = replica(db_url, [{"name": "tick", "every": 1, "catch_up": "all", "overlap": "allow"}])
    daemons.append(v2)
    v2.start()
    wait_for(lambda: len(inserts(qconn)) >= 3, timeout=60, what="three fires of the new one")
    v2.signal(signal.SIGTERM)
    assert v2.wait(60) == 0
    seen = inserts(qconn)
    assert min(r[0] for r in seen) > started, seen
    assert len(seen) < 30  # each fire time once, from now: not an hour's worth


def test_two_versions_during_a_rollout_do_not_both_fire(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    qconn.execute(INSERTS)

    def version(v: str, every: int) -> list[dict[str, Any]]:
        return [{"name": "tick", "every": every, "overlap": "allow", "payload": {"v": v}}]

    old = replica(db_url, version("a", 1))
    daemons.append(old)
    old.start()
    wait_for(lambda: len(inserts(qconn)) >= 2, timeout=60, what="the old version firing")
    new = replica(db_url, version("b", 2))
    daemons.append(new)
    new.start()
    old.wait_line(r"newer declaration \(every 2s\) is in force", timeout=60)

    def of(v: str) -> list[tuple[Any, ...]]:
        return [r for r in inserts(qconn) if r[1] == {"v": v}]

    wait_for(lambda: len(of("b")) >= 3, timeout=60, what="three fires of the new version")
    assert len(schedules_json(db_url)[0]["declared_by"]) == 2  # both still declare it
    for d in (new, old):
        d.signal(signal.SIGTERM)
        assert d.wait(60) == 0
    a, b = of("a"), of("b")
    assert max(r[3] for r in a) < min(r[3] for r in b), json.dumps(
        [(str(r[0]), r[1]["v"]) for r in inserts(qconn)]
    )
    assert all(r[0].second % 2 == 0 for r in b)  # the new expression's fire times only
    anchor = row(qconn)[1]
    assert max(r[0] for r in a) <= anchor < min(r[0] for r in b)
