"""When the supervisor sweeps (slotd.lifecycle.sweep): only when there is something to sweep.

The sweeps ran every poll tick on every replica, whether or not any task had an expiry: an
idle replica's statements doubled (0.23 -> 0.53 a second, 1 replica x 4 slots). What is to
sweep is known from the database, at no statement of its own:
- the soonest expiry of a task no lease holds, from every discovery (sql `discover`, its
  row with task_type NULL), which the slot passes on (`expire_in`): the timer is set for
  that instant. Every enqueue wakes a slot, and every poll tick's discovery reads it again,
  so an expiry enqueued after the last discovery is known at the next one at the latest;
- a final attempt's lapsed lease, from each heartbeat (sql `replica_heartbeat`, lapse_s):
  the lapse sweep runs at the heartbeat that sees one (`lapsed`), as it ran once a heartbeat
  interval before, and not at all while no final attempt's lease has lapsed.
The claim refuses an expired task from its expires_at by the database's clock, so no sweep
has to be on time for the rule; the sweep makes it a dead letter and answers its waiters."""

from __future__ import annotations

import time


class SweepTimer:
    def __init__(self) -> None:
        self.expire_at: float | None = None  # monotonic; None: no expiry known
        self.lapses = False  # a final attempt's lease has lapsed: sweep lapses next time

    def expire_in(self, seconds: float) -> None:
        """A discovery saw a task expire in `seconds` (negative: already): sweep then."""
        at = time.monotonic() + max(0.0, seconds)
        if self.expire_at is None or at < self.expire_at:
            self.expire_at = at

    def lapsed(self, lapse_s: float | None) -> None:
        """What a heartbeat read: a lease lapsed already (lapse_s <= 0): sweep now."""
        if lapse_s is not None and lapse_s <= 0:
            self.lapses = True

    def next_at(self) -> float | None:
        """The instant the loop must wake for a sweep, if any."""
        return time.monotonic() if self.lapses else self.expire_at

    def due(self, now: float) -> bool:
        return self.lapses or (self.expire_at is not None and now >= self.expire_at)

    def take(self) -> bool:
        """A sweep is posted: forget what asked for it; whether it sweeps lapses too."""
        lapses, self.lapses, self.expire_at = self.lapses, False, None
        return lapses

    def swept(self, full: bool) -> None:
        """A sweep ended; `full`: it stopped at its bound with more to sweep: again now."""
        if full:
            self.expire_in(0.0)
