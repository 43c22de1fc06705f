"""The pytest plugin as a user meets it: a registry of small handlers, the `task_queue` and
`slotd_eager` fixtures, every verb, on an autocommit connection and inside a test
transaction (the `slotd_conn` fixture below is what a user's conftest provides)."""

from __future__ import annotations

import importlib
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.dev.localpg import LocalPostgresError, find_bindir
from slotd.outcome import Outcome
from slotd.repository import Claimed
from slotd.testing import BlockedByTest, ManualQueue, QueuedTask, TaskFailed, _rebased, eager

pytest_plugins = ["pytester"]
enqueue_module = importlib.import_module("slotd.producer.enqueue")

MINUTE = timedelta(minutes=1)
BACKOFF_CAP = timedelta(minutes=10)  # Settings() default: any backoff is over after this
LEASE = MINUTE + timedelta(seconds=30)  # ceiling + default margin

registry = slotd.Registry()
notes: list[Any] = []


@registry.handler("note", ceiling=MINUTE)
def note(task: slotd.Task, ctx: slotd.Context) -> None:
    notes.append((task.payload["text"], task.attempt))


@registry.handler("flaky", ceiling=MINUTE)
def flaky(task: slotd.Task, ctx: slotd.Context) -> None:
    notes.append(("flaky", task.attempt))
    if task.attempt <= task.payload["fail"]:
        raise ConnectionError(f"attempt {task.attempt} fails")


@registry.handler("pages", ceiling=MINUTE)
def pages(task: slotd.Task, ctx: slotd.Context) -> bool:
    page = task.payload["page"]
    notes.append(("page", page))
    if page + 1 >= task.payload["pages"]:
        return True
    ctx.advance_cursor({**task.payload, "page": page + 1})
    return False


@registry.handler("deadline", ceiling=timedelta(seconds=2))
def deadline(task: slotd.Task, ctx: slotd.Context) -> None:
    notes.append(("remaining", ctx.remaining()))


@pytest.fixture(autouse=True)
def _fresh_notes() -> Iterator[None]:
    notes.clear()
    yield
    assert enqueue_module._hook is None, "a test mode left its enqueue hook installed"


@pytest.fixture(params=["autocommit", "transaction"])
def slotd_conn(request: pytest.FixtureRequest, db_url: str) -> Iterator[psycopg.Connection[Any]]:
    if request.param == "autocommit":
        with psycopg.connect(db_url, autocommit=True) as conn:
            yield conn
    else:
        with psycopg.connect(db_url) as conn, conn.transaction(force_rollback=True):
            yield conn


@pytest.fixture
def slotd_registry() -> slotd.Registry:
    return registry


@pytest.fixture
def observer(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session on the same database: sees only what is committed."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


def committed_rows(observer: psycopg.Connection[Any]) -> int:
    return int(observer.execute("SELECT count(*) FROM slotd_tasks").fetchone()[0])  # type: ignore[index]


def outcomes(settlements: list[Any]) -> list[Outcome]:
    return [s.outcome for s in settlements]


# capture and delivery


def test_capture_records_enqueued_ids_and_the_rows_are_real(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    with task_queue.capture() as ids:
        first = slotd.enqueue(slotd_conn, "note", {"text": "a"})
        more = slotd.enqueue_many(slotd_conn, [("note", {"text": "b"}), ("flaky", {"fail": 0})])
    slotd.enqueue(slotd_conn, "note", {"text": "outside"})
    assert ids == [first, *more]
    assert [t.type for t in task_queue.pending()] == ["note", "note", "flaky", "note"]
    assert [t.payload for t in task_queue.pending("flaky")] == [{"fail": 0}]
    assert notes == []  # captured, not run


def test_capture_sees_a_keyed_duplicate_as_the_live_row(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    with task_queue.capture() as ids:
        a = slotd.enqueue(slotd_conn, "note", {"text": "x"}, key="k")
        b = slotd.enqueue(slotd_conn, "note", {"text": "y"}, key="k")
    assert a == b
    assert ids == [a]


def test_deliver_next_runs_the_oldest_due_task_and_settles_it(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    assert task_queue.deliver_next() is None
    slotd.enqueue(slotd_conn, "note", {"text": "one"})
    slotd.enqueue(slotd_conn, "note", {"text": "two"})
    settled = task_queue.deliver_next()
    assert settled is not None and settled.outcome is Outcome.SUCCESS
    assert notes == [("one", 1)]
    assert [t.payload["text"] for t in task_queue.pending()] == ["two"]
    assert task_queue.last_task is not None and task_queue.last_task.payload == {"text": "one"}


def test_deliver_all_runs_only_what_is_due(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "note", {"text": "now"})
    later = slotd.enqueue(slotd_conn, "note", {"text": "later"}, delay=timedelta(hours=1))
    assert outcomes(task_queue.deliver_all()) == [Outcome.SUCCESS]
    assert [t.id for t in task_queue.pending()] == [later]
    task_queue.advance_time(timedelta(minutes=59))
    assert task_queue.deliver_all() == []
    task_queue.advance_time(timedelta(minutes=1))
    assert outcomes(task_queue.deliver_all()) == [Outcome.SUCCESS]
    assert notes == [("now", 1), ("later", 1)]
    assert task_queue.pending() == []


def test_deliver_all_respects_its_limit(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue_many(slotd_conn, [("note", {"text": str(i)}) for i in range(5)])
    assert len(task_queue.deliver_all(limit=3)) == 3
    assert len(task_queue.pending()) == 2


def test_a_sliced_task_is_delivered_slice_by_slice(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "pages", {"page": 0, "pages": 3})
    first = task_queue.deliver_next()
    assert first is not None and first.outcome is Outcome.CONTINUED
    assert [t.payload["page"] for t in task_queue.pending()] == [1]
    assert outcomes(task_queue.deliver_all()) == [Outcome.CONTINUED, Outcome.SUCCESS]
    assert notes == [("page", 0), ("page", 1), ("page", 2)]


# failures, backoff, dead letters


def test_fail_next_fails_the_next_delivery_instead_of_the_handler(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "note", {"text": "x"})
    task_queue.fail_next(TimeoutError("smtp"))
    settled = task_queue.deliver_next()
    assert settled is not None and settled.outcome is Outcome.FAILURE
    assert notes == []  # the handler was not called
    [task] = task_queue.pending()
    assert task.attempt == 1 and task.run_at > datetime.now(UTC)  # backing off
    assert task_queue.deliver_all() == []
    task_queue.advance_time(BACKOFF_CAP)
    assert outcomes(task_queue.deliver_all()) == [Outcome.SUCCESS]
    assert notes == [("x", 2)]


def test_fail_next_queues_up_and_takes_an_exception_class(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "note", {"text": "x"}, max_attempts=2)
    task_queue.fail_next(ValueError)
    task_queue.fail_next(KeyError("gone"))
    assert outcomes(task_queue.deliver_all()) == [Outcome.FAILURE]
    task_queue.advance_time(BACKOFF_CAP)
    settled = task_queue.deliver_next()
    assert settled is not None and settled.outcome is Outcome.FAILURE and settled.dead
    [dead] = task_queue.dead()
    assert "KeyError: 'gone'" in (dead.last_error or "")
    assert dead.attempt == 2 and dead.dead
    assert "KeyError: 'gone'" in (settled.error or "")  # the settlement says why, too
    assert task_queue.pending() == []
    assert notes == []


def test_a_handler_failure_backs_off_then_succeeds(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "flaky", {"fail": 1})
    assert outcomes(task_queue.deliver_all()) == [Outcome.FAILURE]
    # The first backoff is the 15 s base less up to 10 % jitter: 10 s is not enough.
    task_queue.advance_time(timedelta(seconds=10))
    assert task_queue.deliver_all() == []
    task_queue.advance_time(timedelta(seconds=5))
    assert outcomes(task_queue.deliver_all()) == [Outcome.SUCCESS]
    assert notes == [("flaky", 1), ("flaky", 2)]


def test_dead_and_pending_filter_by_type(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "flaky", {"fail": 5}, max_attempts=1)
    slotd.enqueue(slotd_conn, "note", {"text": "later"}, delay=MINUTE)
    task_queue.deliver_all()
    assert [d.type for d in task_queue.dead()] == ["flaky"]
    assert task_queue.dead("note") == []
    assert [t.type for t in task_queue.pending()] == ["note"]
    assert task_queue.pending("flaky") == []


# lost workers and leases


def test_drop_next_leaves_the_lease_to_expire(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    task_id = slotd.enqueue(slotd_conn, "note", {"text": "x"})
    dropped = task_queue.drop_next()
    assert dropped is not None and dropped.id == task_id and dropped.attempt == 1
    assert notes == []
    assert [t.id for t in task_queue.running()] == [task_id]
    assert [t.id for t in task_queue.pending()] == [task_id]  # still owed a run
    assert task_queue.deliver_next() is None  # nobody may take it while leased
    assert task_queue.expire_leases() == 1
    assert task_queue.running() == []
    settled = task_queue.deliver_next()
    assert settled is not None and settled.outcome is Outcome.SUCCESS
    assert notes == [("x", 2)]


def test_a_dropped_lease_ends_with_time(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "note", {"text": "x"})
    assert task_queue.drop_next() is not None
    task_queue.advance_time(LEASE - timedelta(seconds=1))
    assert task_queue.deliver_next() is None
    task_queue.advance_time(timedelta(seconds=1))
    assert outcomes(task_queue.deliver_all()) == [Outcome.SUCCESS]


def test_a_dropped_final_attempt_becomes_a_dead_letter(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "note", {"text": "x"}, max_attempts=1)
    assert task_queue.drop_next() is not None
    assert task_queue.dead() == []  # leased: not dead yet
    task_queue.expire_leases()
    assert [d.attempt for d in task_queue.dead()] == [1]
    assert task_queue.pending() == []
    assert task_queue.deliver_next() is None


def test_drop_and_deliver_return_none_on_an_empty_queue(task_queue: ManualQueue) -> None:
    assert task_queue.drop_next() is None
    assert task_queue.deliver_all() == []
    assert task_queue.expire_leases() == 0


# redelivery (at-least-once)


def test_redeliver_last_runs_a_succeeded_task_again(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "note", {"text": "welcome"})
    task_queue.deliver_all()
    again = task_queue.redeliver_last()
    assert again.outcome is Outcome.SUCCESS
    assert notes == [("welcome", 1), ("welcome", 2)]
    assert task_queue.pending() == [] and task_queue.dead() == []  # nothing written
    assert [t.attempt for t, _ in task_queue.history] == [1, 2]


def test_redeliver_last_of_a_continued_slice_takes_a_fresh_lease(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "pages", {"page": 0, "pages": 3})
    task_queue.deliver_next()
    again = task_queue.redeliver_last()  # the same slice, from its original cursor
    assert again.outcome is Outcome.CONTINUED
    assert notes == [("page", 0), ("page", 0)]
    assert [t.payload["page"] for t in task_queue.pending()] == [1]
    assert outcomes(task_queue.deliver_all()) == [Outcome.CONTINUED, Outcome.SUCCESS]


def test_redeliver_last_after_a_drop_lapses_only_that_lease(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    first = slotd.enqueue(slotd_conn, "note", {"text": "first"})
    slotd.enqueue(slotd_conn, "note", {"text": "second"})
    task_queue.drop_next()
    task_queue.drop_next()
    again = task_queue.redeliver_last()
    assert again.outcome is Outcome.SUCCESS
    assert notes == [("second", 2)]
    assert [t.id for t in task_queue.running()] == [first]


def test_redeliver_last_of_a_backing_off_task_writes_nothing(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "flaky", {"fail": 1})
    task_queue.deliver_next()
    [before] = task_queue.pending()
    again = task_queue.redeliver_last()  # attempt 2 of this handler succeeds...
    assert again.outcome is Outcome.SUCCESS
    assert notes == [("flaky", 1), ("flaky", 2)]
    assert task_queue.pending() == [before]  # ...but a late worker settles nothing


def test_a_late_duplicate_cannot_advance_a_cursor(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "pages", {"page": 0, "pages": 3})
    task_queue.deliver_next()  # slice 0 continues
    task_queue.fail_next()
    task_queue.deliver_next()  # slice 1 fails and backs off, still at page 1
    late = task_queue.redeliver_last()  # slice 1 runs again without a lease
    assert late.outcome is Outcome.FAILURE  # its advance_cursor raised LeaseLost
    assert notes == [("page", 0), ("page", 1)]
    [row] = task_queue.pending()
    assert row.payload["page"] == 1 and row.attempt == 1


def test_fail_next_applies_to_a_redelivery(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "note", {"text": "x"})
    task_queue.deliver_next()
    task_queue.fail_next()
    assert task_queue.redeliver_last().outcome is Outcome.FAILURE
    assert notes == [("x", 1)]


def test_redeliver_last_needs_a_delivery(task_queue: ManualQueue) -> None:
    with pytest.raises(RuntimeError, match="nothing has been delivered"):
        task_queue.redeliver_last()


# time and transactions


def test_the_handler_gets_its_whole_ceiling_whatever_the_transaction_clock_says() -> None:
    stamped = datetime.now(UTC) - timedelta(hours=1)  # a claim in an hour-old transaction
    claimed = Claimed(
        1, "deadline", {}, None, stamped, 1, 20, __import__("uuid").uuid4(),
        stamped + timedelta(seconds=32), stamped,
    )  # fmt: skip
    deadline = _rebased(claimed).deadline(timedelta(seconds=30))
    assert timedelta(seconds=1.5) < deadline - datetime.now(UTC) <= timedelta(seconds=2)


def test_the_deadline_a_handler_sees(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "deadline")
    task_queue.deliver_next()
    [(_, remaining)] = notes
    assert 0 < remaining <= 2


def test_advance_time_refuses_to_go_back(task_queue: ManualQueue) -> None:
    with pytest.raises(ValueError):
        task_queue.advance_time(-1)


def test_nothing_is_committed_on_a_transactional_connection(
    request: pytest.FixtureRequest,
    task_queue: ManualQueue,
    slotd_conn: psycopg.Connection[Any],
    observer: psycopg.Connection[Any],
) -> None:
    transactional = not slotd_conn.autocommit
    slotd.enqueue(slotd_conn, "flaky", {"fail": 1})
    slotd.enqueue(slotd_conn, "note", {"text": "x"})
    task_queue.deliver_all()
    task_queue.drop_next()
    task_queue.expire_leases()
    task_queue.advance_time(MINUTE)
    assert len(task_queue.pending()) == 1
    assert committed_rows(observer) == (0 if transactional else 1)
    if transactional:
        assert slotd_conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS


def test_an_idle_non_autocommit_connection_is_not_committed(
    db_url: str, observer: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_url, autocommit=True) as setup:
        slotd.enqueue(setup, "note", {"text": "committed by the app"})
    with psycopg.connect(db_url) as conn:  # no transaction open yet
        queue = ManualQueue(conn, registry)
        assert outcomes(queue.deliver_all()) == [Outcome.SUCCESS]
        assert committed_rows(observer) == 1  # the delete is not committed...
        conn.rollback()
    assert committed_rows(observer) == 1  # ...and rolls back with the test


# eager mode


def test_eager_runs_the_handler_inside_enqueue(
    slotd_eager: Any, slotd_conn: psycopg.Connection[Any], task_queue: ManualQueue
) -> None:
    task_id = slotd.enqueue(slotd_conn, "note", {"text": "now"})
    assert notes == [("now", 1)]
    assert task_queue.pending() == []
    [(task, settled)] = slotd_eager.settlements
    assert task.id == task_id and settled.outcome is Outcome.SUCCESS


def test_eager_runs_a_sliced_task_to_the_end(
    slotd_eager: Any, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "pages", {"page": 0, "pages": 3})
    assert notes == [("page", 0), ("page", 1), ("page", 2)]
    assert outcomes([s for _, s in slotd_eager.settlements]) == [
        Outcome.CONTINUED,
        Outcome.CONTINUED,
        Outcome.SUCCESS,
    ]


def test_eager_settles_a_failure_and_leaves_delayed_tasks_pending(
    slotd_eager: Any, slotd_conn: psycopg.Connection[Any], task_queue: ManualQueue
) -> None:
    failing = slotd.enqueue(slotd_conn, "flaky", {"fail": 1})
    later = slotd.enqueue(slotd_conn, "note", {"text": "later"}, delay=MINUTE)
    assert notes == [("flaky", 1)]
    assert [t.id for t in task_queue.pending()] == [failing, later]
    assert [s.outcome for _, s in slotd_eager.settlements] == [Outcome.FAILURE]


def test_eager_propagate_raises_on_failure(slotd_conn: psycopg.Connection[Any]) -> None:
    with eager(registry, slotd_conn, propagate=True) as runner:
        slotd.enqueue(slotd_conn, "note", {"text": "fine"})
        with pytest.raises(TaskFailed, match="flaky#.* attempt 1: failure: .*attempt 1 fails"):
            slotd.enqueue(slotd_conn, "flaky", {"fail": 1})
    assert len(runner.settlements) == 2
    slotd.enqueue(slotd_conn, "note", {"text": "after"})  # hook removed: not run
    assert notes == [("fine", 1), ("flaky", 1)]


def test_a_propagated_failure_chains_the_handlers_exception(
    slotd_conn: psycopg.Connection[Any],
) -> None:
    with eager(registry, slotd_conn, propagate=True), pytest.raises(TaskFailed) as failed:
        slotd.enqueue(slotd_conn, "flaky", {"fail": 1})
    cause = failed.value.__cause__
    assert isinstance(cause, ConnectionError) and str(cause) == "attempt 1 fails"


def test_a_swallowed_failure_keeps_its_error_on_the_settlement(slotd_eager: Any) -> None:
    conn = slotd_eager.repo.write
    slotd.enqueue(conn, "flaky", {"fail": 1})
    [(_task, settled)] = slotd_eager.settlements
    assert settled.outcome is Outcome.FAILURE
    assert "ConnectionError: attempt 1 fails" in (settled.error or "")
    assert isinstance(settled.exception, ConnectionError)


@pytest.mark.slotd_eager(propagate=True)
def test_the_slotd_eager_marker_turns_propagate_on(
    slotd_eager: Any, slotd_conn: psycopg.Connection[Any]
) -> None:
    assert slotd_eager.propagate
    with pytest.raises(TaskFailed):
        slotd.enqueue(slotd_conn, "flaky", {"fail": 1})


@pytest.mark.parametrize("slotd_eager", [{"propagate": True}], indirect=True)
def test_an_indirect_parameter_turns_propagate_on(
    slotd_eager: Any, slotd_conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(TaskFailed):
        slotd.enqueue(slotd_conn, "flaky", {"fail": 1})


def test_the_views_return_one_kind_of_object(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    slotd.enqueue(slotd_conn, "flaky", {"fail": 5}, max_attempts=1)
    slotd.enqueue(slotd_conn, "flaky", {"fail": 5}, max_attempts=2)
    slotd.enqueue(slotd_conn, "note", {"text": "held"})
    task_queue.deliver_next()
    task_queue.deliver_next()
    task_queue.drop_next()
    views = task_queue.pending(), task_queue.running(), task_queue.dead()
    assert all(type(t) is QueuedTask and isinstance(t, slotd.Task) for v in views for t in v)
    pending, running, dead = views
    # In delivery order: the held task is due, the failed one backs off.
    assert [(t.type, t.attempt, t.dead) for t in pending] == [
        ("note", 1, False),
        ("flaky", 1, False),
    ]
    assert "attempt 1 fails" in (pending[1].last_error or "")
    assert [t.type for t in running] == ["note"]
    assert [(t.type, t.attempt, t.dead) for t in dead] == [("flaky", 1, True)]


def test_outcome_is_exported_from_slotd() -> None:
    from slotd import Outcome as Exported

    assert Exported is Outcome


@registry.handler("touch_account", ceiling=MINUTE)
def touch_account(task: slotd.Task, ctx: slotd.Context) -> None:
    # A handler that opens its own connection, as application code does.
    with psycopg.connect(task.payload["url"], autocommit=True) as own:
        own.execute("UPDATE accounts SET touched = true WHERE id = 1")
    notes.append("touched")


@pytest.mark.parametrize("mode", ["eager", "manual"])
def test_a_handler_blocked_by_the_tests_transaction_fails_instead_of_hanging(
    mode: str, db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE accounts (id int PRIMARY KEY, touched bool)")
        setup.execute("INSERT INTO accounts VALUES (1, false)")
    with psycopg.connect(db_url) as conn, conn.transaction(force_rollback=True):
        conn.execute("UPDATE accounts SET touched = false WHERE id = 1")  # the test's lock
        if mode == "eager":
            with (
                eager(registry, conn),
                pytest.raises(BlockedByTest, match="test's connection") as e,
            ):
                slotd.enqueue(conn, "touch_account", {"url": db_url})
        else:
            slotd.enqueue(conn, "touch_account", {"url": db_url})
            with pytest.raises(BlockedByTest, match="test's connection") as e:
                ManualQueue(conn, registry).deliver_next()
        assert isinstance(e.value.__cause__, psycopg.errors.QueryCanceled)
    assert notes == []


@registry.handler("nap", ceiling=MINUTE)
def nap(task: slotd.Task, ctx: slotd.Context) -> None:
    import time

    time.sleep(task.payload["s"])  # past the lock watch's grace
    notes.append("napped")


def test_the_lock_watch_leaves_other_sessions_waiting_for_the_test_alone(db_url: str) -> None:
    import threading

    with psycopg.connect(db_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE accounts (id int PRIMARY KEY, touched bool)")
        setup.execute("INSERT INTO accounts VALUES (1, false)")
    outcome: list[Any] = []

    def other_test() -> None:  # a parallel test's session, not the handler's
        try:
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute("UPDATE accounts SET touched = true WHERE id = 1")
            outcome.append("updated")
        except psycopg.Error as exc:
            outcome.append(exc)

    with psycopg.connect(db_url) as conn, psycopg.connect(db_url, autocommit=True) as watcher:
        with conn.transaction(force_rollback=True):
            conn.execute("UPDATE accounts SET touched = false WHERE id = 1")
            thread = threading.Thread(target=other_test)
            thread.start()
            wait = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            for _ in range(3000):  # waits for a state, not for time
                if watcher.execute(wait).fetchone() != (0,):
                    break
                thread.join(0.01)
            with eager(registry, conn, propagate=True):
                slotd.enqueue(conn, "nap", {"s": 1.0})
        thread.join(30)
    assert outcome == ["updated"] and notes == ["napped"]


def test_eager_refuses_an_async_enqueue_with_a_reason(
    slotd_conn: psycopg.Connection[Any], db_url: str
) -> None:
    import asyncio

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as aconn:
            with pytest.raises(TypeError, match="asyncio connection"):
                await slotd.enqueue_async(aconn, "note", {"text": "x"})

    with eager(registry, slotd_conn):
        asyncio.run(main())


def test_eager_claims_on_the_connection_that_enqueued(
    slotd_conn: psycopg.Connection[Any], db_url: str
) -> None:
    with psycopg.connect(db_url) as other, eager(registry, slotd_conn):
        slotd.enqueue(other.cursor(), "note", {"text": "uncommitted elsewhere"})
        assert notes == [("uncommitted elsewhere", 1)]
        other.rollback()


def test_capture_and_eager_nest(
    task_queue: ManualQueue, slotd_conn: psycopg.Connection[Any]
) -> None:
    with task_queue.capture() as ids, eager(registry, slotd_conn):
        task_id = slotd.enqueue(slotd_conn, "note", {"text": "x"})
    assert ids == [task_id]
    assert notes == [("x", 1)]


# the plugin as installed: a user's project run through pytest

USER_CONFTEST = """
    import os

    import psycopg
    import pytest

    import slotd

    registry = slotd.Registry()
    sent = []


    @registry.handler("send_welcome", ceiling=__import__("datetime").timedelta(seconds=30))
    def send_welcome(task, ctx):
        sent.append(task.payload["email"])


    @pytest.fixture
    def slotd_conn():
        with psycopg.connect(os.environ["USER_TEST_DB"]) as conn:
            with conn.transaction(force_rollback=True):
                yield conn


    @pytest.fixture
    def slotd_registry():
        sent.clear()
        return registry
"""

USER_TESTS = """
    from datetime import timedelta

    import slotd
    from slotd.outcome import Outcome

    from conftest import sent


    def signup(conn, email):
        conn.execute("SELECT 1")  # the app's own writes would go here
        slotd.enqueue(conn, "send_welcome", {"email": email})


    def test_manual(task_queue, slotd_conn):
        with task_queue.capture() as ids:
            signup(slotd_conn, "ada@example.com")
        assert len(ids) == 1
        task_queue.fail_next(TimeoutError("smtp"))
        assert task_queue.deliver_next().outcome is Outcome.FAILURE
        task_queue.advance_time(timedelta(minutes=1))
        assert [s.outcome for s in task_queue.deliver_all()] == [Outcome.SUCCESS]
        task_queue.redeliver_last()
        assert sent == ["ada@example.com", "ada@example.com"]


    def test_eager(slotd_eager, slotd_conn):
        signup(slotd_conn, "grace@example.com")
        assert sent == ["grace@example.com"]
"""


def test_a_user_project_runs_through_the_installed_plugin(
    pytester: pytest.Pytester, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USER_TEST_DB", db_url)
    pytester.makeconftest(textwrap.dedent(USER_CONFTEST))
    pytester.makepyfile(test_user=textwrap.dedent(USER_TESTS))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_missing_user_fixtures_say_what_to_provide(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user="def test_it(task_queue):\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*needs a `slotd_conn` fixture*"])


def test_slotd_postgres_gives_a_throwaway_migrated_database(pytester: pytest.Pytester) -> None:
    try:
        find_bindir()
    except LocalPostgresError as exc:
        pytest.skip(str(exc))
    pytester.makeconftest(
        textwrap.dedent(
            """
            import psycopg
            import pytest
            import slotd

            registry = slotd.Registry()
            registry.register("noop", lambda task, ctx: None,
                              ceiling=__import__("datetime").timedelta(seconds=5))

            @pytest.fixture
            def slotd_conn(slotd_postgres):
                with psycopg.connect(slotd_postgres.new_database(), autocommit=True) as c:
                    yield c

            @pytest.fixture
            def slotd_registry():
                return registry
            """
        )
    )
    pytester.makepyfile(
        test_user="""
import slotd

def test_one(task_queue, slotd_conn):
    slotd.enqueue(slotd_conn, "noop")
    assert len(task_queue.deliver_all()) == 1

def test_two_gets_its_own_database(task_queue):
    assert task_queue.pending() == []
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
