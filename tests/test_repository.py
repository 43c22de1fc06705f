"""The queue protocol on a real PostgreSQL: claims, fences, wakes, backoff, dead letters."""

from __future__ import annotations

import multiprocessing
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import slotd
from slotd.errors import LeaseLost
from slotd.registry import Registry
from slotd.repository import (
    Repository,
    enqueue_params,
    limit_params,
    migrate,
    migrations,
    statements,
)

MINUTE = timedelta(minutes=1)


def registry_of(*names: str, ceiling: timedelta = MINUTE) -> Registry:
    reg = Registry()
    for name in names:
        reg.register(name, lambda task, ctx: None, ceiling=ceiling)
    return reg


def row(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any] | None:
    cur = conn.execute("SELECT * FROM slotd_tasks WHERE id = %s", (task_id,))
    found = cur.fetchone()
    if found is None:
        return None
    return dict(zip([c.name for c in cur.description], found, strict=True))


def claim_one(repo: Repository, reg: Registry) -> slotd.repository.Claimed:
    claimed = repo.claim(repo.discover(reg.types), reg)
    assert claimed is not None
    return claimed


def test_migrate_twice_is_a_noop(conn: psycopg.Connection[Any]) -> None:
    assert migrate(conn) == []
    versions = conn.execute("SELECT version FROM slotd_schema_migrations").fetchall()
    assert versions == [(version,) for version, _, _ in migrations()]


def test_migrate_from_two_hosts_at_once(pg_server: Any) -> None:
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS fresh_migrate")
        admin.execute("CREATE DATABASE fresh_migrate")
    url = pg_server.url("fresh_migrate")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_migrate_url, [url, url])
    assert sorted(len(r) for r in results) == [0, len(migrations())]


def _migrate_url(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return migrate(conn)


def test_claim_leases_exactly_one_row_under_nested_loop(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("plain")
    slotd.enqueue_many(conn, [("plain", {"n": n}) for n in range(50)])
    conn.execute("SET enable_hashjoin = off")
    conn.execute("SET enable_mergejoin = off")
    conn.execute("SET enable_material = off")
    claimed = repo.claim(repo.discover(reg.types, limit=50), reg)
    assert claimed is not None
    leased = conn.execute("SELECT count(*) FROM slotd_tasks WHERE lease_token IS NOT NULL")
    assert leased.fetchone() == (1,)
    assert claimed.attempt == 1
    # The lease is the type's ceiling plus the margin, stamped by the database.
    assert claimed.lease_expires_at - claimed.claimed_at == MINUTE + timedelta(seconds=30)


def _claim_all(url: str) -> list[int]:
    reg = registry_of("plain")
    got = []
    with psycopg.connect(url, autocommit=True) as conn:
        repo = Repository(conn)
        while True:
            ids = repo.discover(reg.types)
            if not ids:
                return got
            claimed = repo.claim(ids, reg)
            if claimed is not None:
                got.append(claimed.id)


def test_eight_processes_lease_every_row_exactly_once(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    ids = slotd.enqueue_many(conn, [("plain", {"n": n}) for n in range(1000)])
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        results = pool.map(_claim_all, [db_url] * 8)
    claimed = [task_id for got in results for task_id in got]
    assert sorted(claimed) == sorted(ids)
    assert conn.execute(
        "SELECT max(attempt_count), min(attempt_count) FROM slotd_tasks"
    ).fetchone() == (1, 1)


def test_stale_token_writes_nothing_for_each_settlement(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("plain")
    task_id = slotd.enqueue(conn, "plain", {"v": 1})
    claimed = claim_one(repo, reg)
    stale = uuid.uuid4()
    before = row(conn, task_id)
    with pytest.raises(LeaseLost):
        repo.dequeue(task_id, stale)
    with pytest.raises(LeaseLost):
        repo.record_failure(task_id, stale, "boom")
    assert repo.advance_cursor(task_id, stale, {"v": 2}) is False
    assert repo.release(task_id, stale, "shutdown") is None
    assert row(conn, task_id) == before
    # The real token still owns it.
    assert repo.release(task_id, claimed.token, "shutdown") is False  # ours, not dead


def test_dequeue_with_empty_token_matches_only_an_unleased_row(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("plain")
    inline = slotd.enqueue(conn, "plain")
    repo.dequeue(inline, None)
    assert row(conn, inline) is None
    leased = slotd.enqueue(conn, "plain")
    claim_one(repo, reg)
    with pytest.raises(LeaseLost):
        repo.dequeue(leased, None)


def test_rolled_back_enqueue_leaves_no_row_and_no_notification(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url) as producer:
        listener.execute("LISTEN slotd_wake")
        slotd.enqueue(producer, "plain", {"x": 1})
        producer.rollback()
        assert producer.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,)
        producer.rollback()
        assert list(listener.notifies(timeout=0.3)) == []


def test_committed_enqueue_of_1000_rows_sends_one_notification(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url) as producer:
        listener.execute("LISTEN slotd_wake")
        slotd.enqueue_many(producer, [("plain", {"n": n}) for n in range(1000)])
        assert list(listener.notifies(timeout=0.2)) == []  # not before commit
        producer.commit()
        got = list(listener.notifies(timeout=0.5))
        assert [n.channel for n in got] == ["slotd_wake"]
        slotd.enqueue(producer, "plain", {"n": "single"})
        producer.commit()
        assert len(list(listener.notifies(timeout=0.5))) == 1


def test_a_delayed_enqueue_wakes_a_slot_whose_discovery_says_when_it_is_due(
    db_url: str, repo: Repository
) -> None:
    """No notification announces a row becoming due, so the enqueue of a delayed row wakes
    a slot at once: its discovery finds nothing due yet, and says in how many seconds the
    type's next row is (the supervisor's timer for it, slotd.supervisor.wake)."""
    with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url) as producer:
        listener.execute("LISTEN slotd_wake")
        slotd.enqueue(producer, "plain", delay=timedelta(minutes=30))
        slotd.enqueue(producer, "plain", delay=timedelta(minutes=40))
        assert list(listener.notifies(timeout=0.2)) == []  # not before commit
        producer.commit()
        assert len(list(listener.notifies(timeout=0.5))) == 1  # one for the transaction
    assert repo.discover(["plain", "other"]) == []
    assert repo.wake_in_s is not None and 29 * 60 < repo.wake_in_s <= 30 * 60
    assert repo.sweep_in_s is None  # nothing expires
    expiring = slotd.enqueue(repo.write, "other", expires_in=timedelta(seconds=90))
    assert repo.discover(["plain"]) == [] and repo.sweep_in_s is not None
    assert 80 < repo.sweep_in_s <= 90  # the expiry sweep's cue: any type
    repo.write.execute(
        "UPDATE slotd_tasks SET expires_at = now() - interval '1 s' WHERE id = %s", (expiring,)
    )
    repo.discover(["plain"])
    assert repo.sweep_in_s is not None and repo.sweep_in_s < 0  # past: sweep now


def test_backoff_doubles_from_15s_and_caps_at_10m(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("flaky")
    task_id = slotd.enqueue(conn, "flaky")
    delays = []
    for _ in range(8):
        conn.execute(
            "UPDATE slotd_tasks SET run_at = now(), order_at = now() WHERE id = %s", (task_id,)
        )
        claimed = claim_one(repo, reg)
        repo.record_failure(task_id, claimed.token, "boom")
        seconds = conn.execute(
            "SELECT extract(epoch FROM run_at - now())::float8 FROM slotd_tasks WHERE id = %s",
            (task_id,),
        ).fetchone()[0]
        delays.append(seconds)
    expected = [15, 30, 60, 120, 240, 480, 600, 600]
    for got, want in zip(delays, expected, strict=True):
        assert want * 0.9 - 0.5 <= got <= want + 0.5, (delays, expected)
    assert row(conn, task_id)["last_error"] == "boom"
    assert row(conn, task_id)["lease_token"] is None


def test_dead_lettered_exactly_at_max_attempts(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("doomed")
    task_id = slotd.enqueue(conn, "doomed", max_attempts=3)
    for attempt in range(1, 4):
        conn.execute(
            "UPDATE slotd_tasks SET run_at = now(), order_at = now() WHERE id = %s", (task_id,)
        )
        claimed = claim_one(repo, reg)
        assert claimed.attempt == attempt
        failure = repo.record_failure(task_id, claimed.token, f"boom {attempt}")
        assert failure.dead == (attempt == 3)
    conn.execute(
        "UPDATE slotd_tasks SET run_at = now(), order_at = now() WHERE id = %s", (task_id,)
    )
    assert repo.discover(reg.types) == []
    gauges = repo.gauges()
    assert gauges["dead"] == {"doomed": 1}
    assert gauges["pending"] == {}


def test_final_attempt_under_live_lease_is_pending_not_dead(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("last")
    slotd.enqueue(conn, "last", max_attempts=1)
    claim_one(repo, reg)
    gauges = repo.gauges()
    assert gauges["pending"] == {"last": 1}
    assert gauges["running"] == {"last": 1}
    assert gauges["dead"] == {}
    conn.execute("UPDATE slotd_tasks SET last_attempted_at = now() - interval '30 days'")
    assert repo.prune_dead(timedelta(days=7)) == 0


def test_advance_cursor_resets_attempts_under_the_same_lease_until_the_slice_returns(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("sliced")
    task_id = slotd.enqueue(conn, "sliced", {"cursor": 0})
    for _ in range(2):
        conn.execute(
            "UPDATE slotd_tasks SET run_at = now(), order_at = now() WHERE id = %s", (task_id,)
        )
        claimed = claim_one(repo, reg)
        repo.record_failure(task_id, claimed.token, "page read failed")
    conn.execute(
        "UPDATE slotd_tasks SET run_at = now(), order_at = now() WHERE id = %s", (task_id,)
    )
    claimed = claim_one(repo, reg)
    assert claimed.attempt == 3
    assert repo.advance_cursor(task_id, claimed.token, {"cursor": 100}) is True
    after = row(conn, task_id)
    assert after["payload"] == {"cursor": 100}
    assert after["attempt_count"] == 0
    assert after["last_error"] is None
    # The slice keeps its lease: nobody else may start the next slice while it runs on.
    assert after["lease_token"] == claimed.token
    assert repo.discover(reg.types) == []
    assert repo.advance_cursor(task_id, claimed.token, {"cursor": 200}) is True
    # Its return of False gives the row back, due at once from the cursor.
    assert repo.continue_slice(task_id, claimed.token) is True
    after = row(conn, task_id)
    assert after["lease_token"] is None and after["lease_expires_at"] is None
    assert after["payload"] == {"cursor": 200}
    assert repo.discover(reg.types) == [task_id]
    # Fenced: the slice that continued no longer owns the row.
    assert repo.advance_cursor(task_id, claimed.token, {"cursor": 300}) is False
    assert repo.continue_slice(task_id, claimed.token) is False


def test_a_shutdown_release_refunds_a_final_attempt_once_per_task(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("rolled")
    early = slotd.enqueue(conn, "rolled", key="early")
    claimed = claim_one(repo, reg)
    assert repo.release(claimed.id, claimed.token, "shutdown", refund_final=True) is False
    assert row(conn, early)["last_error"] is None
    assert row(conn, early)["attempt_count"] == 1  # a rollout does not refund the attempt
    conn.execute("DELETE FROM slotd_tasks")
    last = slotd.enqueue(conn, "rolled", max_attempts=1)
    reason = "released at shutdown on its final attempt, a second time"
    # The first release of its final attempt gives that attempt back: a deploy alone never
    # makes the dead letter.
    claimed = claim_one(repo, reg)
    assert repo.release(claimed.id, claimed.token, reason, refund_final=True) is False
    assert row(conn, last)["attempt_count"] == 0 and row(conn, last)["last_error"] is None
    assert repo.gauges()["dead"] == {}
    # Once per task: the second one dead-letters it, with the reason.
    claimed = claim_one(repo, reg)
    assert repo.release(claimed.id, claimed.token, reason, refund_final=True) is True
    assert row(conn, last)["last_error"] == reason
    assert repo.gauges()["dead"] == {"rolled": 1}
    # The test clock's lapse (refund_final off) never refunds.
    lapsed = slotd.enqueue(conn, "rolled", max_attempts=1)
    claimed = claim_one(repo, reg)
    assert repo.release(claimed.id, claimed.token, "lease lapsed") is True
    assert row(conn, lapsed)["attempt_count"] == 1


def test_retention_prunes_only_dead_rows_past_the_window(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("old")
    old_dead = slotd.enqueue(conn, "old", max_attempts=1)
    claimed = claim_one(repo, reg)
    repo.record_failure(old_dead, claimed.token, "x")
    young_dead = slotd.enqueue(conn, "old", max_attempts=1)
    claimed = claim_one(repo, reg)
    repo.record_failure(young_dead, claimed.token, "x")
    pending_old = slotd.enqueue(conn, "old")
    conn.execute(
        "UPDATE slotd_tasks SET last_attempted_at = now() - interval '8 days' WHERE id IN (%s, %s)",
        (old_dead, pending_old),
    )
    assert repo.prune_dead(timedelta(days=7)) == 1
    assert row(conn, old_dead) is None
    assert row(conn, young_dead) is not None
    assert row(conn, pending_old) is not None


def test_dedupe_key_returns_live_row_and_ignores_dead_letters(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("audit")
    first = slotd.enqueue(conn, "audit", {"org": 1}, key="org:1")
    assert slotd.enqueue(conn, "audit", {"org": 1}, key="org:1") == first
    assert slotd.enqueue(conn, "audit", {"org": 2}, key="org:2") != first
    same_batch = slotd.enqueue_many(
        conn, [("audit", {}, None, "org:3"), ("audit", {}, None, "org:3")]
    )
    assert same_batch[0] == same_batch[1]
    conn.execute("DELETE FROM slotd_tasks WHERE key <> 'org:1'")
    conn.execute("UPDATE slotd_tasks SET max_attempts = 1, max_attempts_explicit = true")
    claimed = claim_one(repo, reg)
    repo.record_failure(claimed.id, claimed.token, "dead now")
    fresh = slotd.enqueue(conn, "audit", {"org": 1}, key="org:1")
    assert fresh != first


def test_concurrent_enqueue_of_one_key_yields_one_row(db_url: str) -> None:
    with psycopg.connect(db_url) as a, psycopg.connect(db_url) as b:
        first = slotd.enqueue(a, "audit", key="org:9")
        import threading

        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(slotd.enqueue(b, "audit", key="org:9")))
        t.start()
        a.commit()
        t.join(10)
        b.commit()
        assert result == [first]


@pytest.mark.parametrize(
    "args, error",
    [
        (("Bad Type", {}), ValueError),
        (("plain", {"when": object()}), TypeError),
        (("plain", ["not", "an", "object"]), TypeError),
        (("plain", {"nan": float("nan")}), TypeError),
    ],
)
def test_bad_input_raises_before_any_write_and_keeps_the_transaction(
    db_url: str, args: tuple[Any, ...], error: type[Exception]
) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute("CREATE TEMP TABLE business (v int)")
        conn.execute("INSERT INTO business VALUES (1)")
        with pytest.raises(error):
            slotd.enqueue(conn, *args)
        assert conn.execute("SELECT count(*) FROM business").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,)


def test_discovery_sees_only_this_replicas_types_oldest_first(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    other = slotd.enqueue(conn, "other")
    later = slotd.enqueue(conn, "mine")
    earlier = slotd.enqueue(conn, "mine")
    conn.execute(
        "UPDATE slotd_tasks SET run_at = now() - interval '1 hour',"
        " order_at = now() - interval '1 hour' WHERE id = %s",
        (earlier,),
    )
    future = slotd.enqueue(conn, "mine", delay=timedelta(hours=1))
    found = repo.discover(["mine"])
    assert found == [earlier, later]
    assert other not in found and future not in found


def test_write_lane_statements_are_bounded(conn: psycopg.Connection[Any], db_url: str) -> None:
    reg = registry_of("plain")
    slotd.enqueue(conn, "plain")
    with psycopg.connect(db_url, autocommit=True) as write:
        repo = Repository(write, lock_timeout=timedelta(milliseconds=200))
        ids = repo.discover(reg.types)
        with psycopg.connect(db_url) as locker:
            locker.execute("SELECT * FROM slotd_tasks FOR UPDATE")
            # SKIP LOCKED passes over the locked row rather than waiting on it...
            assert repo.claim(ids, reg) is None
            # ...and a fenced write that must wait gives up at the lock timeout.
            with pytest.raises(psycopg.errors.LockNotAvailable):
                repo.dequeue(ids[0], None)
        # The bound is SET LOCAL: the session itself is left untouched.
        assert write.execute("SHOW lock_timeout").fetchone() == ("0",)


def test_bound_holds_for_the_write_without_an_explicit_transaction(db_url: str) -> None:
    # The write lane sends bound + statement in one pipeline sync and no BEGIN/COMMIT: the
    # server's implicit transaction must still carry the bound into the statement.
    with psycopg.connect(db_url, autocommit=True) as write:
        repo = Repository(write, statement_timeout=timedelta(milliseconds=100))
        with pytest.raises(psycopg.errors.QueryCanceled), repo._bounded() as lane:
            lane.execute("SELECT pg_sleep(2)")
        assert write.execute("SHOW statement_timeout").fetchone() == ("0",)


@pytest.mark.parametrize("sync", [True, False])
def test_a_bound_session_bounds_every_write_in_one_statement(db_url: str, sync: bool) -> None:
    """A slot's own direct connection carries the bounds on its session (one statement per
    write, no pipeline): a write that waits on a lock still gives up at the lock timeout, a
    long statement at the statement timeout, and the commit mode is the configured one."""
    reg = registry_of("plain")
    with psycopg.connect(db_url, autocommit=True) as write, psycopg.connect(db_url) as locker:
        write.execute("SET synchronous_commit = on")  # the test server runs with it off
        repo = Repository(
            write,
            lock_timeout=timedelta(milliseconds=200),
            statement_timeout=timedelta(milliseconds=300),
            synchronous_commit=sync,
        )
        repo.bind_session()
        (task_id,) = slotd.enqueue_many(write, [("plain", {})])
        claimed = repo.claim([task_id], reg)
        assert claimed is not None
        locker.execute("SELECT * FROM slotd_tasks FOR UPDATE")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            repo.dequeue(task_id, claimed.token)
        locker.rollback()
        with pytest.raises(psycopg.errors.QueryCanceled), repo._bounded() as lane:
            lane.execute("SELECT pg_sleep(2)")
        with repo._bounded() as lane:
            cur = lane.execute("SHOW synchronous_commit")
        assert cur.fetchone() == ("on" if sync else "off",)
        # The settlement itself still lands, fenced as ever.
        repo.dequeue(task_id, claimed.token)
        assert row(write, task_id) is None


@pytest.mark.parametrize(("sync", "expected"), [(True, "on"), (False, "off")])
def test_synchronous_commit_off_is_local_to_the_queue_write(
    db_url: str, sync: bool, expected: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as write:
        write.execute("SET synchronous_commit = on")  # the test server runs with it off
        repo = Repository(write, synchronous_commit=sync)
        with repo._bounded() as lane:
            cur = lane.execute("SHOW synchronous_commit")
        assert cur.fetchone() == (expected,)
        assert write.execute("SHOW synchronous_commit").fetchone() == ("on",)


def test_dequeue_and_claim_settles_one_and_leases_the_next_in_one_statement(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("plain")
    first, second = slotd.enqueue_many(conn, [("plain", {}), ("plain", {})])
    claimed = repo.claim([first], reg)
    nxt = repo.dequeue_and_claim(first, claimed.token, [second], reg)
    assert row(conn, first) is None
    assert nxt is not None and nxt.id == second and nxt.attempt == 1
    assert row(conn, second)["lease_token"] == nxt.token
    # Nothing left to claim: the dequeue still happens.
    assert repo.dequeue_and_claim(second, nxt.token, [second], reg) is None
    assert row(conn, second) is None


def test_dequeue_and_claim_with_a_stale_token_refuses_the_dequeue_but_keeps_the_claim(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("plain")
    first, second = slotd.enqueue_many(conn, [("plain", {}), ("plain", {})])
    repo.claim([first], reg)
    with pytest.raises(LeaseLost) as lost:
        repo.dequeue_and_claim(first, uuid.uuid4(), [second], reg)
    assert row(conn, first) is not None
    assert lost.value.next_claim is not None and lost.value.next_claim.id == second


def test_dedupe_lookup_is_index_driven_on_a_large_table(
    conn: psycopg.Connection[Any],
) -> None:
    slotd.enqueue_many(conn, [("audit", {}, None, f"org:{n}") for n in range(5000)])
    conn.execute("ANALYZE slotd_tasks")
    for unique in ("live", "pending"):
        params = enqueue_params([("audit", {}, None, "org:7")], unique=unique)
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN " + statements()["enqueue"], params).fetchall()
        )
        assert "Seq Scan on slotd_tasks" not in plan, (unique, plan)


def test_claim_is_a_primary_key_look_up_with_statistics_from_an_empty_table(
    conn: psycopg.Connection[Any],
) -> None:
    """A bulk enqueue into a table last analysed empty: with no column statistics the planner
    guessed a handful of due rows and read every due row through the due index for each
    claim (40-155 ms at 20,000 rows under load, until autoanalyze). The claim's candidates
    are a few known ids: the primary key is the only plan whatever the statistics say."""
    conn.execute("ALTER TABLE slotd_tasks SET (autovacuum_enabled = false)")
    conn.execute("ANALYZE slotd_tasks")
    ids = slotd.enqueue_many(conn, [("plain", {}) for _ in range(5000)])
    params = Repository(conn)._claim_params(ids[:80], registry_of("plain", "other"))
    chained = {"id": ids[-1], "done_token": None}
    for name, extra in (("claim.plain", {}), ("succeeded.plain+claim.plain", chained)):
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN " + statements()[name], {**params, **extra})
        )
        picked = plan[plan.index("CTE picked") : plan.index("CTE claimed")]
        assert "slotd_tasks_pkey" in picked, plan
        assert "slotd_tasks_due" not in picked, plan


def test_keyed_enqueue_whose_rival_finished_between_its_statements_inserts_its_own(
    db_url: str,
) -> None:
    import threading

    rival = psycopg.connect(db_url)  # an uncommitted enqueue of the same key
    rival_id = slotd.enqueue(rival, "audit", key="org:9")

    class FinishedMeanwhile(psycopg.Cursor[Any]):
        """Between the insert that met the rival and the look-up for it, the rival's
        row is claimed, run and deleted by a worker: the window the bug lived in."""

        def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
            if query == statements()["live_by_key"]:
                with psycopg.connect(db_url, autocommit=True) as worker:
                    worker.execute("DELETE FROM slotd_tasks WHERE id = %s", (rival_id,))
            return super().execute(query, params, **kw)

    ours = psycopg.connect(db_url, cursor_factory=FinishedMeanwhile)
    got: list[Any] = []

    def produce() -> None:
        try:
            got.append(slotd.enqueue(ours, "audit", key="org:9"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            got.append(exc)

    thread = threading.Thread(target=produce)
    thread.start()
    with psycopg.connect(db_url, autocommit=True) as watch:
        waiting = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        from tests.daemon import wait_for

        wait_for(lambda: watch.execute(waiting).fetchone() == (1,), what="the unique wait")
        rival.commit()
        thread.join(30)
        ours.commit()
        (task_id,) = got
        assert isinstance(task_id, int) and task_id != rival_id
        keyed = "SELECT id FROM slotd_tasks WHERE key = 'org:9'"
        assert watch.execute(keyed).fetchall() == [(task_id,)]
    rival.close()
    ours.close()


def test_claim_arrays_round_trip_as_literals_and_follow_a_registry_that_grows(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    from slotd.repository import array_literal, id_array

    names = ["plain", 'with "quote"', "back\\slash", "comma,brace{}", "spaced name", "NULL", ""]
    got = conn.execute(
        "SELECT %s::text[], %s::float8[], %s::int[]",
        (array_literal(names), array_literal([0.1, 30.0, 1e-7]), array_literal([1, None, 3])),
    ).fetchone()
    assert got == (names, [0.1, 30.0, 1e-7], [1, None, 3])
    ids = [2**62, 1, 0, 7]  # the candidate ids' own, check-free literal
    assert id_array(ids) == "{4611686018427387904,1,0,7}" and id_array([]) == "{}"
    assert conn.execute("SELECT %s::bigint[]", (id_array(ids),)).fetchone() == (ids,)

    reg = registry_of("plain")
    (first,) = slotd.enqueue_many(conn, [("plain", {})])
    assert repo.claim([first], reg) is not None
    reg.register("plain.later", lambda task, ctx: None, ceiling=MINUTE)  # after the first claim
    (second,) = slotd.enqueue_many(conn, [("plain.later", {})])
    claimed = repo.claim([second], reg)
    assert claimed is not None and claimed.task_type == "plain.later"


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
def test_discovery_reads_only_the_served_types_rows(
    conn: psycopg.Connection[Any], plan_mode: str
) -> None:
    """Another fleet's 20k due rows of a type this replica does not serve: discovery is one
    index range scan per served type, never a walk past those rows, whether the planner
    sees the types (a custom plan) or not (a generic one, as after psycopg prepares)."""
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, run_at, order_at) SELECT 'theirs',"
        " now() - interval '1 hour', now() - interval '1 hour' FROM generate_series(1, 20000)"
    )
    conn.execute("VACUUM ANALYZE slotd_tasks")
    conn.execute(f"SET plan_cache_mode = {plan_mode}")
    params = {"types": ["mine.a", "mine.b"], "limit": 80, "lead_s": 100.0, **limit_params({})}
    # A named prepared statement run by EXPLAIN EXECUTE: the plan a prepared statement really
    # runs (EXPLAIN with bound parameters would plan for their values, a custom plan).
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        names.append(match.group(1)) if match.group(1) not in names else None
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", placeholder, statements()["discover"])
    conn.execute(f"PREPARE discover_plan AS {text}")  # type: ignore[arg-type]
    args = ", ".join(sql.Literal(params[n]).as_string(conn) for n in names)
    cur = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE discover_plan({args})")  # type: ignore[arg-type]
    plan = cur.fetchone()[0][0]["Plan"]  # type: ignore[index]
    generic = re.search(r"\$\d", repr(plan)) is not None
    assert generic == (plan_mode == "force_generic_plan"), plan
    # The queue's rows as discovery reads them (alias t); the limit counts (alias l) read
    # leases through their own index.
    tasks = [n for n in _nodes(plan) if n.get("Relation Name") == "slotd_tasks"]
    assert not [n for n in tasks if n["Node Type"] == "Seq Scan"], plan
    lookups = [n for n in tasks if n.get("Alias") == "t"]
    assert lookups and all(n["Index Name"] == "slotd_tasks_order_by_type" for n in lookups), plan
    assert all("(task_type = s.task_type)" in n["Index Cond"] for n in lookups), plan
    # Not one of the 20k rows was read: each range scan ended where it began.
    assert all(n["Actual Rows"] == 0 and n.get("Rows Removed by Filter", 0) == 0
               for n in tasks), plan  # fmt: skip
    assert Repository(conn).discover(["mine.a", "mine.b"]) == []
    # The served type's own rows are found, oldest by the ordering key first.
    first = slotd.enqueue(conn, "mine.b", {}, priority=5)
    second = slotd.enqueue(conn, "mine.a", {})
    assert Repository(conn).discover(["mine.a", "mine.b", "mine.a"]) == [first, second]


def test_discovery_walks_its_index_with_statistics_from_an_empty_table(
    conn: psycopg.Connection[Any],
) -> None:
    """A bulk enqueue into a table last analysed empty (before autoanalyze: the state that
    made claims take 40-155 ms): discovery still reads each served type's first rows through
    slotd_tasks_order_by_type and stops at its limit, never every due row and a sort."""
    conn.execute("ALTER TABLE slotd_tasks SET (autovacuum_enabled = false)")
    conn.execute("ANALYZE slotd_tasks")
    ids = slotd.enqueue_many(conn, [("plain", {}) for _ in range(5000)])
    params = {"types": ["plain", "other"], "limit": 80, "lead_s": 100.0, **limit_params({})}
    cur = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statements()["discover"], params)
    plan = cur.fetchone()[0][0]["Plan"]  # type: ignore[index]
    tasks = [n for n in _nodes(plan) if n.get("Alias") == "t"]
    assert tasks and all(n["Index Name"] == "slotd_tasks_order_by_type" for n in tasks), plan
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in tasks) <= 80, plan
    assert Repository(conn).discover(["plain", "other"], 80) == ids[:80]


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)
