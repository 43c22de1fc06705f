"""One handler call: the handler run to its end (awaited on the runner's loop when it is an
`async def`) and what it did classified as a Result. Never raises for the handler's sake.

The daemon runs `execute` in the runner and settles in the slot (slotd.lifecycle); the test
modes call `process`, which does both in one process. Both go through these same functions
and the same lifecycle, so the two delivery paths cannot drift apart."""

from __future__ import annotations

import inspect
import logging
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from types import TracebackType
from typing import Any

from slotd import lifecycle
from slotd import outcome as kinds
from slotd.errors import Cancelled, DeadlineExceeded, Suspended
from slotd.lifecycle import Settlement
from slotd.outcome import Result, past
from slotd.payload import encode_result
from slotd.registry import Handler, Registry
from slotd.repository import Claimed, Repository
from slotd.runner import aio, chain
from slotd.runner.decisions import decide
from slotd.task import Context

log = logging.getLogger("slotd.processor")


class ReturnedAwaitable(TypeError):
    """A sync function handed back a coroutine: it never ran, so it cannot count as done."""


def call(handler: Handler, ctx: Context) -> Any:
    """The handler's return value, through the registry's middleware (slotd.middleware)."""
    return chain.run(handler, ctx, _call)


def _call(handler: Handler, ctx: Context) -> Any:
    """Awaited to its end on this thread's loop when it is an `async def`; a sync one
    returning an awaitable is an error, never a success."""
    if handler.is_async:
        return aio.current().run(handler.fn(ctx.task, ctx))
    returned = handler.fn(ctx.task, ctx)
    if inspect.isawaitable(returned):
        close = getattr(returned, "close", None)
        if close is not None:
            close()  # no "never awaited" warning on top of the error
        raise ReturnedAwaitable("handler returned a coroutine: declare it async def")
    return returned


def execute(handler: Handler, ctx: Context, before: Callable[[], None] | None = None) -> Result:
    """Call the handler and classify what it did. Never raises for the handler's sake.

    Done: None, True or any other value. Continue: False (after advance_cursor).
    A typed handler's payload is built into its model first; one the model refuses is
    never handed to the handler (see `_typed`)."""
    started = time.monotonic()
    refused = _typed(handler, ctx)
    if refused is not None:
        return refused
    try:
        if before is not None:
            before()  # fault injection for chaos runs
        returned = call(handler, ctx)
    except Suspended:  # a durable sleep or wait, written: the attempt ends here
        took = time.monotonic() - started
        return Result(kinds.SUSPEND, None, ctx.advanced, False, took, ctx.log_fields)
    except Cancelled as exc:
        kind, error, caught = kinds.SHUTDOWN, _describe(exc), exc
    except BaseException as exc:  # noqa: BLE001 - a handler's SystemExit is an error too
        caught = exc
        if isinstance(exc, KeyboardInterrupt) and ctx.shutting_down:
            kind, error = kinds.SHUTDOWN, _describe(exc)
        else:
            kind, error = kinds.ERROR, _describe(exc)
        if isinstance(exc, DeadlineExceeded):
            took = time.monotonic() - started
            return Result(kind, error, ctx.advanced, True, took, ctx.log_fields, exception=exc)
        if kind == kinds.ERROR:
            # Snooze, Discard, RetryAfter, retry_on / discard_on / backoff: the handler's
            # decision about its task (slotd/runner/decisions.py).
            kind, decided = decide(handler, ctx.task.attempt, exc)
            if decided:
                took = time.monotonic() - started
                error = None if kind == kinds.SNOOZE else error
                extra = {**ctx.log_fields, **decided}
                return Result(
                    kind, error, ctx.advanced, past(ctx.deadline), took, extra, exception=exc
                )
    else:
        caught = None
        kind, error = (kinds.CONTINUE, None) if returned is False else (kinds.DONE, None)
        if kind == kinds.DONE and (
            handler.keep_result is not None
            or handler.keep_history is not None
            or not (returned is None or returned is True)
        ):
            return _kept(handler, ctx, returned, started)
    took = time.monotonic() - started
    late = past(ctx.deadline)
    # extra: the fields a middleware gave the attempt's log lines (trace_id, span_id).
    return Result(kind, error, ctx.advanced, late, took, ctx.log_fields, exception=caught)


def _typed(handler: Handler, ctx: Context) -> Result | None:
    """Give a typed handler (payload=Model) its model as task.payload. A payload the model
    refuses fails the same way on every attempt, so it is not retried: the Result asks the
    settlement to discard it (a dead letter now, reason "discarded", the field named)."""
    model = handler.payload_model
    if model is None:
        return None
    try:
        ctx.task = replace(ctx.task, payload=model.load(ctx.task.payload, "invalid payload"))
    except (TypeError, ValueError) as exc:
        return Result(
            kinds.ERROR, f"{exc}; discarded, not retried", extra={lifecycle.DISCARD: True}
        )
    return None


def _kept(handler: Handler, ctx: Context, returned: Any, started: float) -> Result:
    """A success with a value: as JSON (True and None are null). For a type that keeps
    results a value that is not JSON is the handler's error, as a cursor that is not JSON
    is; for any other type it is carried best-effort (a parent's value for its dependants,
    whose enqueue may come while it runs) and dropped when it is not JSON."""
    value = None if returned is True else returned
    try:
        text: str | None = encode_result(value, f"task {ctx.task.id}")
    except TypeError as exc:
        took = time.monotonic() - started
        if handler.keep_result is None:
            return Result(
                kinds.DONE,
                None,
                ctx.advanced,
                past(ctx.deadline),
                took,
                ctx.log_fields,
                history_s=_seconds(handler.keep_history),
            )
        return Result(
            kinds.ERROR, _describe(exc), ctx.advanced, past(ctx.deadline), took, ctx.log_fields
        )
    took = time.monotonic() - started
    late = past(ctx.deadline)
    return Result(
        kinds.DONE,
        None,
        ctx.advanced,
        late,
        took,
        ctx.log_fields,
        value=text,
        keep_s=_seconds(handler.keep_result),
        history_s=_seconds(handler.keep_history),
    )


def _seconds(span: timedelta | None) -> float | None:
    return None if span is None else span.total_seconds()


# slotd's own frames above a handler's (execute, the middleware chain, the runner): five of
# them opened every stored traceback before the first line of the user's code.
_OURS = os.path.dirname(os.path.dirname(__file__)) + os.sep


def _describe(exc: BaseException) -> str:
    """The stored error: the traceback from the first frame outside slotd (the handler or
    its middleware), all of it when every frame is slotd's (a deadline raised by slotd)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _is_ours(tb):
        tb = tb.tb_next
    if tb is None or _is_ours(tb):
        tb = exc.__traceback__
    return "".join(traceback.format_exception(type(exc), exc, tb)).strip()


def _is_ours(tb: TracebackType) -> bool:
    return tb.tb_frame.f_code.co_filename.startswith(_OURS)


def process(
    repo: Repository,
    registry: Registry,
    claimed: Claimed,
    *,
    is_cancelled: Callable[[], bool] = lambda: False,
    before: Callable[[], None] | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> Settlement:
    """The whole step in this process: what the test modes and the inline paths use."""
    handler = registry.get(claimed.task_type)
    deadline = claimed.deadline(repo.lease_margin)
    if handler is None:
        result = Result(kinds.ERROR, f"no handler registered for {claimed.task_type!r}")
    elif past(deadline):
        result = lifecycle.not_started(claimed)
    else:
        ctx = Context(
            claimed.task(),
            deadline,
            lambda payload: lifecycle.advance(repo, claimed, payload),
            is_cancelled,
            steps=claimed.steps,
            write_step=lambda i, name, text: lifecycle.step(repo, claimed, i, name, text),
            write_wait=lambda i, name, event, for_s: _waited(
                lifecycle.wait(repo, claimed, i, name, event, for_s)
            ),
        )
        result = execute(handler, ctx, before)
    return lifecycle.settle(
        repo, claimed, result, shutting_down=is_cancelled(), logger=logger, registry=registry
    )


def _waited(answer: tuple[str, Any] | None) -> tuple[Any, Any]:
    return answer if answer is not None else (None, None)
