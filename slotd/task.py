"""What a handler sees: the task it runs and the context it runs under."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from slotd.errors import Cancelled, DeadlineExceeded, LeaseLost, StepMismatch, Suspended
from slotd.payload import encode, encode_result

# A step's stored value, written to the slot (the runner's pipe) and stored: (place in the
# run, name, JSON text) -> whether the fenced write matched.
StepWriter = Callable[[int, str, str], bool]
AsyncStepWriter = Callable[[int, str, str], Awaitable[bool]]
# A durable wait (place, step name, event or None, seconds or None) -> (verdict, data).
WaitWriter = Callable[[int, str, str | None, float | None], tuple[str, Any]]
AsyncWaitWriter = Callable[[int, str, str | None, float | None], Awaitable[tuple[str, Any]]]
_NOT_STORED = object()

# A task's payload: its JSON object (a dict), or the model its handler declared with
# payload= (slotd.typed.models), built from that object when a slot claims it.
P = TypeVar("P")


@dataclass(frozen=True)
class Task(Generic[P]):
    id: int
    type: str
    payload: P
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
        *,
        steps: Sequence[Mapping[str, Any]] | None = None,
        write_step: StepWriter | None = None,
        write_step_async: AsyncStepWriter | None = None,
        write_wait: WaitWriter | None = None,
        write_wait_async: AsyncWaitWriter | None = None,
    ) -> None:
        self.task = task
        # Durable steps: what earlier attempts stored (name, value), in the order they ran,
        # and the names this run has taken so far (matched against them by place).
        self._stored: list[tuple[str, Any]] = [(s["name"], s["value"]) for s in steps or ()]
        self._taken: list[str] = []
        self._write_step = write_step
        self._write_step_async = write_step_async
        self._write_wait = write_wait
        self._write_wait_async = write_wait_async
        self._sleeps = 0  # this run's sleeps, which name their steps
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

    # durable steps (#38)

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once per task: its return value (JSON) is stored, fenced
        on the lease, before this returns it; a later attempt of the task (a retry, after
        a crash, a kill, a rollout) gets the stored value back without calling `fn`.

        Steps are matched by name, in the order the handler takes them: a name taken twice
        in one run is the handler's error (ValueError), a value that is not JSON too
        (TypeError), and a run whose step differs from the one stored at its place (the
        code changed under the task) raises StepMismatch naming both. What is returned is
        the value as stored (JSON: a tuple comes back a list), on every attempt alike."""
        index, stored = self._replay(name)
        if stored is not _NOT_STORED:
            return stored
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            close = getattr(value, "close", None)
            if close is not None:
                close()
            raise TypeError(
                f"step {name!r}: fn returned an awaitable; use `await ctx.step_async(...)`"
            )
        text = self._step_text(name, value)
        if self._write_step is None:
            raise RuntimeError("durable steps need a queue to store them in")
        return self._stepped(index, name, text, self._write_step(index, name, text))

    async def step_async(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`step` for `async def` handlers: `fn` may be a coroutine function (awaited) or a
        plain one; the loop keeps running while the slot stores the value."""
        index, stored = self._replay(name)
        if stored is not _NOT_STORED:
            return stored
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        text = self._step_text(name, value)
        if self._write_step_async is not None:
            ok = await self._write_step_async(index, name, text)
        elif self._write_step is not None:
            ok = self._write_step(index, name, text)
        else:
            raise RuntimeError("durable steps need a queue to store them in")
        return self._stepped(index, name, text, ok)

    @property
    def steps_taken(self) -> list[str]:
        """The names of the steps this run has taken (stored or replayed), in order."""
        return list(self._taken)

    def _replay(self, name: str) -> tuple[int, Any]:
        """The step's place in this run, and its stored value when an earlier attempt
        stored it there (else _NOT_STORED: run it)."""
        if not isinstance(name, str) or not name:
            raise TypeError("a step's name must be a non-empty string")
        if name in self._taken:
            raise ValueError(
                f"task {self.task.id}: step {name!r} taken twice in one run; a step's name"
                " must be unique within the handler (in a loop, name each: f'charge:{i}')"
            )
        index = len(self._taken)
        if index >= len(self._stored):
            return index, _NOT_STORED
        stored_name, value = self._stored[index]
        if stored_name != name:
            raise StepMismatch(
                f"task {self.task.id}: step {index + 1} of this run is {name!r}, but an"
                f" earlier attempt stored {stored_name!r} there: the handler's steps changed"
                " under a task that had taken some (see 'Changing a workflow' in the docs)"
            )
        self._taken.append(name)
        return index, value

    def _step_text(self, name: str, value: Any) -> str:
        try:
            return encode_result(value, f"task {self.task.id} step {name!r}")
        except TypeError as exc:
            raise TypeError(str(exc).replace("return value", "value")) from None

    def _stepped(self, index: int, name: str, text: str, ok: bool) -> Any:
        if not ok:
            raise LeaseLost(
                f"task {self.task.id}: step {name!r} not stored, the lease was taken over"
            )
        value = json.loads(text)
        self._taken.append(name)
        self._stored.append((name, value))
        return value

    # durable sleeps and events (#38)

    def sleep(self, duration: timedelta) -> None:
        """A durable sleep: the attempt ends here and frees its slot; the task is
        `waiting`, and runs again from the top after `duration`, its steps replayed and
        this sleep served. Costs no attempt."""
        self._wait_now(*self._sleep_args(_seconds(duration, "ctx.sleep")))

    def sleep_until(self, when: datetime) -> None:
        """`sleep` until an aware datetime."""
        self.sleep(_until(when))

    def wait_event(self, name: str, timeout: timedelta | None = None) -> Any:
        """Wait, durably, for `slotd.emit(conn, name, data)`: its JSON data, or None when
        `timeout` passes first. An emit committed before the wait began (kept for
        SLOTD_RETENTION) is seen at once; otherwise the attempt ends here, as for a sleep,
        until the emit commits or the timeout passes. Once per name in a run."""
        return self._wait_now(*self._event_args(name, timeout))

    async def sleep_async(self, duration: timedelta) -> None:
        await self._wait_async(*self._sleep_args(_seconds(duration, "ctx.sleep")))

    async def sleep_until_async(self, when: datetime) -> None:
        await self.sleep_async(_until(when))

    async def wait_event_async(self, name: str, timeout: timedelta | None = None) -> Any:
        return await self._wait_async(*self._event_args(name, timeout))

    def _sleep_args(self, seconds: float) -> tuple[str, str | None, float | None]:
        self._sleeps += 1
        return f"slotd.sleep:{self._sleeps}", None, seconds

    def _event_args(
        self, name: str, timeout: timedelta | None
    ) -> tuple[str, str | None, float | None]:
        if not isinstance(name, str) or not name:
            raise TypeError("wait_event: an event's name must be a non-empty string")
        seconds = None if timeout is None else _seconds(timeout, "wait_event's timeout")
        return f"slotd.event:{name}", name, seconds

    def _wait_now(self, step: str, event: str | None, seconds: float | None) -> Any:
        index, stored = self._replay(step)
        if stored is not _NOT_STORED:
            return stored
        if self._write_wait is None:
            raise RuntimeError("durable sleeps and events need a queue to wait in")
        return self._waited(index, step, *self._write_wait(index, step, event, seconds))

    async def _wait_async(self, step: str, event: str | None, seconds: float | None) -> Any:
        index, stored = self._replay(step)
        if stored is not _NOT_STORED:
            return stored
        if self._write_wait_async is not None:
            answer = await self._write_wait_async(index, step, event, seconds)
        elif self._write_wait is not None:
            answer = self._write_wait(index, step, event, seconds)
        else:
            raise RuntimeError("durable sleeps and events need a queue to wait in")
        return self._waited(index, step, *answer)

    def _waited(self, index: int, step: str, verdict: str | None, data: Any) -> Any:
        if verdict is None:
            raise LeaseLost(f"task {self.task.id}: {step} not written, the lease is not ours")
        if verdict == "suspend":
            raise Suspended(step)
        value = data if verdict == "event" else None
        self._taken.append(step)
        self._stored.append((step, value))
        return value


def _seconds(value: timedelta, what: str) -> float:
    if not isinstance(value, timedelta) or value < timedelta(0):
        raise TypeError(f"{what} takes a timedelta >= 0, not {value!r}")
    return value.total_seconds()


def _until(when: datetime) -> timedelta:
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise TypeError(f"sleep_until takes an aware datetime, not {when!r}")
    return max(when - datetime.now(UTC), timedelta(0))
