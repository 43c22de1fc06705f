"""The fire statement on a real database: compare-and-set, one transaction, overlap rule."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.repository import Repository
from slotd.supervisor.scheduler import Evaluator


def app(overlap: str = "skip", period: timedelta = timedelta(seconds=1)) -> slotd.Registry:
    reg = slotd.Registry()
    reg.register("audit", lambda task, ctx: None, ceiling=timedelta(minutes=1))
    reg.schedule("tick", task_type="audit", every=period, payload={"n": 1}, overlap=overlap)
    return reg


def rewind(conn: psycopg.Connection[Any], seconds: float) -> None:
    """The schedule row as if it had been created (and last fired) `seconds` ago."""
    conn.execute(
        "UPDATE slotd_schedules SET anchor_at = anchor_at - make_interval(secs => %s),"
        " last_fire_at = last_fire_at - make_interval(secs => %s)",
        (seconds, seconds),
    )


def tasks(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT task_type, key, run_at, payload FROM slotd_tasks ORDER BY run_at"
    ).fetchall()


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]


def test_a_fire_enqueues_the_fire_time_as_run_at_with_the_schedule_key(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    ev = Evaluator(app().schedules, "r1", max_attempts=20)
    ev.declare(repo)
    # A new schedule never back-fills: at the row's own creation nothing is due (a second
    # read of now() could cross the next whole second of this one-second schedule).
    (anchor,) = conn.execute("SELECT anchor_at FROM slotd_schedules").fetchone()  # type: ignore[misc]
    assert ev.fire_due(repo, anchor) == []
    rewind(conn, 1.5)
    ev.declare(repo)
    fired = ev.fire_due(repo, db_now(conn))
    assert len(fired) == 1 and len(fired[0].task_ids) >= 1
    rows = tasks(conn)
    fire_times = fired[0].fire_times
    assert [r[2] for r in rows] == fire_times[-1:]  # overlap "skip": a batch is one task
    for task_type, key, run_at, payload in rows:
        assert run_at.microsecond == 0  # a whole second: the fire time, not the write time
        assert task_type == "audit" and payload == {"n": 1}
        assert key == f"schedule:tick:{run_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S}.000000Z"
    last = conn.execute("SELECT last_fire_at, last_task_id FROM slotd_schedules").fetchone()
    assert last == (fire_times[-1], max(fired[0].task_ids))


def test_two_replicas_planning_the_same_fire_time_enqueue_it_once(db_url: str) -> None:
    # Each on its own connection, released together: the row lock and the compare-and-set
    # decide, never the replicas.
    reg = app(overlap="allow")
    conns = [psycopg.connect(db_url, autocommit=True) for _ in range(4)]
    try:
        evs = [Evaluator(reg.schedules, f"r{i}", 20) for i in range(4)]
        for ev, c in zip(evs, conns, strict=True):
            ev.declare(Repository(c))
        rewind(conns[0], 5)
        for ev, c in zip(evs, conns, strict=True):
            ev.declare(Repository(c))  # all four plan from the same last fire
        now = db_now(conns[0])
        gate = threading.Barrier(4)
        results: list[Any] = [None] * 4

        def fire(i: int) -> None:
            gate.wait()
            results[i] = evs[i].fire_due(Repository(conns[i]), now)

        threads = [threading.Thread(target=fire, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        winners = [r for r in results if r]
        assert len(winners) == 1, results
        rows = tasks(conns[0])
        assert len(rows) == len({r[2] for r in rows}) == len(winners[0][0].task_ids) >= 4
        # The losers learnt the row's new state and have nothing left to fire.
        assert all(not ev.plans(now) for ev in evs)
    finally:
        for c in conns:
            c.close()


def test_a_stale_plan_is_refused_and_replanned_from_the_row(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = app(overlap="allow")
    fresh, stale = Evaluator(reg.schedules, "a", 20), Evaluator(reg.schedules, "b", 20)
    fresh.declare(repo)
    rewind(conn, 3)
    fresh.declare(repo)
    stale.declare(repo)
    # One instant for both: with a one-second period, a second read of now() may cross a
    # fire boundary, and a fire due then is rightly fired (CI met that once, 05:31:30).
    now = db_now(conn)
    first = fresh.fire_due(repo, now)
    before = tasks(conn)
    assert first and before
    # `stale` still believes the row's old last fire; its compare-and-set must fail, and
    # once it has re-read the row there is nothing due at the same instant.
    assert stale.fire_due(repo, now) == []
    assert tasks(conn) == before


def test_a_fire_time_in_the_databases_future_is_refused(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    ev = Evaluator(app().schedules, "r", 20)
    ev.declare(repo)
    ahead = db_now(conn) + timedelta(seconds=30)  # a replica whose clock runs ahead
    assert ev.fire_due(repo, ahead) == []
    assert tasks(conn) == []
    assert conn.execute("SELECT last_fire_at FROM slotd_schedules").fetchone() == (None,)


def test_an_advance_and_its_tasks_commit_or_roll_back_together(db_url: str) -> None:
    with psycopg.connect(db_url) as tx, psycopg.connect(db_url, autocommit=True) as other:
        ev = Evaluator(app().schedules, "r", 20)
        ev.declare(Repository(other))
        rewind(other, 2)
        ev.declare(Repository(other))
        with tx.transaction(force_rollback=True):
            fired = ev.fire_due(Repository(tx), db_now(tx))
            assert fired and fired[0].task_ids
        assert tasks(other) == []
        assert other.execute("SELECT last_fire_at FROM slotd_schedules").fetchone() == (None,)


def test_overlap_skip_folds_a_fire_into_the_previous_task_while_it_is_live(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    ev = Evaluator(app(overlap="skip", period=timedelta(minutes=1)).schedules, "r", 20)
    ev.declare(repo)
    ev.offset += 60  # a minute passes (the evaluator's clock runs ahead of the database's)
    (first,) = ev.fire_due(repo, db_now(conn) + timedelta(seconds=ev.offset))
    assert len(first.task_ids) == 1
    # The previous run is still live (pending here; leased or backing off counts too).
    ev.offset += 60
    (second,) = ev.fire_due(repo, db_now(conn) + timedelta(seconds=ev.offset))
    assert second.task_ids == [] and second.folded == 1
    assert len(tasks(conn)) == 1
    # Once it finished, the next fire time enqueues again.
    conn.execute("DELETE FROM slotd_tasks")
    ev.offset += 60
    (third,) = ev.fire_due(repo, db_now(conn) + timedelta(seconds=ev.offset))
    assert len(third.task_ids) == 1


def test_overlap_allow_enqueues_every_fire_time(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    ev = Evaluator(app(overlap="allow", period=timedelta(minutes=1)).schedules, "r", 20)
    ev.declare(repo)
    for _ in range(2):
        ev.offset += 60
        ev.fire_due(repo, db_now(conn) + timedelta(seconds=ev.offset))
    assert len(tasks(conn)) == 2


def test_a_pruned_row_is_declared_again(conn: psycopg.Connection[Any], repo: Repository) -> None:
    ev = Evaluator(app().schedules, "r", 20)
    ev.declare(repo)
    rewind(conn, 3)
    ev.declare(repo)
    conn.execute("DELETE FROM slotd_schedules")
    assert ev.fire_due(repo, db_now(conn)) == []
    assert not ev.complete
    ev.declare(repo)
    assert ev.complete


@pytest.mark.parametrize(
    ("policy", "overlap", "enqueued"),
    [("skip", "allow", 0), ("latest", "allow", 1), ("all", "allow", 5), ("all", "skip", 1)],
)
def test_catch_up_is_applied_by_the_statement_path(
    conn: psycopg.Connection[Any], repo: Repository, policy: str, overlap: str, enqueued: int
) -> None:
    reg = slotd.Registry()
    reg.register("audit", lambda task, ctx: None, ceiling=timedelta(minutes=1))
    reg.schedule(
        "hourly", task_type="audit", every=timedelta(hours=1), catch_up=policy, overlap=overlap
    )
    ev = Evaluator(reg.schedules, "r", 20)
    ev.declare(repo)
    rewind(conn, 5 * 3600)  # the fleet was stopped for five hours
    ev.declare(repo)
    fired = ev.fire_due(repo, db_now(conn))
    assert len(tasks(conn)) == enqueued, fired


def test_a_day_of_missed_fire_times_under_skip_is_one_live_task_for_the_latest(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    # catch_up="all" of a 5-minute schedule after a day down plans 288 fire times; under
    # overlap "skip" they fold into one task, for the most recent, and the row moves past
    # all of them.
    reg = slotd.Registry()
    reg.register("audit", lambda task, ctx: None, ceiling=timedelta(minutes=1))
    reg.schedule("sweep", task_type="audit", every=timedelta(minutes=5), catch_up="all")
    ev = Evaluator(reg.schedules, "r", 20)
    ev.declare(repo)
    rewind(conn, 24 * 3600)
    ev.declare(repo)
    (fired,) = ev.fire_due(repo, db_now(conn))
    assert len(fired.fire_times) >= 287 and fired.task_ids and len(fired.task_ids) == 1
    rows = tasks(conn)
    assert [r[2] for r in rows] == [fired.fire_times[-1]]
    last = conn.execute("SELECT last_fire_at FROM slotd_schedules").fetchone()
    assert last == (fired.fire_times[-1],)
    # Its task still live, the next fire time folds into it.
    ev.offset += 300
    (second,) = ev.fire_due(repo, db_now(conn) + timedelta(seconds=ev.offset))
    assert second.task_ids == [] and len(tasks(conn)) == 1


def test_metrics_show_the_last_fire_and_a_lag_that_grows_while_nothing_fires(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from slotd.ops.metrics import Metrics
    from slotd.supervisor.scheduler import ScheduleCollector

    ev = Evaluator(app(period=timedelta(minutes=1)).schedules, "r", 20)
    metrics = Metrics(1, ["audit"], None)
    metrics.registry.register(ScheduleCollector(ev))

    def gauges() -> dict[str, float]:
        found = {}
        for family in text_string_to_metric_families(metrics.render().decode()):
            for sample in family.samples:
                if sample.name.startswith("slotd_schedule_"):
                    assert sample.labels == {"schedule": "tick"}
                    found[sample.name] = sample.value
        return found

    assert gauges() == {}  # nothing known before the first statement
    ev.declare(repo)
    ev.offset += 60
    (fired,) = ev.fire_due(repo, db_now(conn) + timedelta(seconds=ev.offset))
    seen = gauges()
    assert seen["slotd_schedule_last_fire_timestamp_seconds"] == fired.fire_times[-1].timestamp()
    assert seen["slotd_schedule_lag_seconds"] < 5
    assert seen["slotd_schedule_period_seconds"] == 60
    ev._mono_at -= 180  # three minutes pass and this replica runs no statement
    assert gauges()["slotd_schedule_lag_seconds"] > 100
