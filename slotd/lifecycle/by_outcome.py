"""`settle`: the settlement of one attempt by what its handler did (the rule book's
"settled, by what the handler did" and "released", slotd/lifecycle/__init__.py): done,
failure, timeout, crashed, continued, cancelled, lost, each one fenced write. Called by the
slot (through `conclude`), by the supervisor for a dead slot (`handed_over`) and by the test
modes (slotd/runner/processor.py `process`); also the two results of a claim that never started."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

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
    backoff = _backoff(repo, registry, claimed.task_type, result)
    go_on = _sequence_goes_on(registry, claimed.task_type)
    try:
        if cancelled_by is not None and result.kind != kinds.DONE:
            what = f"({cancelled_by}); not retried"
            return _cancelled_instead(repo, claimed, result, logger, what)
        if result.kind == kinds.SUSPEND:  # written by its wait already (`wait`)
            return _done(Outcome.SUSPENDED, claimed, result, logger)
        if result.kind == kinds.SNOOZE:
            return _snoozed(repo, claimed, result, logger, backoff)
        if result.kind == kinds.DONE and claimed.linked and not (then_claim and then_claim[0]):
            repo.dequeue_linked(task_id, token, result.value, *_stored(result, repo.keep_history_s))
            return _done(Outcome.SUCCESS, claimed, result, logger)
        if result.kind == kinds.DONE and then_claim and then_claim[0]:
            linked = (
                (result.value, *_stored(result, repo.keep_history_s)) if claimed.linked else None
            )
            # A batch's member with nothing else linked: the lighter statement (see sql
            # `member_settled`); it falls back to the linked one if dependants came since.
            member = claimed.batch_id is not None and not claimed.has_dependants
            member = member and _stored(result, repo.keep_history_s)[0] is None
            try:
                nxt = repo.dequeue_and_claim(
                    task_id,
                    token,
                    *then_claim,
                    lease_token,
                    kept=_kept(result, repo.keep_history_s),
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
                repo.dequeue(task_id, token, kept=_kept(result, repo.keep_history_s))
            except LeaseLost:
                return _done(_as_linked(repo, claimed, result), claimed, result, logger)
            if answer_lost is not None:
                answer_lost(repo)
            return _done(Outcome.SUCCESS, claimed, result, logger)
        if result.kind in (kinds.CONTINUE, kinds.SHUTDOWN) or (
            shutting_down and result.kind == kinds.ERROR
        ):
            return _release(repo, claimed, result, shutting_down, logger, backoff, go_on)
        if result.kind == kinds.KILLED or (result.kind == kinds.ERROR and result.past_deadline):
            text = _error_text(result, "deadline exceeded")
            failure = _fail(repo, claimed, text, backoff, outcome=Outcome.TIMEOUT, go_on=go_on)
            return _done(Outcome.TIMEOUT, claimed, result, logger, failure.dead)
        if result.kind == kinds.ERROR and result.extra.get(DISCARD):
            text = _error_text(result, "payload refused by its model")
            failure = _fail(repo, claimed, text, backoff, discard=True, go_on=go_on)
            return _done(Outcome.DISCARDED, claimed, result, logger, failure.dead)
        if result.kind == kinds.CRASHED:
            text = _error_text(result, "runner crashed")
            failure = _fail(repo, claimed, text, backoff, outcome=Outcome.CRASHED, go_on=go_on)
            return _done(Outcome.CRASHED, claimed, result, logger, failure.dead)
        text = _error_text(result, "handler failed")
        failure = _fail(repo, claimed, text, backoff, go_on=go_on)
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
        repo.dequeue_linked(
            claimed.id, claimed.token, result.value, *_stored(result, repo.keep_history_s)
        )
    except LeaseLost:
        return Outcome.LOST
    return Outcome.SUCCESS


def _fail(
    repo: Repository,
    claimed: Claimed,
    text: str,
    backoff: dict[str, Any],
    discard: bool = False,
    outcome: Outcome = Outcome.FAILURE,
    go_on: bool = False,
) -> Failure:
    """record_failure, by the linked statement for a linked task, and again so when the
    plain one is refused (dependants enqueued since the claim; see _as_linked).
    `discard`: the dead letter now, whatever attempts remain. `outcome`: what the attempt
    is remembered as (slotd_attempts). `go_on`: a sequence's task whose dead letter lets
    its sequence go on (its handler's sequence_on_failure="continue")."""
    fail = repo.record_failure
    kind = str(Outcome.DISCARDED if discard else outcome)
    linked = {"linked": True, "sequence_go_on": go_on}
    if claimed.linked:
        return fail(
            claimed.id, claimed.token, text, **backoff, **linked, discard=discard, outcome=kind
        )
    try:
        return fail(claimed.id, claimed.token, text, **backoff, discard=discard, outcome=kind)
    except LeaseLost:
        return fail(
            claimed.id, claimed.token, text, **backoff, **linked, discard=discard, outcome=kind
        )


def _stored(result: Result, default_s: float | None = None) -> tuple[float | None, bool]:
    """How long a success stays answerable (keep_result, keep_history: the longer; None:
    not at all) and whether its value is stored with it (keep_result only). `default_s`:
    the worker's SLOTD_KEEP_HISTORY, for a type that sets no keep_history."""
    history = result.history_s if result.history_s is not None else default_s
    if result.keep_s is None:
        return history, False
    return max(result.keep_s, history or 0.0), True


def _kept(result: Result, default_s: float | None = None) -> tuple[str | None, float] | None:
    """The value a success stores (None: its history only) and for how long; None for a
    type that keeps neither its result nor its history."""
    seconds, value_kept = _stored(result, default_s)
    if seconds is None:
        return None
    if not value_kept:
        return (None, seconds)
    return (result.value if result.value is not None else "null", seconds)


def _unsettled(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    exc: Exception,
    logger: Logger,
    backoff: dict[str, Any],
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
    repo: Repository, registry: Registry | None, task_type: str, result: Result | None = None
) -> dict[str, Any]:
    """The type's own backoff where its handler sets one. A base above the worker's cap
    lifts the cap to it: the handler asked for at least that long. A delay the handler
    chose for this failure (RetryAfter, backoff=: Result.extra) is taken exactly, no
    jitter: the base and the cap both."""
    retry_in = result.extra.get(kinds.RETRY_IN_S) if result is not None else None
    if retry_in is not None:
        delay = timedelta(seconds=float(retry_in))
        return {"backoff_base": delay, "backoff_cap": delay, "jitter": 0.0}
    handler = registry.get(task_type) if registry is not None else None
    if handler is None:
        return {}
    base, cap = handler.backoff_base, handler.backoff_cap
    if base is not None and cap is None and base > repo.backoff_cap:
        cap = base
    return {"backoff_base": base, "backoff_cap": cap}


def _sequence_goes_on(registry: Registry | None, task_type: str) -> bool:
    """Whether a dead letter of this type's sequence member lets its sequence go on (its
    handler's sequence_on_failure; sql/080). Unknown: it halts, the safe default."""
    handler = registry.get(task_type) if registry is not None else None
    return handler is not None and handler.sequence_on_failure == "continue"


def _release(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    shutting_down: bool,
    logger: Logger,
    backoff: dict[str, Any],
    go_on: bool = False,
) -> Settlement:
    interrupted = shutting_down or result.kind == kinds.SHUTDOWN
    if not interrupted:
        return _continued(repo, claimed, result, logger, backoff)
    reason = "released at shutdown on its final attempt, a second time"
    unstarted = bool(result.extra.get(UNSTARTED))
    if unstarted:
        outcome = Outcome.RELEASED
    else:
        outcome = Outcome.CONTINUED if result.advanced else Outcome.CANCELLED
    dead = repo.release(
        claimed.id,
        claimed.token,
        reason,
        refund_final=not unstarted,
        unstarted=unstarted,
        outcome=str(outcome),
        sequence_go_on=go_on,
    )
    return _done(outcome, claimed, result, logger, bool(dead))


NOT_ADVANCED = "continued without advancing: returned False without ctx.advance_cursor"


def _continued(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    logger: Logger,
    backoff: dict[str, Any],
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
        return _cancelled_instead(repo, claimed, result, logger, "after its advance; not continued")
    failure = _fail(repo, claimed, NOT_ADVANCED, backoff, outcome=Outcome.CONTINUED)
    logger.warning(
        "slice advanced nothing; backed off like a failure%s",
        " and it has reached max attempts" if failure.dead else "",
        extra=_fields(claimed, result),
    )
    return _done(outcome, claimed, result, logger, failure.dead)


# A task may snooze this many times (sql/071 counts them); past that it is a dead letter
# saying so: a handler that snoozes for ever must still end (oban #476, River #730).
MAX_SNOOZES = 100


def _snoozed(
    repo: Repository,
    claimed: Claimed,
    result: Result,
    logger: Logger,
    backoff: dict[str, Any],
) -> Settlement:
    """A handler's Snooze: the lease goes and the task is due again after the delay, with
    its attempt given back (sql `snooze`). Past MAX_SNOOZES it is a dead letter now, its
    error saying why; a cancel that came meanwhile is settled as the cancel."""
    delay = float(result.extra.get(kinds.SNOOZE_S) or 0.0)
    answer = repo.snooze(claimed.id, claimed.token, delay, MAX_SNOOZES)
    if answer is None:
        return _cancelled_instead(repo, claimed, result, logger, "while it snoozed; not snoozed")
    snoozes, snoozed = answer
    if snoozed:
        return _done(Outcome.SNOOZED, claimed, result, logger)
    text = (
        f"snoozed {snoozes} times, the most a task may (slotd.lifecycle.MAX_SNOOZES):"
        " a dead letter instead of another snooze"
    )
    failure = _fail(repo, claimed, text, backoff, discard=True)
    return _done(Outcome.DISCARDED, claimed, replace(result, error=text), logger, failure.dead)


def _cancelled_instead(
    repo: Repository, claimed: Claimed, result: Result, logger: Logger, what: str
) -> Settlement:
    """The cancel's end: an operator's cancel heard of, or a release refused (continue,
    snooze) because the lease is gone or an operator cancelled the task unheard of."""
    if not repo.settle_cancelled(claimed.id, claimed.token):
        raise LeaseLost(f"task {claimed.id}: cancel settlement refused")
    logger.info(
        "task %s#%s attempt %s: cancelled %s",
        claimed.task_type,
        claimed.id,
        claimed.attempt,
        what,
        extra={**_fields(claimed, result), "outcome": str(Outcome.CANCELLED)},
    )
    return Settlement(Outcome.CANCELLED, True, result.duration)


def _error_text(result: Result, default: str) -> str:
    return result.error or default


UNSTARTED = "unstarted"  # Result.extra: the handler never ran under this lease
DISCARD = "discard"  # Result.extra: the payload its model refused; a dead letter now


def not_started_at_shutdown() -> Result:
    """A claim that met a shutdown before its handler started (one riding on a settlement
    while the SIGTERM landed): released with its attempt given back, since nothing ran."""
    return Result(kinds.SHUTDOWN, "not started: the replica is stopping", extra={UNSTARTED: True})


def not_started(claimed: Claimed) -> Result:
    """The claim itself outlasted the ceiling: starting the handler would run it beyond its
    lease from the first instant, so it is not started, and counts as a timeout."""
    reason = "claim returned after the handler's deadline; not started"
    return Result(kinds.KILLED, reason, advanced=False, past_deadline=True)
