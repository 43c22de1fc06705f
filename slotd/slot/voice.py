"""The slots of one replica speak of a database outage as one voice: each slot retries on its
own, but a line about it is written by the first slot to reach each step of the outage (its
own `logs.Repeats` chose to log it), not by every slot; the others write it at DEBUG. A slot
that alone cannot connect (its server's connection limit, say) still gets its lines: no
other slot has said anything.

The state is a few numbers in memory the supervisor makes before it forks the slots, so
every slot sees the others' writes. No lock: a slot killed while holding one would silence
the rest for good, and the worst a race costs is one line written twice."""

from __future__ import annotations

import multiprocessing
import time

from slotd.logs import Repeats

_STEP, _SAID_AT, _LOST_AT = range(3)
_NEVER = float("-inf")


class SlotsVoice:
    # One "lost the database connection" line per this many seconds, whichever slot lost it.
    LOST_QUIET = 10.0

    def __init__(self) -> None:
        self._shared = multiprocessing.RawArray("d", [0.0, _NEVER, _NEVER])

    def may_say(self, failures: int) -> bool:
        """Whether this slot writes the line about its `failures`-th failure in a row, which
        its own Repeats chose to log: a step of the outage no slot has reported yet, or a
        reminder when no slot has said anything for a minute."""
        shared = self._shared
        now = time.monotonic()
        fresh = now - shared[_SAID_AT] < Repeats.REMIND_EVERY
        # The 1st, 2nd, 4th... failure is step 1, 2, 3...; others are a minute's reminder.
        step = failures.bit_length() if failures & (failures - 1) == 0 else 0
        if fresh and step <= shared[_STEP]:
            return False
        shared[_STEP] = max(step, shared[_STEP] if fresh else 0.0)
        shared[_SAID_AT] = now
        return True

    def recovered(self) -> None:
        """A slot is connected again after failures: the next outage starts at step 1."""
        self._shared[_STEP] = 0.0

    def may_say_lost(self) -> bool:
        """Whether this slot writes "lost the database connection" (the first slot to lose
        it in LOST_QUIET seconds does)."""
        now = time.monotonic()
        if now - self._shared[_LOST_AT] < self.LOST_QUIET:
            return False
        self._shared[_LOST_AT] = now
        return True
