"""Manual mode: the test drives delivery, verb by verb, on its own connection and
transaction (see "Manual mode" in the slotd.testing docstring)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from slotd import outcome as kinds
from slotd import repository
from slotd.config import Settings
from slotd.lifecycle import Settlement
from slotd.outcome import Outcome, Result
from slotd.registry import Registry
from slotd.repository import Claimed, Executor, Repository
from slotd.runner.processor import execute, process
from slotd.task import Context, Task
from slotd.testing.hooks import _hooked
from slotd.testing.inline import _connection, _LockWatch, _rebased

log = logging.getLogger("slotd.testing")


@dataclass(frozen=True)
class QueuedTask(Task):
    """A row as the test modes' views show it: the Task a handler would get (`attempt` is
    the attempts made so far), what its last attempt said, and whether it is dead."""

    last_error: str | None = None
    dead: bool = False


def _outcome_of(result: Result) -> Outcome:
    """How settle would classify `result`, for a run that has nothing to settle."""
    if result.kind == kinds.DONE:
        return Outcome.SUCCESS
    if result.kind == kinds.CONTINUE:
        return Outcome.TIMEOUT if result.past_deadline else Outcome.CONTINUED
    if result.kind == kinds.SHUTDOWN:
        return Outcome.CANCELLED
    if result.kind == kinds.SNOOZE:
        return Outcome.SNOOZED
    return Outcome.TIMEOUT if result.past_deadline else Outcome.FAILURE


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

        def record(_target: Executor, new: list[int], _schema: str) -> None:
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
            steps=last.steps,
            write_step=lambda i, name, text: self.repo.record_step(
                last.id, last.token, i, name, text
            ),
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
            from slotd.supervisor.scheduler import Evaluator

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
