"""Wake tokens: which idle slot goes next, and how a burst collapses.

Every source of "there may be work" (a NOTIFY, the shared ticker, a slot that just claimed
something) asks for one token. A token goes to exactly one idle slot; with none idle it is
remembered as a single pending token, so a burst of notifications while every slot is busy
turns into at most one discovery later, not one per notification."""

from __future__ import annotations

import time
from collections.abc import Callable

# A rate window's end, as the database computed it, plus this: a wake a hair early would
# find the window still full and only schedule another.
RETRY_SLACK = 0.005


class Tokens:
    def __init__(self, send: Callable[[int], None]) -> None:
        self._send = send
        self._idle: list[int] = []  # most recently idle last: it is the warmest
        self.pending = False
        # When a full rate window has room again or the next row not yet due (a delay, a
        # backoff) is due (monotonic), as a slot that found nothing read it from discovery:
        # no notification announces either, so the supervisor's loop offers a token then
        # (see retry_due), and an idle fleet starts the row when due, not at a poll tick.
        self.retry_at: float | None = None

    @property
    def idle(self) -> list[int]:
        return list(self._idle)

    def offer(self, *, remember: bool = True) -> bool:
        """Hand one token to an idle slot. `remember=False` (the ticker, the cascade) drops
        it when every slot is busy: busy slots go back to discovery on their own."""
        if self._idle:
            self._send(self._idle.pop())
            return True
        if remember:
            self.pending = True
        return False

    def retry_in(self, seconds: float) -> None:
        at = time.monotonic() + max(0.0, seconds) + RETRY_SLACK
        if self.retry_at is None or at < self.retry_at:
            self.retry_at = at

    def retry_due(self, now: float) -> bool:
        """Whether a rate window's end has come: the caller offers a token (once)."""
        if self.retry_at is None or now < self.retry_at:
            return False
        self.retry_at = None
        return True

    def slot_idle(self, number: int) -> None:
        if number in self._idle:
            return
        if self.pending:
            self.pending = False
            self._send(number)
        else:
            self._idle.append(number)

    def slot_gone(self, number: int) -> None:
        if number in self._idle:
            self._idle.remove(number)
