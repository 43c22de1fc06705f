"""`settle`: the settlement of one attempt by what its handler did (the rule book's
"settled, by what the handler did" and "released", slotd/lifecycle/__init__.py): done,
failure, timeout, crashed, continued, cancelled, lost, each one fenced write. Called by the
slot (through `conclude`), by the supervisor for a dead slot (`handed_over`) and by the test
modes (slotd/runner/processor.py `process`); also the two results of a claim that never started."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta

import psycopg

from slotd import outcome as kinds
from slotd.errors import LeaseLost
from slotd.lifecycle.settlement import Logger, Settlement, _done, _fields, log
from slotd.outcome import Outcome, Result
from slotd.registry import Registry
from slotd.repository import Claimed, Failure, Repository


def settle(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    *,
    shutting_down: bool = False,
    logger: Logger = log,
    then_claim: tuple[Sequence[int], Registry] | None = None,
    cancelled_by: str | None = None,
    registry: Registry | None = None,
    lease_token: str | None = None,
    answer_lost: Callable[[Repository], None] | None = None,
) -> Settlement:
    """Write the consequence of `result`, fenced on the token. A refused write means this
    worker no longer owns the row, so nothing is written and the outcome is `lost`.

    `then_claim` (candidate ids, registry): on success, claim the next task in the same
    statement as the dequeue; the claim comes back as `Settlement.next`. `registry`: where
    the type's own backoff is found (else the worker's). `lease_token`: the token the claim
    riding on the settlement takes (see `conclude`); `answer_lost`: a chaos run's hook, called
    once that statement committed.

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
                extra={**_fields(claimed, result), "outcome": str(Outcome.CANCELLED)},
            )
            return Settlement(Outcome.CANCELLED, True, result.duration)
        if result.kind == kinds.DONE and claimed.linked and not (then_claim and then_claim[0]):
            repo.dequeue_linked(task_id, token, result.value, result.keep_s)
            return _done(Outcome.SUCCESS, claimed, result, logger)
        if result.kind == kinds.DONE and then_claim and then_claim[0]:
            linked = (result.value, result.keep_s) if claimed.linked else None
            # A batch's member with nothing else linked: the lighter statement (see sql
            # `member_settled`); it falls back to the linked one if dependants came since.
            member = claimed.batch_id is not None and not claimed.has_dependants
            member = member and result.keep_s is None
            try:
                nxt = repo.dequeue_and_claim(
                    task_id,
                    token,
                    *then_claim,
                    lease_token,
                    kept=_kept(result),
                    linked=linked,
                    member=member,
                )
                if answer_lost is not None:
                    answer_lost(repo)
            except LeaseLost as exc:
                outcome = _as_linked(repo, claimed, result)
                nxt = exc.next_claim
                return _done(outcome, claimed, result, logger, next=nxt, claim_tried=True)
            return _done(Outcome.SUCCESS, claimed, result, logger, next=nxt, claim_tried=True)
        if result.kind == kinds.DONE:
            try:
                repo.dequeue(task_id, token, kept=_kept(result))
            except LeaseLost:
                return _done(_as_linked(repo, claimed, result), claimed, result, logger)
            if answer_lost is not None:
                answer_lost(repo)
            return _done(Outcome.SUCCESS, claimed, result, logger)
        if result.kind in (kinds.CONTINUE, kinds.SHUTDOWN) or (
            shutting_down and result.kind == kinds.ERROR
        ):
            return _release(repo, claimed, result, shutting_down, logger, backoff)
        if result.kind == kinds.KILLED or (result.kind == kinds.ERROR and result.past_deadline):
            text = _error_text(result, "deadline exceeded")
            failure = _fail(repo, claimed, text, backoff)
            return _done(Outcome.TIMEOUT, claimed, result, logger, failure.dead)
        if result.kind == kinds.CRASHED:
            text = _error_text(result, "runner crashed")
            failure = _fail(repo, claimed, text, backoff)
            return _done(Outcome.CRASHED, claimed, result, logger, failure.dead)
        text = _error_text(result, "handler failed")
        failure = _fail(repo, claimed, text, backoff)
        return _done(Outcome.FAILURE, claimed, result, logger, failure.dead)
    except LeaseLost:
        return _done(Outcome.LOST, claimed, result, logger)
    except psycopg.OperationalError:
        raise  # the connection, not the data: the slot reconnects and tries again
    except Exception as exc:  # noqa: BLE001 - whatever the database refused is the task's
        return _unsettled(repo, claimed, result, exc, logger, backoff)


def _as_linked(repo: Repository, claimed: Claimed, result: Result) -> Outcome:
    """A plain success refused: the row may have gained dependants since its claim, or its
    claim was rebuilt from last words without the marks (the lease is still ours then);
    settle it by the linked statement, else it is lost."""
    if claimed.linked:
        return Outcome.LOST
    try:
        repo.dequeue_linked(claimed.id, claimed.token, result.value, result.keep_s)
    except LeaseLost:
        return Outcome.LOST
    return Outcome.SUCCESS


def _fail(
    repo: Repository, claimed: Claimed, text: str, backoff: dict[str, timedelta | None]
) -> Failure:
    """record_failure, by the linked statement for a linked task, and again so when the
    plain one is refused (dependants enqueued since the claim; see _as_linked)."""
    if claimed.linked:
        return repo.record_failure(claimed.id, claimed.token, text, **backoff, linked=True)
    try:
        return repo.record_failure(claimed.id, claimed.token, text, **backoff)
    except LeaseLost:
        return repo.record_failure(claimed.id, claimed.token, text, **backoff, linked=True)


def _kept(result: Result) -> tuple[str, float] | None:
    """The value a success stores and for how long; None for a type without keep_result."""
    if result.keep_s is None:
        return None
    return (result.value if result.value is not None else "null", result.keep_s)


def _unsettled(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    exc: Exception,
    logger: Logger,
    backoff: dict[str, timedelta | None],
) -> Settlement:
    """The settlement's own write failed (data the database refused, a trigger): record
    that as this attempt's failure, with the reason, rather than let it end the slot."""
    text = f"slotd could not settle this attempt ({result.kind}): {type(exc).__name__}: {exc}"
    if result.error:
        text += f"\nthe attempt's own error:\n{result.error}"
    try:
        failure = _fail(repo, claimed, text, backoff)
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
    logger: Logger,
    backoff: dict[str, timedelta | None],
) -> Settlement:
    interrupted = shutting_down or result.kind == kinds.SHUTDOWN
    if not interrupted:
        return _continued(repo, claimed, result, logger, backoff)
    reason = "released at shutdown on its final attempt, a second time"
    unstarted = bool(result.extra.get(UNSTARTED))
    dead = repo.release(
        claimed.id, claimed.token, reason, refund_final=not unstarted, unstarted=unstarted
    )
    outcome = Outcome.CONTINUED if result.advanced else Outcome.CANCELLED
    return _done(outcome, claimed, result, logger, bool(dead))


NOT_ADVANCED = "continued without advancing: returned False without ctx.advance_cursor"


def _continued(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    logger: Logger,
    backoff: dict[str, timedelta | None],
) -> Settlement:
    """A continue. After an advance the lease is given back and the row is due at once,
    from its cursor. A continue that saved nothing would repeat this attempt at once, so it
    is backed off like a failure (attempt kept) instead of spinning through its attempts
    in milliseconds."""
    if result.past_deadline:
        logger.warning("slice continued at its deadline", extra=_fields(claimed, result))
    outcome = Outcome.TIMEOUT if result.past_deadline else Outcome.CONTINUED
    if result.advanced:
        if repo.continue_slice(claimed.id, claimed.token):
            return _done(outcome, claimed, result, logger)
        # Refused: the lease is gone, or an operator cancelled the task after its advance
        # and this slot never heard of it. The cancel's end, then, as if it had.
        if not repo.settle_cancelled(claimed.id, claimed.token):
            raise LeaseLost(f"task {claimed.id}: continue refused, the lease is not ours")
        logger.info(
            "task %s#%s attempt %s: cancelled after its advance; not continued",
            claimed.task_type,
            claimed.id,
            claimed.attempt,
            extra={**_fields(claimed, result), "outcome": str(Outcome.CANCELLED)},
        )
        return Settlement(Outcome.CANCELLED, True, result.duration)
    failure = _fail(repo, claimed, NOT_ADVANCED, backoff)
    logger.warning(
        "slice advanced nothing; backed off like a failure%s",
        " and it has reached max attempts" if failure.dead else "",
        extra=_fields(claimed, result),
    )
    return _done(outcome, claimed, result, logger, failure.dead)


def _error_text(result: Result, default: str) -> str:
    return result.error or default


UNSTARTED = "unstarted"  # Result.extra: the handler never ran under this lease


def not_started_at_shutdown() -> Result:
    """A claim that met a shutdown before its handler started (one riding on a settlement
    while the SIGTERM landed): released with its attempt given back, since nothing ran."""
    return Result(kinds.SHUTDOWN, "not started: the replica is stopping", extra={UNSTARTED: True})


def not_started(claimed: Claimed) -> Result:
    """The claim itself outlasted the ceiling: starting the handler would run it beyond its
    lease from the first instant, so it is not started, and counts as a timeout."""
    reason = "claim returned after the handler's deadline; not started"
    return Result(kinds.KILLED, reason, advanced=False, past_deadline=True)
