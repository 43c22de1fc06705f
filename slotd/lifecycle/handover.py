"""`handed_over`: the lease of a slot that died, settled by its supervisor on the chores
thread by the slot's last words (the rule book's "handed over", slotd/lifecycle/__init__.py;
the supervisor's side is slotd/supervisor/orphans.py)."""

from __future__ import annotations

from slotd import outcome as kinds
from slotd.lifecycle.by_outcome import settle
from slotd.lifecycle.settlement import Logger, Settlement, log
from slotd.outcome import Result
from slotd.registry import Registry
from slotd.repository import Claimed, Repository


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
