"""The transitions the lease's holder, a slot, makes: `claimed` (into its ledger before
anyone is told), `advance` (a sliced handler's cursor, under the same lease) and `conclude`
(its settlement in the rule book's order, with the retries of a settlement whose answer was
lost: slotd/lifecycle/__init__.py, "answer lost" and "Order")."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from slotd import db
from slotd import outcome as kinds
from slotd.lifecycle.by_outcome import settle
from slotd.lifecycle.settlement import Logger, Settlement, Writer, _done, _fields, log
from slotd.outcome import Outcome, Result
from slotd.repository import Claimed, Repository
from slotd.slot.ledger import Ledger


def claimed(ledger: Ledger, lease: Claimed) -> None:
    """A claim the slot made: into its ledger before anyone is told of it, so that from
    here on a death of the slot is settled by the supervisor (see `handed_over`)."""
    ledger.hold(lease)


def advance(repo: Repository, claimed: Claimed, payload: Mapping[str, Any] | str) -> bool:
    """A sliced handler's cursor, fenced on the lease: False when the lease is not ours."""
    return repo.advance_cursor(claimed.id, claimed.token, payload)


def step(repo: Repository, claimed: Claimed, index: int, name: str, value: str) -> bool:
    """A durable step's value (JSON text), stored at its place in the task's steps, fenced on
    the lease: False when the lease is not ours (rule book, "stepped")."""
    return repo.record_step(claimed.id, claimed.token, index, name, value)


def wait(
    repo: Repository,
    claimed: Claimed,
    index: int,
    name: str,
    event: str | None,
    for_s: float | None,
) -> tuple[str, Any] | None:
    """A durable sleep or event wait, fenced on the lease (rule book, "suspended")."""
    return repo.wait_step(claimed.id, claimed.token, index, name, event, for_s)


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
