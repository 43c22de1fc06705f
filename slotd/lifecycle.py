"""The lease lifecycle: every transition of an attempt, and the only module that settles one.

The rule book. A task's row is owned, between its claim and its settlement, by whoever holds
its lease token; every write below is fenced on that token, so a worker that lost its lease
(it lapsed, an operator's cancel was settled, another worker took the row over) writes
nothing, and is told so (`lost`).

- claimed: the claim statement stamps a random token (drawn by the server), burns an attempt
  and sets lease_expires_at = now() + ceiling + margin (repository, sql `claim`). The slot
  puts the lease in its ledger before it tells anyone, so a death from then on is settled by
  the supervisor (`handed_over`), never left to wait out the lease.
- advanced: a sliced handler's cursor (sql `advance_cursor`) rewrites the payload and resets
  the attempt count, fenced on the token, and KEEPS the lease. The seed unleased the row at
  the advance, because its worker could die unseen between the advance and the return; a
  slotd slot's death is settled by its supervisor at once, so that reason is gone, and
  keeping the lease means the handler's return settles its own slice: done dequeues it (a
  release at the advance made that `lost`, and the task ran again for ever), raising backs
  it off from the saved cursor (a release made that a retry storm with no error kept), and
  no other slot can start the next slice while this one still runs its remaining code.
- settled, by what the handler did (`settle`):
  done       the row is deleted (sql `dequeue`), optionally claiming the next task in the
             same statement (`dequeue_claim`); for a type with keep_result (the Result
             carries value and keep_s) the return value is stored by that same fenced
             statement (`dequeue_keep`, `dequeue_keep_claim`), so a worker whose lease is
             gone stores nothing, and a dead slot's success is stored by the supervisor
             from the value in its last words. Plain types keep the plain statements: a
             stored result costs its types only;
             a linked task (one with dependants, marked by their enqueue, or of a batch)
             is settled by `dequeue_linked` (`dequeue_linked_claim` with the next claim
             riding on it, as for a plain task): the same fenced delete also writes its value
             on each edge and makes due each dependant it was the last parent of, so a
             dependant is released exactly when its last parent's success commits, and
             counts the end in its batch (`batch_counted`), whose last end enqueues the
             batch's callback in that same statement: exactly once, since only the
             statement that empties the batch's last stripe does it, and a fenced write
             that matched nothing counts nothing. The plain statements refuse a linked row
             ({unlinked}): a dependant enqueued while its parent ran, after the claim said
             "no dependants", is then settled by the linked statement on a second try,
             never deleted unseen;
  failure    backoff from the attempt the claim burnt, the error kept (`record_failure`);
             a dead letter when that was the last attempt; a linked task's dead letter
             cancels its dependants, transitively, in the same statement, and counts
             every task that ended so in its batch (`record_failure_linked`; refused plain
             writes retried so, as for done). Every other statement that ends a task
             counts it as well: `release` when it makes the dead letter (and cancels the
             dependants), `cancel` of a task not running, `settle_cancelled`, and the
             cascades of a cancel (`cancel_dependants`). `dead retry` takes a task out of
             its batch: the batch counted its end already;
  timeout    the same write, for a handler past its deadline or killed by the watchdog;
  crashed    the same write, for a runner that died under the handler;
  continued  a slice that returned False: released and due at once after an advance
             (`continue_slice`), backed off like a failure when it saved nothing (it would
             repeat itself at once);
  cancelled  an operator's cancel: the lease goes, the row stays the dead letter the cancel
             made it (`settle_cancelled`); or a shutdown: the lease is released (`release`);
  lost       any fenced write that matched nothing: nothing is written.
- released: at shutdown the lease is given back at once (sql `release`), due for another
  replica. The attempt is not refunded (an interruption costs one, or a task always
  mid-flight at rollout would never dead-letter), except the final one, once per task: a
  deploy is never what kills a task; a second release on a final attempt dead-letters it.
  A claim released before its handler started (it met the shutdown on its way in) gets its
  attempt back whatever it was: nothing ran, so nothing was interrupted.
- dead letters: the statement that makes a row dead writes why (dead_reason: 'exhausted' by
  the last attempt's failure or a second final release, 'cancelled' by an operator; sql/021)
  and the attempts it really ran (dead_attempts). Being dead is still attempt_count >=
  max_attempts in this release, so a cancel raises the count to the threshold as 0.1.0 did
  (its replicas claim by that comparison); readers show dead_attempts, never the raise. A
  row made dead by a 0.1.0 replica carries no reason: readers infer 'exhausted' (or
  'cancelled' from its cancel stamp). `slotd dead retry` clears both.
- lapsed: a final attempt whose lease ran out with nobody left to settle it (its whole
  replica died: a slot's death alone is handed over, below) is dead by the predicate from
  that instant, but nothing wrote its end, so its dependants would wait and its batch
  never call back. The lapse sweep (`sweep`, beside the expiry sweep) writes it: the lease
  cleared, dead_reason 'exhausted' (a cancelled attempt keeps 'cancelled'), the attempts
  it ran, an error naming the lapse, its dependants cancelled and its batch counted (sql
  `lapsed`), in one statement. Counted as outcome `crashed` (`cancelled` for a cancelled
  attempt) by the replica whose sweep settled it. A holder still alive past its lease has
  lost it already (it retries a settlement only while its lease lasts): the sweep clears
  the token its late write is fenced on, and that write is `lost`.
- expired: a task enqueued with expires_in is never started after its expires_at: the
  claim's claimable predicate refuses it from that instant, by the database's clock, so no
  sweep has to be on time for the rule to hold. The expiry sweep (`expire`, on every
  replica's chores thread each poll interval, all types, a batch per statement) then makes
  each such task no lease holds a dead letter (dead_reason 'expired', sql `expire`), so it
  leaves the discovery index instead of being passed over at every discovery, and
  slotd.result answers "expired". A running attempt has started and is left to end; if it
  fails, its retry would start after expires_at, so the next sweep expires it instead (a
  stale e-mail is as stale on its second attempt). Counted as outcome `expired` by the
  replica whose sweep made it.
- handed over: a slot that dies holding a lease leaves it, with its last words (the
  attempt's outcome if the handler had ended), in its ledger; the supervisor settles it by
  those words, through the same `settle`, on its chores thread (`handed_over`).

- answer lost: a connection that drops after a settlement's statement was sent leaves its
  answer unread; the slot reconnects and retries while its lease lasts. A success's retry
  first asks what the first try did, since its write would now be refused and the success
  counted `lost`: the claim that rode on it is found under the token the slot chose for it
  (`held_lease`), and a row that is gone was dequeued by it, since only the holder of a live
  lease removes a live row (`lease_remains`). A chained claim that found no next task is
  the common case, at the end of a backlog. A failure's retry cannot tell (its row stays)
  and is counted `lost` at worst: the row holds what the first try wrote.

Order, for the slot: the last words go into the ledger before the database is written (a
death mid-write is settled by what the handler did, never as a crash that would run a
success again); the database; then the ledger (the settlement counted, the lease dropped or
replaced by the claim that rode on the settlement) and the log line. A refused write
(LeaseLost) is always `lost`; a write the database refuses for the data's sake is recorded
as the attempt's failure with the reason (`_unsettled`); a lost connection is the caller's
to retry while the lease lasts."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, TypeVar

import psycopg

from slotd import db, logs
from slotd import outcome as kinds
from slotd.errors import LeaseLost
from slotd.ledger import Ledger
from slotd.outcome import Outcome, Result
from slotd.registry import Registry
from slotd.repository import Claimed, Failure, Repository

log = logging.getLogger("slotd.lifecycle")

T = TypeVar("T")
# How a caller writes: runs the statement against its repository, retrying across reconnects
# while the lease lasts (the slot's lanes), or at once (the test modes, the chores thread).
Writer = Callable[[Callable[[Repository], T]], T | None]
Logger = logging.Logger | logging.LoggerAdapter[Any]


@dataclass(frozen=True)
class Settlement:
    outcome: Outcome
    dead: bool = False
    duration: float | None = None
    next: Claimed | None = None  # claimed by the same statement as the settlement
    claim_tried: bool = False
    error: str | None = None  # what the attempt's failure said (the traceback), if it failed
    exception: BaseException | None = field(default=None, repr=False, compare=False)


def claimed(ledger: Ledger, lease: Claimed) -> None:
    """A claim the slot made: into its ledger before anyone is told of it, so that from
    here on a death of the slot is settled by the supervisor (see `handed_over`)."""
    ledger.hold(lease)


def advance(repo: Repository, claimed: Claimed, payload: Mapping[str, Any] | str) -> bool:
    """A sliced handler's cursor, fenced on the lease: False when the lease is not ours."""
    return repo.advance_cursor(claimed.id, claimed.token, payload)


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
            try:
                nxt = repo.dequeue_and_claim(
                    task_id, token, *then_claim, lease_token, kept=_kept(result), linked=linked
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
        if not repo.continue_slice(claimed.id, claimed.token):
            raise LeaseLost(f"task {claimed.id}: continue refused, the lease is not ours")
        return _done(outcome, claimed, result, logger)
    failure = _fail(repo, claimed, NOT_ADVANCED, backoff)
    logger.warning(
        "slice advanced nothing; backed off like a failure%s",
        " and it has reached max attempts" if failure.dead else "",
        extra=_fields(claimed, result),
    )
    return _done(outcome, claimed, result, logger, failure.dead)


def _error_text(result: Result, default: str) -> str:
    return result.error or default


def _fields(claimed: Claimed, result: Result | None = None) -> dict[str, Any]:
    fields = {"task_id": claimed.id, "task_type": claimed.task_type, "attempt": claimed.attempt}
    if result is not None and result.extra:  # the attempt's own (tracing: trace_id, span_id)
        fields.update(result.extra)
    return fields


def _done(
    outcome: Outcome,
    claimed: Claimed,
    result: Result,
    logger: Logger,
    dead: bool = False,
    *,
    next: Claimed | None = None,  # noqa: A002 - Settlement's own name for it
    claim_tried: bool = False,
) -> Settlement:
    fields = {**_fields(claimed, result), "outcome": str(outcome), "duration": result.duration}
    level = logging.INFO
    if outcome in (Outcome.FAILURE, Outcome.TIMEOUT, Outcome.CRASHED, Outcome.LOST):
        level = logging.WARNING
        if result.error:
            fields["error"] = result.error.splitlines()[-1][:500]
    if dead:
        fields["dead_letter"] = True
        level = logging.ERROR
    duration = f" in {result.duration * 1000:.1f}ms" if result.duration is not None else ""
    dead_mark = " (dead letter)" if dead else ""
    args = (claimed.task_type, claimed.id, claimed.attempt, outcome, duration, dead_mark)
    logs.line(logger, level, "task %s#%s attempt %s: %s%s%s", args, fields)
    failed = outcome is not Outcome.SUCCESS
    return Settlement(
        outcome,
        dead,
        result.duration,
        next,
        claim_tried,
        error=result.error if failed else None,
        exception=result.exception if failed else None,
    )


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


def conclude(
    write: Writer[Settlement],
    ledger: Ledger,
    claimed: Claimed,
    result: Result,
    *,
    report: Callable[..., None],
    faults: Any = None,
    logger: Logger = log,
    **how: Any,
) -> Settlement:
    """A slot's settlement of the lease it holds, in the rule book's order: last words, the
    database (through `write`, which retries across reconnects while the lease lasts), then
    the ledger in one step (the settlement counted, the lease dropped or replaced by the
    claim that rode on it). `how`: settle()'s keywords. Before the slot forks a new runner:
    crash backoff and a slow import must not find the settled lease still in the ledger."""
    ledger.say(claimed.token, result)
    settlement: Settlement | None = None
    if faults is not None:
        faults.crash_slot_before_settlement()
    # A claim riding on a success brings its own token, so that if the connection drops with
    # the answer unread, the retry asks whether that statement committed (the dequeue and
    # the claim are one statement: both did or neither did) instead of leaving the new lease
    # to nobody until ceiling + margin, an attempt and a limit's place burnt.
    # 128 random bits as 32 hex digits, which PostgreSQL reads as a uuid: what uuid4() draws,
    # without building a UUID object per task.
    chained = how.get("then_claim") and result.kind == kinds.DONE
    lease_token = os.urandom(16).hex() if chained else None
    tries = 0

    def once(repo: Repository) -> Settlement:
        nonlocal tries
        tries += 1
        if tries > 1 and result.kind == kinds.DONE:
            # A retry after the connection dropped: did the first try commit? (See the
            # rule book, "answer lost".)
            held = repo.held_lease(lease_token) if lease_token is not None else None
            if held is not None or repo.lease_remains(claimed.id, claimed.token) is None:
                chained = lease_token is not None
                return _done(
                    Outcome.SUCCESS, claimed, result, logger, next=held, claim_tried=chained
                )
        dropped = faults.answer_lost if faults is not None and tries == 1 else None
        return settle(
            repo,
            claimed,
            result,
            logger=logger,
            lease_token=lease_token,
            answer_lost=dropped,
            **how,
        )

    if faults is not None and faults.lose_settlement():
        settlement = Settlement(Outcome.LOST, False, result.duration)
    else:
        try:
            settlement = write(once)
        except Exception as exc:  # noqa: BLE001 - not even the failure could be recorded
            # settle() records a refused write as the task's failure; this is that record
            # refused too. The lease then expires as after a crash: the slot serves on.
            logger.error("settlement failed: %s", db.first_line(exc), extra=_fields(claimed))
    if settlement is None:
        settlement = Settlement(Outcome.LOST, False, result.duration)
    # A handler that never started gives no latency sample, of either kind.
    delay = max(0.0, (claimed.claimed_at - claimed.run_at).total_seconds())
    settled = (
        claimed.task_type,
        str(settlement.outcome),
        settlement.duration,
        delay if result.duration is not None else None,
    )
    between = faults.crash_slot_after_settlement if faults is not None else None
    if not ledger.settled(settled, claimed.token, settlement.next, between):
        report("settled", *settled, claimed.token.bytes)
    return settlement


# The expiry sweep's batch, and how many batches one sweep runs before it yields the chores
# thread (a million rows expiring at once are swept over several poll intervals).
EXPIRE_BATCH = 1000
EXPIRE_ROUNDS = 20


def expire(repo: Repository) -> dict[str, int]:
    """The expiry sweep (see "expired" above): the tasks it made dead letters, per type."""
    return _swept(repo.expire_batch)


def lapse(repo: Repository) -> dict[tuple[str, str], int]:
    """The lapse sweep (see "lapsed" above): the final attempts it settled, per (type,
    dead_reason)."""
    return _swept(repo.lapsed_batch)


@dataclass(frozen=True)
class Swept:
    expired: dict[str, int]
    lapsed: dict[tuple[str, str], int]

    def outcomes(self) -> list[tuple[str, Outcome, int]]:
        """What each swept task counts as in the outcome tally: (type, outcome, n)."""
        counted = [(t, Outcome.EXPIRED, n) for t, n in self.expired.items()]
        for (task_type, reason), n in self.lapsed.items():
            lapsed = Outcome.CANCELLED if reason == "cancelled" else Outcome.CRASHED
            counted.append((task_type, lapsed, n))
        return counted


def sweep(repo: Repository) -> Swept:
    """Both sweeps, one chore each poll interval on every replica: FOR UPDATE SKIP LOCKED
    shares the rows out, so a fleet sweeps each row once."""
    return Swept(expire(repo), lapse(repo))


K = TypeVar("K")


def _swept(batch: Callable[[int], dict[K, int]]) -> dict[K, int]:
    swept: dict[K, int] = {}
    for _ in range(EXPIRE_ROUNDS):
        found = batch(EXPIRE_BATCH)
        for key, n in found.items():
            swept[key] = swept.get(key, 0) + n
        if sum(found.values()) < EXPIRE_BATCH:
            break
    return swept


def handed_over(
    repo: Repository,
    lease: Claimed,
    words: Result | None,
    *,
    stopping: bool,
    registry: Registry,
    logger: Logger = log,
) -> tuple[Settlement, Result]:
    """The lease of a slot that died, settled by the supervisor (on its chores thread: the
    database may be why the slot died) at once rather than left to wait out ceiling +
    margin. By the slot's last words when it left any (a success is dequeued, never run
    again); a crash only when it died with the handler's outcome unknown. The fence makes
    this safe when the slot's own settlement did land: this one then matches nothing."""
    kind = kinds.SHUTDOWN if stopping else kinds.CRASHED
    result = words if words is not None else Result(kind, "its slot died")
    # A slot killed while it stopped a cancelled task: settle it as the cancel.
    cancelled = repo.cancel_reason(lease.id, lease.token)
    # With the registry: a failure backs off by its type's own backoff, as the slot's own
    # settlement would have.
    settlement = settle(
        repo,
        lease,
        result,
        shutting_down=stopping,
        logger=logger,
        cancelled_by=cancelled,
        registry=registry,
    )
    return settlement, result
