"""The closed set of ways one attempt can end, as metrics and logs name them."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    TIMEOUT = "timeout"
    CONTINUED = "continued"
    CANCELLED = "cancelled"
    LOST = "lost"
    CRASHED = "crashed"
    # A typed handler's payload its model refused (slotd.typed.models): a dead letter at once.
    DISCARDED = "discarded"
    # Not an attempt's end: a task that reached its expires_in unstarted (the expiry sweep).
    EXPIRED = "expired"
    # The handler raised slotd.Snooze: due again later, no attempt spent.
    SNOOZED = "snoozed"
    # A durable sleep or event wait ended the attempt (its write released the lease).
    SUSPENDED = "suspended"
    # Not an attempt's end: a claim given back before its handler started (a prefetched task
    # at a stop, at its slot's death or past its wait bound; a chained claim that met a
    # shutdown), its attempt refunded. Counted apart from `cancelled`, which an attempt that
    # ran and was interrupted (or an operator's cancel) is: nothing ran here.
    RELEASED = "released"


# What the runner (or the slot on its behalf) reports about a handler call.
DONE = "done"
CONTINUE = "continue"
ERROR = "error"
SHUTDOWN = "shutdown"  # raised Cancelled, or still running when the shutdown grace ran out
KILLED = "killed"  # ended by the watchdog after the deadline and the kill grace
CRASHED = "crashed"  # the runner died under the handler
SNOOZE = "snooze"  # raised slotd.Snooze: Result.extra[SNOOZE_S] says for how long
SUSPEND = "suspend"  # a durable sleep or wait, already written: nothing left to settle

# Result.extra keys the handler's decisions (slotd/runner/decisions.py) give its settlement.
SNOOZE_S = "snooze_s"  # seconds until a snoozed task is due again
RETRY_IN_S = "retry_in_s"  # seconds until a failed task's next attempt (RetryAfter, backoff=)


@dataclass
class Result:
    """What a handler call came to, as plain data that crosses a pipe."""

    kind: str
    error: str | None = None
    advanced: bool = False
    past_deadline: bool = False
    duration: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # A type with keep_result: the return value as JSON text and how long to keep it (the
    # settlement stores it; see slotd/lifecycle/). None for every other type.
    value: str | None = None
    keep_s: float | None = None
    # A type with keep_history (and no keep_result, or a longer history): how long its
    # success stays answerable, without its value (slotd.result's state and attempts).
    history_s: float | None = None
    # The handler's exception itself, for the in-process test modes to chain; never sent
    # over the runner's pipe (an exception need not pickle), where `error` says it all.
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "exception": None}

    def fields(self) -> tuple[Any, ...]:
        """As plain values for the runner's pipe (`Result(*fields)` on the other end): a
        tuple pickles and loads at a fraction of a dataclass's cost, on every task."""
        return (
            self.kind,
            self.error,
            self.advanced,
            self.past_deadline,
            self.duration,
            self.extra,
            self.value,
            self.keep_s,
            self.history_s,
        )


def past(deadline: datetime) -> bool:
    return datetime.now(UTC) >= deadline


class MinuteTally:
    """Outcomes counted by (minute, task type, outcome) between two flushes: the
    supervisor's contribution to the dashboard's outcome chart (slotd_outcomes). The
    supervisor's loop adds, the chores thread drains (slotd.chores): the lock is held for a
    counter update or a swap, never across a statement."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.counts: Counter[tuple[datetime, str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, task_type: str, outcome: str) -> None:
        minute = datetime.fromtimestamp(self.clock() // 60 * 60, tz=UTC)
        with self._lock:
            self.counts[(minute, task_type, outcome)] += 1

    def drain(self) -> list[tuple[datetime, str, str, int]]:
        with self._lock:
            counts, self.counts = self.counts, Counter()
        return [(*key, n) for key, n in counts.items()]

    def restore(self, rows: list[tuple[datetime, str, str, int]]) -> None:
        """A flush that failed: keep its counts for the next one."""
        with self._lock:
            for minute, task_type, outcome, n in rows:
                self.counts[(minute, task_type, outcome)] += n
