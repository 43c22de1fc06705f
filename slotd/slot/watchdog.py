"""The watchdog's timeline for one handler call, on the monotonic clock.

At the deadline the handler is interrupted in its own frame; a kill grace later its runner's
process group is killed. At shutdown the handler is told at once (ctx.cancelled) and killed
when the shutdown grace ends, or at once on a second signal. An operator's cancel is told at
once the same way and killed a kill grace later, as a deadline would be. Pure decisions, no
processes: the slot carries them out."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum


class Step(Enum):
    INTERRUPT = "interrupt"  # raise DeadlineExceeded in the handler's frame
    KILL = "kill"  # the deadline and the kill grace have passed
    CANCEL = "cancel"  # shutdown began or an operator cancelled the task: set ctx.cancelled
    SHUTDOWN_KILL = "shutdown_kill"  # the shutdown grace ran out (or a second signal)
    CANCEL_KILL = "cancel_kill"  # the kill grace after an operator's cancel has passed


@dataclass
class Watchdog:
    interrupt_at: float
    kill_at: float
    shutdown_grace: float
    started: float
    kill_grace: float = 0.0
    interrupted: bool = False
    shutdown_kill_at: float | None = None
    cancel_kill_at: float | None = None

    @classmethod
    def for_deadline(
        cls,
        deadline: datetime,
        kill_grace: timedelta,
        shutdown_grace: timedelta,
        now: float | None = None,
    ) -> Watchdog:
        # The one conversion from the database's stamp to this host's monotonic clock; the
        # lease margin absorbs the skew between the two.
        now = time.monotonic() if now is None else now
        # Timestamps, not datetime arithmetic: this runs once per task in a busy slot.
        interrupt_at = now + deadline.timestamp() - time.time()
        return cls(
            interrupt_at,
            interrupt_at + kill_grace.total_seconds(),
            shutdown_grace.total_seconds(),
            now,
            kill_grace.total_seconds(),
        )

    def step(
        self, now: float, stopping: bool = False, hurry: bool = False, cancelled: bool = False
    ) -> Step | None:
        """What is due now, at most one thing; call again until it returns None."""
        if cancelled and self.cancel_kill_at is None:
            self.cancel_kill_at = now + self.kill_grace
            if self.shutdown_kill_at is None:  # else the handler was told already
                return Step.CANCEL
        if self.cancel_kill_at is not None and now >= self.cancel_kill_at:
            return Step.CANCEL_KILL
        if stopping and self.shutdown_kill_at is None:
            self.shutdown_kill_at = now + self.shutdown_grace
            return Step.CANCEL
        if hurry and self.shutdown_kill_at is not None:
            self.shutdown_kill_at = min(self.shutdown_kill_at, now)
        if self.shutdown_kill_at is not None and now >= self.shutdown_kill_at:
            return Step.SHUTDOWN_KILL
        if now >= self.kill_at:
            return Step.KILL
        if now >= self.interrupt_at and not self.interrupted:
            self.interrupted = True
            return Step.INTERRUPT
        return None

    def wait_for(self, now: float, at_most: float = 1.0) -> float:
        """Seconds until the next step is due (capped, so the caller can refresh its title)."""
        steps = [self.kill_at]
        for extra in (self.shutdown_kill_at, self.cancel_kill_at):
            if extra is not None:
                steps.append(extra)
        if not self.interrupted:
            steps.append(self.interrupt_at)
        return max(0.0, min(min(steps) - now, at_most))
