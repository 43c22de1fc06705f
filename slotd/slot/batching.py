"""A slot's batch (#43; the rules are the rule book's "batched", slotd/lifecycle/__init__.py):
the prefetched tasks it claimed and has not started, the plain successes it ran and has not
settled, and how many to claim per statement.

How many, measured rather than guessed: the depth is the candidates the slot's discovery
found and it has not consumed yet (a discovery reads the due index's head, so a deep backlog
fills it); the handler's time is a moving average of this slot's attempts, wall time from
the runner's message to its answer. A claim takes n = min(SLOTD_CLAIM_BATCH, depth, BATCH_WAIT_S /
that average) rows: the last of them waits about BATCH_WAIT_S for the ones before it. Below
two, the slot claims one row per statement, as it always did: at low load (a wake finds one
or two rows) and for handlers longer than BATCH_WAIT_S / 2. Bounds on the waits a batch
adds: a prefetched task not started within PREFETCH_MAX_WAIT_S of its claim (a quarter of
its ceiling, if less: a slow handler ahead of it) is released unstarted, its attempt given
back, due at once for any slot; a success waits for its settlement at most DEFER_MAX_S."""

from __future__ import annotations

import time
from collections import deque
from datetime import timedelta

from slotd.config import CLAIM_BATCH_MAX
from slotd.outcome import Result
from slotd.repository import Claimed

MAX_BATCH = CLAIM_BATCH_MAX  # SLOTD_CLAIM_BATCH lowers it per replica
BATCH_WAIT_S = 0.05
PREFETCH_MAX_WAIT_S = 1.0
DEFER_MAX_S = 0.05
# Weight of the newest attempt in the moving average: about the last ten attempts count.
_WEIGHT = 0.2


class Batch:
    def __init__(self, margin: timedelta, most: int = MAX_BATCH) -> None:
        self.margin = margin
        self.most = min(most, MAX_BATCH)  # SLOTD_CLAIM_BATCH
        self.waiting: deque[tuple[Claimed, float]] = deque()  # prefetched, with its bound
        # The soonest bound of those waiting, or one before it (see `next`); None: none wait.
        self.soonest: float | None = None
        self.done: list[tuple[Claimed, Result]] = []  # ran to success, not settled yet
        self.done_since: float | None = None
        self.average_s: float | None = None

    @property
    def holds(self) -> bool:
        return bool(self.waiting or self.done)

    def measured(self, seconds: float | None) -> None:
        if seconds is None:
            return
        avg = self.average_s
        self.average_s = seconds if avg is None else avg + _WEIGHT * (seconds - avg)

    def size(self, depth: int) -> int:
        """How many to claim with the next statement, at this depth (see the module)."""
        if self.average_s is None or depth < 2:
            return 1
        fits = int(BATCH_WAIT_S / max(self.average_s, 1e-4))
        return max(1, min(self.most, depth, fits))

    def fetched(self, claims: list[Claimed]) -> None:
        # Each one's bound is reckoned once, here: `overdue` and `due_in` are asked on every
        # task and on every pass of a running attempt's watch (#43 item 2).
        now = time.monotonic()
        self.waiting.extend((claim, self._overdue_at(claim, now)) for claim in claims)
        if claims:
            self.soonest = min(at for _, at in self.waiting)

    def _overdue_at(self, claim: Claimed, fetched: float) -> float:
        ceiling = (claim.lease_expires_at - claim.claimed_at - self.margin).total_seconds()
        return fetched + min(PREFETCH_MAX_WAIT_S, ceiling / 4)

    def overdue(self) -> list[Claimed]:
        """Prefetched tasks that waited past their bound: to be released unstarted."""
        now = time.monotonic()
        if self.soonest is None or self.soonest >= now:
            return []
        late = [claim for claim, at in self.waiting if at < now]
        if late:
            self.waiting = deque((c, at) for c, at in self.waiting if at >= now)
        self._reckon()
        return late

    def _reckon(self) -> None:
        self.soonest = min((at for _, at in self.waiting), default=None)

    def held_too_long(self) -> bool:
        """Whether the oldest held success has waited DEFER_MAX_S for its statement."""
        since = self.done_since
        return since is not None and time.monotonic() - since >= DEFER_MAX_S

    def due_in(self) -> float | None:
        """Seconds until a held success or a prefetched task reaches its bound (None:
        nothing held): how long a running attempt's watch may wait before it looks."""
        soonest = self.soonest
        if self.done_since is not None:
            held = self.done_since + DEFER_MAX_S
            soonest = held if soonest is None else min(soonest, held)
        return None if soonest is None else max(0.0, soonest - time.monotonic())

    def next(self) -> Claimed | None:
        if not self.waiting:
            return None
        # `soonest` may stay below the bound of every task left (the one just taken had
        # it): a watch then looks a little early, once, and `overdue` reckons it again.
        # Reckoning here was a pass over the batch per task (a batch's bounds are equal).
        claim, _ = self.waiting.popleft()
        if not self.waiting:
            self.soonest = None
        return claim

    def defer(self, claimed: Claimed, result: Result) -> None:
        if not self.done:
            self.done_since = time.monotonic()
        self.done.append((claimed, result))

    def settle_due(self) -> bool:
        """Whether the held successes are to be settled now: nothing left to run first, or
        the oldest has waited DEFER_MAX_S."""
        if not self.done:
            return False
        return not self.waiting or self.held_too_long()

    def take_done(self) -> list[tuple[Claimed, Result]]:
        done, self.done, self.done_since = self.done, [], None
        return done

    def take_waiting(self) -> list[Claimed]:
        waiting = [claim for claim, _ in self.waiting]
        self.waiting.clear()
        self.soonest = None
        return waiting
