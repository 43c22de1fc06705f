"""What every settlement in this package returns (`Settlement`) and the line it logs
(`_done`), its last step: after the database, before the caller's ledger (the rule book,
slotd/lifecycle/__init__.py, "Order"). The types the rooms share: how a caller writes
(`Writer`) and logs (`Logger`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from slotd import logs
from slotd.outcome import Outcome, Result
from slotd.repository import Claimed, Repository

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
    _said(outcome, claimed, result, logger, dead)
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


def _said(
    outcome: Outcome, claimed: Claimed, result: Result, logger: Logger, dead: bool = False
) -> None:
    """A settlement's log line, alone: a batch's successes need no Settlement each (a
    frozen dataclass of seven fields is several microseconds to build, per task)."""
    fields = {**_fields(claimed, result), "outcome": str(outcome), "duration": result.duration}
    level = logging.INFO
    if outcome in (
        Outcome.FAILURE,
        Outcome.TIMEOUT,
        Outcome.CRASHED,
        Outcome.LOST,
        Outcome.DISCARDED,
    ):
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
