"""slotd's pytest plugin: test your handlers against your own PostgreSQL test database.

Installed with slotd and registered by entry point, it starts nothing (no server, no
connection, no thread) until a test asks for one of its fixtures. Every mode runs handlers
through ``slotd.processor.process`` -- the claim, the deadline, ``execute`` and the fenced
``settle`` the daemon uses -- so a test cannot pass on a path production never takes.

You provide two fixtures
------------------------
``slotd_conn``
    a psycopg 3 connection to a database migrated with ``slotd migrate`` (or
    ``slotd.repository.migrate(conn)``). It may be autocommit, or sit inside the test's
    own transaction (non-autocommit, rolled back after the test): slotd never commits it.
``slotd_registry``
    your ``slotd.Registry``.

Example ``conftest.py``::

    import os

    import psycopg
    import pytest

    from slotd.repository import migrate
    from myapp.tasks import registry

    URL = os.environ.get("TEST_DATABASE_URL", "postgresql:///myapp_test")


    @pytest.fixture(scope="session")
    def _slotd_schema() -> None:
        with psycopg.connect(URL, autocommit=True) as conn:
            migrate(conn)


    @pytest.fixture
    def slotd_conn(_slotd_schema):
        # One transaction per test, rolled back at the end: tasks enqueued by the test
        # never leak into the next one, and nothing is ever committed.
        with psycopg.connect(URL) as conn, conn.transaction(force_rollback=True):
            yield conn


    @pytest.fixture
    def slotd_registry():
        return registry

No database at hand? Request ``slotd_postgres`` (session-scoped) and it starts a
throwaway PostgreSQL from the host's server binaries, with a migrated template::

    @pytest.fixture
    def slotd_conn(slotd_postgres):
        with psycopg.connect(slotd_postgres.new_database()) as conn:
            yield conn

Eager mode
----------
``slotd_eager`` (or ``with slotd.testing.eager(registry, conn):``): ``slotd.enqueue`` writes
the row and then claims, runs and settles it inline before returning. A sliced handler
runs slice after slice until it is done. What the daemon would not run now is not run
either: a delayed task (``delay=``), a task type the registry lacks, a key that matched a
live row waiting out its backoff -- those stay pending. A failing handler is settled as a
failure (backoff) and ``enqueue`` returns normally; ``settlement.error`` holds its
traceback. With propagate on, ``enqueue`` raises ``TaskFailed`` instead, chained to the
handler's own exception (``raise ... from``, so pytest shows both)::

    @pytest.mark.slotd_eager(propagate=True)        # for one test (or a module: pytestmark)
    def test_signup(slotd_eager, slotd_conn): ...

    @pytest.mark.parametrize("slotd_eager", [{"propagate": True}], indirect=True)
    def test_signup_too(slotd_eager, slotd_conn): ...

``eager.settlements`` lists ``(task, settlement)`` for each run. Tasks enqueued with
``slotd.enqueue_async`` on an asyncio connection cannot be run inline (the handler would
need the caller's event loop): eager mode refuses them with a TypeError; use
``task_queue`` on a sync connection to the same database instead.

Handlers that need the database
-------------------------------
In the test modes a handler runs in the test's process while the test's transaction is
open. If the handler opens its own connection, it cannot see the test's uncommitted rows,
and a write to a row the test holds a lock on would wait for the test, which waits for
the handler. Give the handler the test's connection instead, through whatever your
application uses to hand connections out::

    # myapp/db.py
    def connection():                      # the application's pool, in production
        return pool.connection()

    # myapp/tasks.py
    @registry.handler("send_welcome", ceiling=timedelta(seconds=30))
    def send_welcome(task, ctx):
        with db.connection() as conn:
            conn.execute("UPDATE users SET welcomed = true WHERE id = %s", (task.payload["id"],))

    # conftest.py
    @pytest.fixture(autouse=True)
    def handlers_use_the_test_connection(slotd_conn, monkeypatch):
        monkeypatch.setattr(myapp.db, "connection", lambda: contextlib.nullcontext(slotd_conn))

That wait cannot hang a test: while a handler runs, a watcher asks PostgreSQL whether one
of the handler's own sessions (a psycopg connection on the handler's stack) is waiting for a
lock the test's connection holds; if one is, slotd cancels that statement (the handler
fails with QueryCanceled) and the delivery raises ``BlockedByTest`` (a ``TaskFailed``)
saying so, whatever ``propagate`` says. Sessions of other processes waiting for the test
(a parallel test on a shared database) are left alone.

Manual mode
-----------
``task_queue`` is a ``ManualQueue``: enqueues are real rows in your transaction, and the
test drives delivery in its own thread and on its own connection::

    def test_signup_sends_welcome(task_queue, slotd_conn):
        with task_queue.capture() as ids:
            signup(slotd_conn, "ada@example.com")       # calls slotd.enqueue(...)
        assert [t.type for t in task_queue.pending()] == ["send_welcome"]

        task_queue.fail_next(TimeoutError("smtp"))      # the first attempt fails...
        assert task_queue.deliver_next().outcome is Outcome.FAILURE
        assert task_queue.deliver_all() == []           # ...and backs off
        task_queue.advance_time(timedelta(minutes=1))   # the backoff elapses
        assert [s.outcome for s in task_queue.deliver_all()] == [Outcome.SUCCESS]

        task_queue.redeliver_last()                     # at-least-once: run it again
        assert outbox.count("ada@example.com") == 1     # the handler is idempotent

Verbs: ``capture()``, ``deliver_next()``, ``deliver_all(limit)``, ``redeliver_last()``,
``fail_next(exc)``, ``drop_next()``, ``expire_leases()``, ``advance_time(delta)``,
``fire_schedules()``; views: ``pending()``, ``running()``, ``dead()`` (each a list of
``QueuedTask``: a ``slotd.Task`` plus ``last_error`` and ``dead``), ``history``. ``Outcome``
is ``from slotd import Outcome``.

Schedules (``registry.schedule``) fire only when the test says so, through the daemon's own
plan and compare-and-set statement::

    task_queue.advance_time(timedelta(minutes=5))      # a 5-minute schedule comes due
    (task,) = task_queue.fire_schedules()              # enqueued once, oldest fire first
    assert task_queue.fire_schedules() == []           # that fire time is done
    task_queue.deliver_all()

The first ``advance_time`` or ``fire_schedules`` creates the schedule rows (a new schedule
never back-fills); catch-up and the overlap rule apply as in the daemon. Eager mode never
fires schedules: nothing in it lets time pass.

Time inside a transaction
-------------------------
PostgreSQL's ``now()`` is the start of the current transaction, so on a transactional
``slotd_conn`` the queue's clock stands still for the whole test. Consequences, all
deliberate:

- Nothing becomes due by waiting: a delay, a backoff and a lease end only when the test
  says so, with ``advance_time`` (moves the rows' run_at / lease_expires_at /
  last_attempted_at back; the clock itself cannot move) or ``expire_leases``. On an
  autocommit connection the clock runs, but backoffs (15 s and up) and leases (the
  ceiling plus 30 s) are far longer than a test, so the same calls are needed there too:
  tests read the same in both.
- A lease stamped at claim is ``now() + ceiling + margin`` with a ``now()`` that may be
  long past. The handler's deadline is therefore re-based on the local clock at the
  moment of delivery (same length: the ceiling), so a handler is never refused as "past
  its deadline" because the test's transaction is old. Fencing is by lease token, never
  by time, so settlement is unaffected.
- Every task enqueued in one transaction has the same run_at; delivery order among them
  is by id, i.e. enqueue order.
- The queue's writes are savepoints inside your transaction; their ``SET LOCAL``
  statement and lock timeouts (30 s / 5 s) stay in force for the rest of it.
- ``advance_time`` and ``expire_leases`` act on every row of slotd_tasks, not only the
  test's: on a database shared by tests that commit, give each test its own database or
  its own transaction.
"""

from __future__ import annotations

from importlib.util import find_spec

from slotd.testing.eager import Eager, eager
from slotd.testing.eager import _failed as _failed

# The fixtures are pytest's; the modes themselves are not: `with eager(...)` and
# ManualQueue work under any test runner (Django's unittest-based one, with slotd[django]
# and no pytest installed).
if find_spec("pytest") is not None:
    from slotd.testing.fixtures import pytest_configure as pytest_configure
    from slotd.testing.fixtures import slotd_conn as slotd_conn
    from slotd.testing.fixtures import slotd_eager as slotd_eager
    from slotd.testing.fixtures import slotd_postgres as slotd_postgres
    from slotd.testing.fixtures import slotd_registry as slotd_registry
    from slotd.testing.fixtures import task_queue as task_queue
from slotd.testing.hooks import _dispatch as _dispatch
from slotd.testing.hooks import _hooked as _hooked
from slotd.testing.inline import BlockedByTest, TaskFailed
from slotd.testing.inline import _connection as _connection
from slotd.testing.inline import _LockWatch as _LockWatch
from slotd.testing.inline import _rebased as _rebased
from slotd.testing.manual import ManualQueue, QueuedTask
from slotd.testing.manual import _as_exception as _as_exception
from slotd.testing.manual import _outcome_of as _outcome_of
from slotd.testing.postgres import ThrowawayPostgres
from slotd.testing.postgres import throwaway_postgres as throwaway_postgres

__all__ = [
    "BlockedByTest",
    "Eager",
    "ManualQueue",
    "QueuedTask",
    "TaskFailed",
    "ThrowawayPostgres",
    "eager",
]
