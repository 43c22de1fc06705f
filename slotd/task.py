"""What a handler sees: the task it runs and the context it runs under."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slotd.errors import Cancelled, DeadlineExceeded, LeaseLost


@dataclass(frozen=True)
class Task:
    id: int
    type: str
    payload: dict[str, Any]
    attempt: int
    key: str | None
    run_at: datetime


class TaskLogAdapter(logging.LoggerAdapter):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs


class Context:
    """Cooperative cancellation plus the one queue write a handler makes.

    The deadline comes from the database's lease stamp minus the margin; comparing it with
    the local clock here is the single place that mixes the two clocks, which the margin
    (seconds) makes safe against realistic skew (milliseconds)."""

    def __init__(
        self,
        task: Task,
        deadline: datetime,
        write_cursor: Callable[[dict[str, Any]], bool],
        is_cancelled: Callable[[], bool] = lambda: False,
        log: logging.Logger | None = None,
    ) -> None:
        self.task = task
        self.deadline = deadline
        self._write_cursor = write_cursor
        self._is_cancelled = is_cancelled
        self.advanced = False
        base = log or logging.getLogger("slotd.task")
        self.log = TaskLogAdapter(
            base, {"task_id": task.id, "task_type": task.type, "attempt": task.attempt}
        )

    def remaining(self) -> float:
        return (self.deadline - datetime.now(UTC)).total_seconds()

    @property
    def shutting_down(self) -> bool:
        return self._is_cancelled()

    @property
    def cancelled(self) -> bool:
        return self._is_cancelled() or self.remaining() <= 0

    def check(self) -> None:
        if self._is_cancelled():
            raise Cancelled("the replica is shutting down")
        if self.remaining() <= 0:
            raise DeadlineExceeded(f"task {self.task.id} passed its deadline")

    def advance_cursor(self, payload: Mapping[str, Any]) -> None:
        """Commit progress: new payload, due now, attempts reset, lease cleared. After this
        the row belongs to the queue again, so return False (continue) next."""
        if not isinstance(payload, Mapping):
            raise TypeError("advance_cursor takes the new payload, a JSON object")
        if not self._write_cursor(dict(payload)):
            raise LeaseLost(f"task {self.task.id}: cursor refused, the lease was taken over")
        self.advanced = True
