"""One claimed task: its deadline from the database's stamp, the handler call, and the
consequence written back fenced on the lease token.

The daemon splits this across processes (`execute` in the runner, `settle` in the slot) and
the test modes call `process` in one; both go through these same functions, so the two
delivery paths cannot drift apart."""

from __future__ import annotations

import inspect
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from slotd import aio
from slotd import outcome as kinds
from slotd.errors import Cancelled, DeadlineExceeded, LeaseLost
from slotd.outcome import Outcome
from slotd.registry import Handler, Registry
from slotd.repository import Claimed, Repository
from slotd.task import Context

log = logging.getLogger("slotd.processor")


@dataclass
class Result:
    """What a handler call came to, as plain data that crosses a pipe."""

    kind: str
    error: str | None = None
    advanced: bool = False
    past_deadline: bool = False
    duration: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The handler's exception itself, for the in-process test modes to chain; never sent
    # over the runner's pipe (an exception need not pickle), where `error` says it all.
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "exception": None}

    def fields(self) -> tuple[Any, ...]:
        """As plain values for the runner's pipe (`Result(*fields)` on the other end): a
        tuple pickles and loads at a fraction of a dataclass's cost, on every task."""
        return (self.kind, self.error, self.advanced, self.past_deadline, self.duration, self.extra)


@dataclass(frozen=True)
class Settlement:
    outcome: Outcome
    dead: bool = False
    duration: float | None = None
    next: Claimed | None = None  # claimed by the same statement as the settlement
    claim_tried: bool = False
    error: str | None = None  # what the attempt's failure said (the traceback), if it failed
    exception: BaseException | None = field(default=None, repr=False, compare=False)


def past(deadline: datetime) -> bool:
    return datetime.now(UTC) >= deadline


class ReturnedAwaitable(TypeError):
    """A sync function handed back a coroutine: it never ran, so it cannot count as done."""


def call(handler: Handler, ctx: Context) -> Any:
    """The handler's return value: awaited to its end on this thread's loop when it is an
    `async def`; a sync one returning an awaitable is an error, never a success."""
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

    Done: None, True or any other value. Continue: False (after advance_cursor)."""
    started = time.monotonic()
    try:
        if before is not None:
            before()  # fault injection for chaos runs
        returned = call(handler, ctx)
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
            return Result(kind, error, ctx.advanced, True, took, exception=exc)
    else:
        caught = None
        kind, error = (kinds.CONTINUE, None) if returned is False else (kinds.DONE, None)
    took = time.monotonic() - started
    return Result(kind, error, ctx.advanced, past(ctx.deadline), took, exception=caught)


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).strip()


def settle(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    *,
    shutting_down: bool = False,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
    then_claim: tuple[Sequence[int], Registry] | None = None,
    cancelled_by: str | None = None,
    registry: Registry | None = None,
) -> Settlement:
    """Write the consequence of `result`, fenced on the token. A refused write means this
    worker no longer owns the row, so nothing is written and the outcome is `lost`.

    `then_claim` (candidate ids, registry): on success, claim the next task in the same
    statement as the dequeue; the claim comes back as `Settlement.next`. `registry`: where
    the type's own backoff is found (else the worker's).

    `cancelled_by`: an operator cancelled this attempt (the cancel's reason). However the
    handler ended, the row stays the dead letter the cancel made it: outcome `cancelled`,
    never retried. Only a handler that finished its work anyway is settled as a success."""
    task_id, token = claimed.id, claimed.token
    backoff = _backoff(repo, registry, claimed.task_type)
    try:
        if cancelled_by is not None and result.kind != kinds.DONE:
            if not repo.settle_cancelled(task_id, token):
                raise LeaseLost(f"task {task_id}: cancel settlement refused")
            logger.info(
                "task %s#%s attempt %s: cancelled (%s); not retried",
                claimed.task_type,
                claimed.id,
                claimed.attempt,
                cancelled_by,
                extra={**_fields(claimed), "outcome": str(Outcome.CANCELLED)},
            )
            return Settlement(Outcome.CANCELLED, True, result.duration)
        if result.kind == kinds.DONE and then_claim and then_claim[0]:
            try:
                nxt = repo.dequeue_and_claim(task_id, token, *then_claim)
            except LeaseLost as exc:
                lost = _done(Outcome.LOST, claimed, result, logger)
                return replace(lost, next=exc.next_claim, claim_tried=True)  # type: ignore[arg-type]
            return replace(
                _done(Outcome.SUCCESS, claimed, result, logger), next=nxt, claim_tried=True
            )
        if result.kind == kinds.DONE:
            repo.dequeue(task_id, token)
            return _done(Outcome.SUCCESS, claimed, result, logger)
        if result.kind in (kinds.CONTINUE, kinds.SHUTDOWN) or (
            shutting_down and result.kind == kinds.ERROR
        ):
            return _release(repo, claimed, result, shutting_down, logger, backoff)
        if result.kind == kinds.KILLED or (result.kind == kinds.ERROR and result.past_deadline):
            text = _error_text(result, "deadline exceeded")
            failure = repo.record_failure(task_id, token, text, **backoff)
            return _done(Outcome.TIMEOUT, claimed, result, logger, failure.dead)
        if result.kind == kinds.CRASHED:
            text = _error_text(result, "runner crashed")
            failure = repo.record_failure(task_id, token, text, **backoff)
            return _done(Outcome.CRASHED, claimed, result, logger, failure.dead)
        text = _error_text(result, "handler failed")
        failure = repo.record_failure(task_id, token, text, **backoff)
        return _done(Outcome.FAILURE, claimed, result, logger, failure.dead)
    except LeaseLost:
        return _done(Outcome.LOST, claimed, result, logger)
    except psycopg.OperationalError:
        raise  # the connection, not the data: the slot reconnects and tries again
    except Exception as exc:  # noqa: BLE001 - whatever the database refused is the task's
        return _unsettled(repo, claimed, result, exc, logger, backoff)


def _unsettled(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    exc: Exception,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    backoff: dict[str, timedelta | None],
) -> Settlement:
    """The settlement's own write failed (data the database refused, a trigger): record
    that as this attempt's failure, with the reason, rather than let it end the slot."""
    text = f"slotd could not settle this attempt ({result.kind}): {type(exc).__name__}: {exc}"
    if result.error:
        text += f"\nthe attempt's own error:\n{result.error}"
    try:
        failure = repo.record_failure(claimed.id, claimed.token, text, **backoff)
    except LeaseLost:
        return _done(Outcome.LOST, claimed, result, logger)
    return _done(Outcome.FAILURE, claimed, replace(result, error=text), logger, failure.dead)


def _backoff(
    repo: Repository, registry: Registry | None, task_type: str
) -> dict[str, timedelta | None]:
    """The type's own backoff where its handler sets one. A base above the worker's cap
    lifts the cap to it: the handler asked for at least that long."""
    handler = registry.get(task_type) if registry is not None else None
    if handler is None:
        return {}
    base, cap = handler.backoff_base, handler.backoff_cap
    if base is not None and cap is None and base > repo.backoff_cap:
        cap = base
    return {"backoff_base": base, "backoff_cap": cap}


def _release(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    shutting_down: bool,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    backoff: dict[str, timedelta | None],
) -> Settlement:
    interrupted = shutting_down or result.kind == kinds.SHUTDOWN
    if not interrupted:
        return _continued(repo, claimed, result, logger, backoff)
    matched = repo.release(claimed.id, claimed.token, "released at shutdown on its final attempt")
    outcome = Outcome.CONTINUED if result.advanced else Outcome.CANCELLED
    return _done(outcome, claimed, result, logger, matched and claimed.final_attempt)


NOT_ADVANCED = "continued without advancing: returned False without ctx.advance_cursor"


def _continued(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    backoff: dict[str, timedelta | None],
) -> Settlement:
    """A continue. After a successful advance_cursor the row is already unleased and due,
    so a fenced write matching it means the slice saved nothing: its next attempt would
    repeat this one at once, so it is backed off like a failure (attempt kept) instead of
    spinning through its attempts in milliseconds."""
    if result.past_deadline:
        logger.warning("slice continued at its deadline", extra=_fields(claimed))
    outcome = Outcome.TIMEOUT if result.past_deadline else Outcome.CONTINUED
    try:
        failure = repo.record_failure(claimed.id, claimed.token, NOT_ADVANCED, **backoff)
    except LeaseLost:
        # Nothing to back off: advanced (the cursor freed the row), or the lease was lost.
        return _done(outcome if result.advanced else Outcome.LOST, claimed, result, logger)
    logger.warning(
        "slice advanced nothing; backed off like a failure%s",
        " and it has reached max attempts" if failure.dead else "",
        extra=_fields(claimed),
    )
    return _done(outcome, claimed, result, logger, failure.dead)


def _error_text(result: Result, default: str) -> str:
    return result.error or default


def _fields(claimed: Claimed) -> dict[str, Any]:
    return {"task_id": claimed.id, "task_type": claimed.task_type, "attempt": claimed.attempt}


def _done(
    outcome: Outcome,
    claimed: Claimed,
    result: Result,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    dead: bool = False,
) -> Settlement:
    fields = {**_fields(claimed), "outcome": str(outcome), "duration": result.duration}
    level = logging.INFO
    if outcome in (Outcome.FAILURE, Outcome.TIMEOUT, Outcome.CRASHED, Outcome.LOST):
        level = logging.WARNING
        if result.error:
            fields["error"] = result.error.splitlines()[-1][:500]
    if dead:
        fields["dead_letter"] = True
        level = logging.ERROR
    duration = f" in {result.duration * 1000:.1f}ms" if result.duration is not None else ""
    logger.log(
        level,
        "task %s#%s attempt %s: %s%s%s",
        claimed.task_type,
        claimed.id,
        claimed.attempt,
        outcome,
        duration,
        " (dead letter)" if dead else "",
        extra=fields,
    )
    failed = outcome is not Outcome.SUCCESS
    return Settlement(
        outcome,
        dead,
        result.duration,
        error=result.error if failed else None,
        exception=result.exception if failed else None,
    )


def not_started(claimed: Claimed) -> Result:
    """The claim itself outlasted the ceiling: starting the handler would run it beyond its
    lease from the first instant, so it is not started, and counts as a timeout."""
    reason = "claim returned after the handler's deadline; not started"
    return Result(kinds.KILLED, reason, advanced=False, past_deadline=True)


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
        result = not_started(claimed)
    else:
        ctx = Context(
            claimed.task(),
            deadline,
            lambda payload: repo.advance_cursor(claimed.id, claimed.token, payload),
            is_cancelled,
        )
        result = execute(handler, ctx, before)
    return settle(
        repo, claimed, result, shutting_down=is_cancelled(), logger=logger, registry=registry
    )
