"""What a handler sees: the task it runs and the context it runs under."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slotd.errors import Cancelled, DeadlineExceeded, LeaseLost
from slotd.payload import encode


@dataclass(frozen=True)
class Task:
    id: int
    type: str
    payload: dict[str, Any]
    attempt: int
    key: str | None
    run_at: datetime
    # The W3C trace context recorded at enqueue (the propagator's headers: "traceparent",
    # "tracestate"), or None: the producer had no active span or no opentelemetry-api.
    # Keyword-only: Task(id, type, payload, attempt, key, run_at) keeps its meaning, and so
    # do subclasses that add fields (slotd.testing.QueuedTask).
    trace_context: Mapping[str, str] | None = field(default=None, kw_only=True)
    # A dependant's parents' stored values, delivered by its claim (enqueue(..., after=)).
    parent_results: dict[int, Any] = field(default_factory=dict, kw_only=True)


_TASK_LOG = logging.getLogger("slotd.task")


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
        write_cursor: Callable[[str], bool],
        is_cancelled: Callable[[], bool] = lambda: False,
        log: logging.Logger | None = None,
        write_cursor_async: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.task = task
        self.deadline = deadline
        self._write_cursor = write_cursor
        self._write_cursor_async = write_cursor_async
        self._is_cancelled = is_cancelled
        self.advanced = False
        # What a middleware adds to every line about this attempt (slotd's tracing: trace_id,
        # span_id): ctx.log's lines, and the settlement's line, which the slot writes.
        self.log_fields: dict[str, Any] = {}
        base = log or _TASK_LOG
        self.log = TaskLogAdapter(
            base, {"task_id": task.id, "task_type": task.type, "attempt": task.attempt}
        )

    def add_log_fields(self, **fields: Any) -> None:
        """Carry `fields` on ctx.log's lines and on slotd's own line settling this attempt
        (plain values: they cross the runner's pipe)."""
        self.log_fields.update(fields)
        self.log.extra = {**(self.log.extra or {}), **fields}

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
        the row belongs to the queue again, so return False (continue) next.

        A payload PostgreSQL could not store raises TypeError here, in the handler's frame.
        From async code this works too but holds the loop for the round trip; prefer
        `await ctx.advance_cursor_async(...)` there."""
        self._advanced(self._write_cursor(self._encode(payload)))

    async def advance_cursor_async(self, payload: Mapping[str, Any]) -> None:
        """advance_cursor for `async def` handlers: the loop keeps running meanwhile."""
        body = self._encode(payload)
        if self._write_cursor_async is None:
            ok = self._write_cursor(body)
        else:
            ok = await self._write_cursor_async(body)
        self._advanced(ok)

    def _encode(self, payload: Mapping[str, Any]) -> str:
        if not isinstance(payload, Mapping):
            raise TypeError("advance_cursor takes the new payload, a JSON object")
        return encode(payload, f"task {self.task.id} cursor")

    def _advanced(self, ok: bool) -> None:
        if not ok:
            raise LeaseLost(f"task {self.task.id}: cursor refused, the lease was taken over")
        self.advanced = True
