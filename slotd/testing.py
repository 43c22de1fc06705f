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

import copy
import importlib
import logging
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from slotd import localpg, repository
from slotd import outcome as kinds
from slotd.config import Settings
from slotd.localpg import LocalPostgres
from slotd.outcome import Outcome
from slotd.processor import Result, Settlement, execute, process
from slotd.registry import Registry
from slotd.repository import Claimed, Executor, Repository, migrate
from slotd.task import Context, Task

__all__ = [
    "BlockedByTest",
    "Eager",
    "ManualQueue",
    "QueuedTask",
    "TaskFailed",
    "ThrowawayPostgres",
    "eager",
]

log = logging.getLogger("slotd.testing")

# The module, not the function of the same name that slotd/__init__ re-exports over it.
_enqueue_module = importlib.import_module("slotd.enqueue")


class TaskFailed(AssertionError):
    """Eager mode with propagate on: a handler run inline did not succeed. Chained to the
    handler's exception (``__cause__``) when it raised one."""


class BlockedByTest(TaskFailed):
    """A handler waited for a lock held by the test's own transaction; see "Handlers that
    need the database" above."""


@dataclass(frozen=True)
class QueuedTask(Task):
    """A row as the test modes' views show it: the Task a handler would get (`attempt` is
    the attempts made so far), what its last attempt said, and whether it is dead."""

    last_error: str | None = None
    dead: bool = False


def _connection(target: Executor) -> psycopg.Connection[Any]:
    if isinstance(target, psycopg.AsyncConnection | psycopg.AsyncCursor):
        raise TypeError(
            "slotd eager mode cannot run a task enqueued on an asyncio connection inline; "
            "enqueue on a sync connection in the test, or deliver it with task_queue"
        )
    return target.connection if isinstance(target, psycopg.Cursor) else target


def _failed(task: Task, settlement: Settlement, cls: type[TaskFailed] = TaskFailed) -> TaskFailed:
    last = (settlement.error or "").strip().splitlines()[-1:] or [""]
    reason = f": {last[0]}" if last[0] else ""
    dead = " (dead letter)" if settlement.dead else ""
    return cls(
        f"task {task.type}#{task.id} attempt {task.attempt}: {settlement.outcome}{dead}{reason}"
    )


class _LockWatch:
    """While a handler runs: is any session waiting for a lock the test's connection holds?
    The handler then waits for the test, which waits for the handler. Its statement is
    cancelled, so the test fails with a reason instead of hanging. The watcher connects
    only if the handler is still running after `grace` seconds: quick handlers cost
    nothing."""

    def __init__(self, conn: psycopg.Connection[Any], grace: float = 0.5, every: float = 0.1):
        self.holder = conn.info.backend_pid
        self.conninfo = psycopg.conninfo.make_conninfo(
            conn.info.dsn, **({"password": conn.info.password} if conn.info.password else {})
        )
        self.grace, self.every = grace, every
        self.blocked: list[int] = []
        self._handler_thread = threading.get_ident()  # the handler runs where we are made
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slotd-lock-watch", daemon=True)

    def __enter__(self) -> _LockWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        if self._done.wait(self.grace):
            return
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as watcher:
                while not self._done.wait(self.every):
                    waiting = repository.waiting_for(watcher, self.holder)
                    # Only the handler's own sessions: another process's session waiting
                    # for the test (a parallel test on a shared database) is none of ours.
                    mine = self._handler_sessions() if waiting else set()
                    for pid in waiting:
                        if pid in mine:
                            self.blocked.append(pid)
                            repository.cancel_backend(watcher, pid)
        except psycopg.Error:
            log.warning(
                "slotd lock watch could not connect; a handler blocked on the "
                "test's locks would hang",
                exc_info=True,
            )

    def _handler_sessions(self) -> set[int]:
        """Backend pids of the psycopg connections on the handler thread's stack right now
        (the one it is blocked in among them)."""
        frame = sys._current_frames().get(self._handler_thread)
        pids: set[int] = set()
        while frame is not None:
            for value in list(frame.f_locals.values()):
                conn = value.connection if isinstance(value, psycopg.Cursor) else value
                if isinstance(conn, psycopg.Connection) and not conn.closed:
                    pids.add(conn.pgconn.backend_pid)
            frame = frame.f_back
        pids.discard(self.holder)
        return pids

    def check(self, task: Task, settlement: Settlement) -> Settlement:
        if not self.blocked:
            return settlement
        raise BlockedByTest(
            f"task {task.type}#{task.id}: its handler waited for a lock held by the test's "
            f"transaction (session {self.blocked[0]} waited for the test's session "
            f"{self.holder}), and the test waits for the handler; slotd cancelled the "
            "handler's statement. Let the handler use the test's connection: see "
            "'Handlers that need the database' in the slotd.testing docstring."
        ) from settlement.exception


def _rebased(claimed: Claimed) -> Claimed:
    """The claim with its lease end moved onto the local clock, same length. Under a
    frozen transaction clock the stamp can lie in the past; see "Time inside a
    transaction" above. Only the deadline reads it: settlement is fenced by token."""
    length = claimed.lease_expires_at - claimed.claimed_at
    return replace(claimed, lease_expires_at=datetime.now(UTC) + length)


def _outcome_of(result: Result) -> Outcome:
    """How settle would classify `result`, for a run that has nothing to settle."""
    if result.kind == kinds.DONE:
        return Outcome.SUCCESS
    if result.kind == kinds.CONTINUE:
        return Outcome.TIMEOUT if result.past_deadline else Outcome.CONTINUED
    if result.kind == kinds.SHUTDOWN:
        return Outcome.CANCELLED
    return Outcome.TIMEOUT if result.past_deadline else Outcome.FAILURE


# enqueue hooks: eager mode and capture() both listen to slotd.enqueue, and may nest in
# either order, so they share one dispatcher instead of overwriting each other.

_hooks: list[Callable[[Executor, list[int]], None]] = []
_foreign_hook: Any = None


def _dispatch(target: Executor, ids: list[int]) -> None:
    for hook in list(_hooks):
        hook(target, ids)
    if _foreign_hook is not None:
        _foreign_hook(target, ids)


@contextmanager
def _hooked(hook: Callable[[Executor, list[int]], None], *, first: bool = False) -> Iterator[None]:
    global _foreign_hook
    if not _hooks and _enqueue_module._hook not in (None, _dispatch):
        _foreign_hook = _enqueue_module._hook  # someone else's hook keeps working
    # Recorders go first so that a capture() sees an id before eager mode runs its task
    # (which may enqueue more).
    _hooks.insert(0, hook) if first else _hooks.append(hook)
    _enqueue_module._hook = _dispatch
    try:
        yield
    finally:
        _hooks.remove(hook)
        if not _hooks:
            _enqueue_module._hook = _foreign_hook
            _foreign_hook = None


# eager mode


class Eager:
    """Runs each task enqueued under it inline; see the module docstring."""

    max_slices = 10_000  # a sliced handler that never finishes must not hang the test

    def __init__(self, registry: Registry, repo: Repository, *, propagate: bool = False) -> None:
        self.registry = registry
        self.repo = repo
        self.propagate = propagate
        self.settlements: list[tuple[Task, Settlement]] = []

    def _repo_for(self, target: Executor) -> Repository:
        # The enqueueing connection is the one certain to see its uncommitted row, so
        # the claim and the settlement go through it, with this repo's settings.
        conn = _connection(target)
        if conn is self.repo.write:
            return self.repo
        clone = copy.copy(self.repo)
        clone.write = clone.read = conn
        return clone

    def __call__(self, target: Executor, ids: list[int]) -> None:
        repo = self._repo_for(target)
        for task_id in dict.fromkeys(ids):  # a batch can name one live row twice (keys)
            self._run(repo, task_id)

    def _run(self, repo: Repository, task_id: int) -> None:
        for _ in range(self.max_slices):
            claimed = repo.claim([task_id], self.registry)
            if claimed is None:
                return  # delayed, backing off, unregistered type, or already run
            with _LockWatch(repo.write) as watch:
                settlement = process(repo, self.registry, _rebased(claimed))
            task = claimed.task()
            self.settlements.append((task, settlement))
            watch.check(task, settlement)
            if settlement.outcome is Outcome.CONTINUED:
                continue  # the daemon would claim the next slice at once; so do we
            if self.propagate and settlement.outcome is not Outcome.SUCCESS:
                raise _failed(task, settlement) from settlement.exception
            return
        raise TaskFailed(f"task {task_id}: still continuing after {self.max_slices} slices")


@contextmanager
def eager(
    registry: Registry,
    repo_or_conn: Repository | Executor,
    *,
    settings: Settings | None = None,
    propagate: bool = False,
) -> Iterator[Eager]:
    """Within the block, `slotd.enqueue` runs what it enqueued inline before returning.
    `repo_or_conn` gives the settings (lease margin, backoff) and the connection used when
    the enqueue's own is the same; an enqueue on another connection is claimed on that
    one, the only one certain to see the row."""
    if isinstance(repo_or_conn, Repository):
        repo = repo_or_conn
    else:
        repo = Repository.from_settings(settings or Settings(), _connection(repo_or_conn))
    runner = Eager(registry, repo, propagate=propagate)
    with _hooked(runner):
        yield runner


# manual mode


def _as_exception(exc: BaseException | type[BaseException] | None) -> BaseException:
    if exc is None:
        return RuntimeError("failure injected by task_queue.fail_next()")
    return exc() if isinstance(exc, type) else exc


class ManualQueue:
    """Delivery driven by the test, on the test's own connection and transaction.

    Nothing runs unless a verb says so; every verb that runs a handler goes through
    `slotd.processor.process`, and every write is one the daemon would make."""

    def __init__(
        self,
        conn: Executor,
        registry: Registry,
        settings: Settings | None = None,
    ) -> None:
        self.conn = _connection(conn)
        self.registry = registry
        self.settings = settings or Settings()
        self.repo = Repository.from_settings(self.settings, self.conn)
        self.history: list[tuple[Task, Settlement]] = []
        self._failures: deque[BaseException] = deque()
        self._last: Claimed | None = None
        self._last_dropped = False
        self._schedules: Any = None  # slotd.scheduler.Evaluator, once schedules are used

    # capture

    @contextmanager
    def capture(self) -> Iterator[list[int]]:
        """Record the ids of tasks enqueued (through slotd.enqueue / enqueue_many, on any
        connection) inside the block. The rows are really written; the list fills as
        enqueues happen. An enqueue whose key matched a live row records that row's id."""
        ids: list[int] = []

        def record(_target: Executor, new: list[int]) -> None:
            ids.extend(i for i in new if i not in ids)

        with _hooked(record, first=True):
            yield ids

    # delivery

    def _begin(self) -> None:
        # On a non-autocommit connection with no transaction open, the repository's
        # `with conn.transaction()` would BEGIN ... COMMIT. Opening the transaction first
        # turns every queue write into a savepoint, so slotd never commits for the test.
        if (
            not self.conn.autocommit
            and self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        ):
            repository.ping(self.conn)

    def _claim_next(self) -> Claimed | None:
        self._begin()
        ids = self.repo.discover(self.registry.types, limit=1)
        return self.repo.claim(ids, self.registry) if ids else None

    def _before(self) -> Callable[[], None] | None:
        if not self._failures:
            return None
        exc = self._failures.popleft()

        def fail() -> None:
            raise exc

        return fail

    def _run(self, claimed: Claimed) -> Settlement:
        self._last, self._last_dropped = claimed, False
        with _LockWatch(self.conn) as watch:
            settlement = process(self.repo, self.registry, _rebased(claimed), before=self._before())
        self.history.append((claimed.task(), settlement))
        return watch.check(claimed.task(), settlement)

    def deliver_next(self) -> Settlement | None:
        """Claim the first due task in delivery order (run_at less the priority's head start,
        then id), run it and settle it; None when nothing is due. A pending fail_next()
        applies to this delivery."""
        claimed = self._claim_next()
        return self._run(claimed) if claimed is not None else None

    def deliver_all(self, limit: int = 1000) -> list[Settlement]:
        """deliver_next() until nothing is due. What a delivery makes due again (a sliced
        task that continued) is delivered too; what it defers (a backoff) is not."""
        settlements: list[Settlement] = []
        while len(settlements) < limit:
            settled = self.deliver_next()
            if settled is None:
                break
            settlements.append(settled)
        return settlements

    def fail_next(self, exc: BaseException | type[BaseException] | None = None) -> None:
        """The next delivery that runs a handler raises `exc` in its place (the handler is
        not called), and is settled as a failure by the same settle path: backoff, or a
        dead letter on the final attempt. Calls queue up: two arm the next two."""
        self._failures.append(_as_exception(exc))

    def drop_next(self) -> Task | None:
        """The worker vanished: the first due task is claimed -- attempt counted, lease
        taken -- and then nothing happens. The handler is not run and nothing is settled;
        the row stays leased until expire_leases() or advance_time() past the lease (the
        ceiling plus the margin), after which deliver_next() redelivers it. On its final
        attempt it becomes a dead letter when the lease lapses."""
        claimed = self._claim_next()
        if claimed is None:
            return None
        self._last, self._last_dropped = claimed, True
        return claimed.task()

    def redeliver_last(self) -> Settlement:
        """At-least-once: the last delivery (or drop) happens again -- its handler runs
        once more with the task exactly as it was delivered (same id and payload, the
        attempt one higher).

        - The row still exists and the queue would hand it out now (due, not leased:
          e.g. a sliced task that continued) -- or it was dropped, whose lease is made to
          lapse first: the duplicate claims it with a fresh lease and is settled
          normally (attempt counted, success deletes, failure backs off).
        - Otherwise (the usual case: it succeeded and the row is gone; or it is backing
          off, or dead): the duplicate runs as a late worker without a lease. Nothing is
          written -- a cursor advance is refused with LeaseLost, as a late worker's is --
          and the returned settlement says what the handler did."""
        last = self._last
        if last is None:
            raise RuntimeError("redeliver_last(): nothing has been delivered yet")
        self._begin()
        row = self.repo.lease_of(last.id)
        if row is not None and self._last_dropped and row[0] == last.token and row[1]:
            # Lapse only the dropped lease, by its own token: other leases keep theirs.
            self.repo.release(last.id, last.token, "lease lapsed (task_queue.redeliver_last)")
        claimed = self.repo.claim([last.id], self.registry) if row is not None else None
        if claimed is not None:
            return self._run(replace(claimed, payload=last.payload))
        return self._run_late(last)

    def _run_late(self, last: Claimed) -> Settlement:
        handler = self.registry.get(last.task_type)
        assert handler is not None  # it was delivered, so its type is registered
        duplicate = replace(last, attempt=last.attempt + 1)
        deadline = datetime.now(UTC) + handler.ceiling
        ctx = Context(
            duplicate.task(),
            deadline,
            # Fenced on the old token like any late worker's write: refused unless the
            # row is somehow still under that lease.
            lambda payload: self.repo.advance_cursor(last.id, last.token, payload),
        )
        with _LockWatch(self.conn) as watch:
            result = execute(handler, ctx, self._before())
        outcome = _outcome_of(result)
        failed = outcome is not Outcome.SUCCESS
        settlement = Settlement(
            outcome,
            False,
            result.duration,
            error=result.error if failed else None,
            exception=result.exception if failed else None,
        )
        watch.check(duplicate.task(), settlement)
        log.info(
            "task %s#%s duplicate delivery without a lease: %s (nothing written)",
            last.task_type,
            last.id,
            settlement.outcome,
        )
        self._last, self._last_dropped = duplicate, False
        self.history.append((duplicate.task(), settlement))
        return settlement

    # time

    def expire_leases(self) -> int:
        """End every live lease now, as if their holders' time ran out; returns how many."""
        self._begin()
        return self.repo.expire_leases()

    def advance_time(self, delta: timedelta | float) -> None:
        """Let `delta` (a timedelta or seconds) pass for the queue: delays, backoffs and
        leases that end within it are over. The rows move back in time, not the clock."""
        seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
        if seconds < 0:
            raise ValueError("advance_time(): time only moves forward")
        self._begin()
        schedules = self._declared()  # declared before the time passes, so it counts
        self.repo.shift_time(seconds)
        if schedules is not None:
            schedules.offset += seconds

    # schedules

    def _declared(self) -> Any:
        if not self.registry.schedules:
            return None
        if self._schedules is None:
            from slotd.scheduler import Evaluator

            self._schedules = Evaluator(
                self.registry.schedules, "pytest", self.settings.max_attempts
            )
            self._schedules.declare(self.repo)
        return self._schedules

    def fire_schedules(self) -> list[QueuedTask]:
        """Fire the registry's schedules that are due, as a replica would -- the same plan
        and the same compare-and-set statement -- and return the tasks enqueued, oldest
        fire time first. Time passes only by advance_time(): the first call (or the first
        advance_time) creates the schedule rows, so a new schedule has nothing due until
        time is advanced past its next fire time. The tasks' keys carry their fire times;
        their run_at is the fire time on the queue's frozen clock (advance_time moves rows
        back instead of moving the clock forward), so they are due at once."""
        schedules = self._declared()
        if schedules is None:
            return []
        self._begin()
        schedules.declare(self.repo)  # reads the clock: now() plus the time advanced
        fired = schedules.fire_due(self.repo, schedules.clock_read)
        ids = [task_id for f in fired for task_id in f.task_ids]
        by_id = {task.id: task for task in self.pending()}
        return [by_id[task_id] for task_id in ids if task_id in by_id]

    # views

    def _tasks(self, view: str, task_type: str | None) -> list[QueuedTask]:
        self._begin()
        return [QueuedTask(*row) for row in self.repo.task_view(view, task_type)]

    def pending(self, task_type: str | None = None) -> list[QueuedTask]:
        """Every task still owed a run: due, delayed, backing off or leased; not dead."""
        return self._tasks("pending", task_type)

    def running(self, task_type: str | None = None) -> list[QueuedTask]:
        """Tasks under a live lease (in a manual queue: the dropped ones)."""
        return self._tasks("running", task_type)

    def dead(self, task_type: str | None = None) -> list[QueuedTask]:
        """Dead letters, newest first, as `slotd dead list` shows them."""
        return self._tasks("dead", task_type)

    @property
    def last_task(self) -> Task | None:
        """The task the last delivery (or drop, or redelivery) handed out."""
        return self._last.task() if self._last is not None else None


# a throwaway server, for users without a test database


@dataclass
class ThrowawayPostgres:
    """A private PostgreSQL for the test session, with a migrated template database."""

    server: LocalPostgres
    url: str  # a migrated database shared by the session
    _count: int = 0

    def new_database(self) -> str:
        """A fresh migrated database (a copy of the template: milliseconds), its URL."""
        self._count += 1
        name = f"slotd_test_{self._count}"
        with psycopg.connect(self.server.url(), autocommit=True) as conn:
            repository.create_database(conn, name, template="slotd_template")
        return str(self.server.url(name))


@contextmanager
def throwaway_postgres() -> Iterator[ThrowawayPostgres]:
    with localpg.scratch(prefix="slotd-pytest-") as server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            repository.create_database(conn, "slotd_template")
        with psycopg.connect(server.url("slotd_template"), autocommit=True) as conn:
            migrate(conn)
        pg = ThrowawayPostgres(server, "")
        pg.url = pg.new_database()
        yield pg


# fixtures

_PROVIDE = (
    "slotd's pytest plugin needs a `{name}` fixture from your conftest.py: {what}. "
    "See the docstring of slotd.testing for an example."
)


@pytest.fixture
def slotd_conn() -> psycopg.Connection[Any]:
    """Override in your conftest: a psycopg 3 connection to a migrated database."""
    pytest.fail(
        _PROVIDE.format(
            name="slotd_conn",
            what="a psycopg 3 connection to a database migrated with `slotd migrate` "
            "(or request `slotd_postgres` for a throwaway server)",
        ),
        pytrace=False,
    )


@pytest.fixture
def slotd_registry() -> Registry:
    """Override in your conftest: the slotd.Registry whose handlers the tests run."""
    pytest.fail(_PROVIDE.format(name="slotd_registry", what="your slotd.Registry"), pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slotd_eager(propagate=False): options of the slotd_eager fixture; propagate=True "
        "makes a failing task raise TaskFailed from enqueue",
    )


@pytest.fixture
def slotd_eager(
    request: pytest.FixtureRequest, slotd_registry: Registry, slotd_conn: psycopg.Connection[Any]
) -> Iterator[Eager]:
    """Eager mode for the test: slotd.enqueue runs the task inline. Options come from
    `@pytest.mark.slotd_eager(propagate=True)` or an indirect parameter
    (`@pytest.mark.parametrize("slotd_eager", [{"propagate": True}], indirect=True)`)."""
    marker = request.node.get_closest_marker("slotd_eager")
    options = {**(marker.kwargs if marker else {}), **getattr(request, "param", {})}
    unknown = sorted(set(options) - {"propagate"})
    if unknown:
        pytest.fail(f"slotd_eager takes only propagate=...; got {unknown}", pytrace=False)
    with eager(slotd_registry, slotd_conn, propagate=bool(options.get("propagate"))) as runner:
        yield runner


@pytest.fixture
def task_queue(slotd_conn: psycopg.Connection[Any], slotd_registry: Registry) -> ManualQueue:
    """Manual mode: a ManualQueue on the test's connection and transaction."""
    return ManualQueue(slotd_conn, slotd_registry)


@pytest.fixture(scope="session")
def slotd_postgres() -> Iterator[ThrowawayPostgres]:
    """Opt-in: a throwaway PostgreSQL for the session (needs the server binaries)."""
    with throwaway_postgres() as pg:
        yield pg
