"""The sweeps a replica's chores thread runs when there is something to sweep (when, is
slotd/supervisor/sweep_timer.py's): the expiry sweep (`expire`, the rule book's "expired")
and the lapse sweep (`lapse`, "lapsed"), both in `sweep`; what they ended, and what each
counts as (`Swept`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from slotd.outcome import Outcome
from slotd.repository import Repository

# The expiry sweep's batch, and how many batches one sweep runs before it yields the chores
# thread (a million rows expiring at once are swept over several poll intervals).
EXPIRE_BATCH = 1000


EXPIRE_ROUNDS = 20


def expire(repo: Repository) -> dict[str, int]:
    """The expiry sweep (see "expired" above): the tasks it made dead letters, per type."""
    return _swept(repo.expire_batch)


def lapse(repo: Repository, go_on: Sequence[str] = ()) -> dict[tuple[str, str], int]:
    """The lapse sweep (see "lapsed" above): the final attempts it settled, per (type,
    dead_reason). `go_on`: the types whose sequence goes on past a failed member
    (Registry.sequences_go_on)."""
    return _swept(lambda n: repo.lapsed_batch(n, go_on))


@dataclass(frozen=True)
class Swept:
    expired: dict[str, int]
    lapsed: dict[tuple[str, str], int]

    @property
    def full(self) -> bool:
        """It stopped at its bound (EXPIRE_ROUNDS full batches): more may be left to sweep."""
        bound = EXPIRE_ROUNDS * EXPIRE_BATCH
        return sum(self.expired.values()) >= bound or sum(self.lapsed.values()) >= bound

    def outcomes(self) -> list[tuple[str, Outcome, int]]:
        """What each swept task counts as in the outcome tally: (type, outcome, n)."""
        counted = [(t, Outcome.EXPIRED, n) for t, n in self.expired.items()]
        for (task_type, reason), n in self.lapsed.items():
            lapsed = Outcome.CANCELLED if reason == "cancelled" else Outcome.CRASHED
            counted.append((task_type, lapsed, n))
        return counted


def sweep(repo: Repository, lapses: bool = True, go_on: Sequence[str] = ()) -> Swept:
    """The expiry sweep, a chore of every replica when a task's expiry has come, and with
    it the lapse sweep when `lapses` (a heartbeat saw a final attempt's lease lapse: see
    "lapsed"). FOR UPDATE SKIP LOCKED shares the rows out, so a fleet sweeps each row once.
    `go_on`: as for `lapse`."""
    return Swept(expire(repo), lapse(repo, go_on) if lapses else {})


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
