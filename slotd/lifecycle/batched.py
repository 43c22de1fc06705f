"""A slot's batch (the rule book's "batched", slotd/lifecycle/__init__.py): several tasks
claimed in one statement (`claimed_many`), plain successes held as last words until one
statement settles them all, fenced each on its own token, with the next batch's claim
riding on it (`conclude_many`), and prefetched tasks given back unstarted
(`released_unstarted`). A success the batched statement refused is settled alone by
`settle`, as a refused plain success always is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from slotd import outcome as kinds
from slotd.lifecycle.by_outcome import UNSTARTED, _kept, settle
from slotd.lifecycle.settlement import Logger, Settlement, Writer, _said, log
from slotd.outcome import Outcome, Result
from slotd.registry import Registry
from slotd.repository import Claimed, Repository, lease_tokens
from slotd.slot.ledger import DONE, WAITING, Ledger

# What a plain success's last words are in a batch: the handler ended, done (the supervisor
# settles a dead slot's DONE leases by these words, never running them again).
_DONE = Result(kinds.DONE)


def batched_words(state: str) -> Result:
    """The words a dead slot's batched lease is settled by: DONE ran to success; WAITING
    never reached its runner, so it is released with its attempt given back."""
    return _DONE if state == DONE else unstarted("its slot died before it started")


def unstarted(reason: str) -> Result:
    """A prefetched task given back before it started: released, its attempt refunded."""
    return Result(kinds.SHUTDOWN, f"not started: {reason}", extra={UNSTARTED: True})


def deferrable(claimed: Claimed, result: Result, keep_history_s: float | None) -> bool:
    """Whether this attempt's settlement may wait for its batch's statement: a plain
    success only (no dependants, no batch, no stored result or history). Everything else is
    settled alone, at once, by its own statement."""
    return (
        result.kind == kinds.DONE and not claimed.linked and _kept(result, keep_history_s) is None
    )


def claimed_many(ledger: Ledger, leases: Sequence[Claimed]) -> None:
    """Prefetched claims: into the ledger's batch before anyone is told of them."""
    if leases:
        ledger.batch_put(list(leases), WAITING)


def started(ledger: Ledger, lease: Claimed) -> None:
    """A prefetched task goes to its runner: the running lease first, then out of the batch
    (a kill between the two finds it in both, and the batch's WAITING wins: it never ran)."""
    ledger.hold(lease)
    ledger.batch_drop([lease.token.bytes])


def deferred(ledger: Ledger, lease: Claimed) -> None:
    """A plain success whose settlement waits for the batch's statement: DONE in the batch
    (its last words), then no longer the running lease."""
    ledger.batch_put([lease], DONE)
    ledger.hold(None)


def conclude_many(
    write: Writer[tuple[set[int], list[Claimed]]],
    ledger: Ledger,
    done: Sequence[tuple[Claimed, Result]],
    registry: Registry,
    *,
    then_claim: tuple[Sequence[int], int] | None,
    report: Callable[..., None],
    faults: Any = None,
    logger: Logger = log,
) -> list[Claimed]:
    """Settle the plain successes `done` (each DONE in the ledger's batch) in one statement,
    each fenced on its own token, with up to n next claims riding on it (`then_claim`: the
    candidate ids and n). Then, in the rule book's order: the new claims into the batch as
    WAITING, each settlement into the ring, the settled ones out of the batch. A success
    the statement refused is settled alone (`settle`: by the linked statement if it gained
    dependants since its claim, else `lost`). Returns the new claims, in the candidates'
    order. `faults`: a chaos run's hooks, at the points of a lone settlement's (`conclude`):
    the slot's death before the statement and between the ring and the batch record, the
    statement's answer lost after it committed."""
    ids, n = then_claim if then_claim is not None else ((), 0)
    tokens = lease_tokens(n) if n > 0 and ids else []
    leases = [lease for lease, _ in done]
    tries = 0
    if faults is not None:
        faults.crash_slot_before_settlement()

    def once(repo: Repository) -> tuple[set[int], list[Claimed]]:
        nonlocal tries
        tries += 1
        # A retry after the connection dropped (the rule book's "answer lost"): the statement
        # deleted all of `done` or none, and its claims are found under the tokens the slot
        # drew for them.
        if tries > 1 and leases and all(repo.lease_remains(c.id, c.token) is None for c in leases):
            return {c.id for c in leases}, repo.held_leases(tokens)
        answer = repo.dequeue_many_and_claim(leases, ids if tokens else (), registry, tokens)
        if faults is not None and tries == 1:
            faults.answer_lost(repo)
        return answer

    answer = write(once)
    dequeued, claims = answer if answer is not None else (set(), [])
    claimed_many(ledger, claims)
    for lease, result in done:
        if lease.id in dequeued:
            _said(Outcome.SUCCESS, lease, result, logger)
            outcome = Outcome.SUCCESS
        else:  # refused: settled alone, as a refused plain success always is
            alone = write(
                lambda repo, lease=lease, result=result: settle(repo, lease, result, logger=logger)
            )
            outcome = alone.outcome if alone is not None else Outcome.LOST
        delay = max(0.0, (lease.claimed_at - lease.run_at).total_seconds())
        settled = (lease.task_type, str(outcome), result.duration, delay)
        if not ledger.record(settled, lease.token.bytes):
            report("settled", *settled, lease.token.bytes)
    if faults is not None and leases:
        faults.crash_slot_after_settlement()  # the ring has them, the batch record too
    ledger.batch_drop([lease.token.bytes for lease in leases])
    return claims


def released_unstarted(
    write: Writer[Settlement],
    ledger: Ledger,
    leases: Sequence[Claimed],
    reason: str,
    *,
    report: Callable[..., None],
    logger: Logger = log,
) -> None:
    """Prefetched tasks given back before they started (a shutdown, or one that waited
    longer than a prefetched task may): each released, its attempt refunded, due at once
    for any slot; counted and logged as a release of an unstarted claim is."""
    result = unstarted(reason)
    logger.info("%d prefetched task(s) released unstarted: %s", len(leases), reason)
    for lease in leases:
        settlement = write(
            lambda repo, lease=lease: settle(repo, lease, result, shutting_down=True, logger=logger)
        )
        outcome = settlement.outcome if settlement is not None else Outcome.LOST
        settled = (lease.task_type, str(outcome), None, None)
        if not ledger.record(settled, lease.token.bytes):
            report("settled", *settled, lease.token.bytes)
    ledger.batch_drop([lease.token.bytes for lease in leases])
