"""A dead slot's lease: settled at once by the lifecycle, on the chores thread, rather than
left to wait out ceiling + margin (see lifecycle.handed_over).

The pool finds the lease and the slot's last words in its ledger when it buries the slot
(slot_pool.py); the settlement is a job for the chores thread, since the database may
be why the slot died and the loop never waits on it; what it settled comes back as a
finished chore (chore_results.py) and is counted like any other settlement."""

from __future__ import annotations

import logging
from collections.abc import Callable

from slotd import db, lifecycle
from slotd.outcome import Result
from slotd.registry import Registry
from slotd.repository import Claimed
from slotd.slot.ledger import Settled
from slotd.supervisor.chores import Chores, Done

log = logging.getLogger("slotd.supervisor")


class Orphans:
    def __init__(
        self,
        registry: Registry,
        *,
        chores: Callable[[], Chores | None],
        stopping: Callable[[], bool],
        counted: Callable[[Settled], None],
    ) -> None:
        self._registry = registry
        self._chores = chores  # the supervisor's chores thread, once it runs
        self._stopping = stopping  # a lease left while the replica stops is released
        self._counted = counted

    def settle(self, lease: Claimed, words: Result | None) -> None:
        """A slot died holding a lease: settled at once by the lifecycle, on the chores
        thread (see lifecycle.handed_over)."""
        chores = self._chores()
        assert chores is not None
        stopping, registry = self._stopping(), self._registry

        def job() -> tuple[Claimed, str, float | None]:
            settled, result = lifecycle.handed_over(
                chores.repo(), lease, words, stopping=stopping, registry=registry, logger=log
            )
            return lease, str(settled.outcome), result.duration

        chores.post("settle_orphan", job)

    def settled(self, done: Done) -> None:
        if done.error is not None:
            log.error("could not settle the task of a dead slot: %s", db.first_line(done.error))
            return
        lease, outcome, duration = done.value
        self._counted((lease.task_type, outcome, duration, None))
