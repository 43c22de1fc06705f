"""Who holds back vacuum: the oldest xmin in the database, as each replica reads it every
heartbeat (sql/queries.sql, horizon_holder), turned into a warning that names it, a gauge,
and a line of `slotd status`. A held horizon is how a PostgreSQL queue slows down without
any error (README, "A transaction held open"): this makes it visible before it costs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from slotd.config import format_duration

log = logging.getLogger("slotd.supervisor")

# A holder with no start time (a replication slot, a standby's walsender) is shown once it is
# this many transactions behind: the queue itself uses a few per task, so fewer is noise.
UNTIMED_SHOWN_XIDS = 10_000
REPEAT_EVERY = timedelta(minutes=10)  # the warning again while the same holder stays


@dataclass(frozen=True)
class Holder:
    kind: str  # session, replication slot, prepared transaction
    pid: int | None
    who: str
    state: str
    age_s: float | None  # how long its transaction has been open (None: not known)
    xids: int  # how many transactions the horizon is behind because of it

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | None) -> Holder | None:
        """A row of sql horizon_holder: its columns are these fields."""
        return None if row is None else cls(**row)

    @property
    def key(self) -> tuple[str, int | None, str]:
        return (self.kind, self.pid, self.who)

    def describe(self) -> str:
        name = f"{self.kind} {self.who}" if self.pid is None else f"pid {self.pid} ({self.who})"
        held = "" if self.age_s is None else f" for {format_duration(self.age_s)}"
        return f"{name}, {self.state}{held}, {self.xids:,} transactions behind"

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["age_seconds"] = data.pop("age_s")
        return data


def worth_showing(holder: Holder | None, warn_after: timedelta) -> bool:
    """A holder the operator should hear about: open at least `warn_after`, or, when its
    start is unknown, far enough behind (UNTIMED_SHOWN_XIDS)."""
    if holder is None or warn_after <= timedelta(0):
        return False
    if holder.age_s is None:
        return holder.xids >= UNTIMED_SHOWN_XIDS
    return holder.age_s >= warn_after.total_seconds()


def status_line(holder: Holder | None, warn_after: timedelta) -> str:
    """`slotd status`'s line: the holder when it is worth showing, else that none is."""
    if not worth_showing(holder, warn_after):
        return "vacuum horizon: not held back"
    assert holder is not None
    return f"vacuum horizon: held back by {holder.describe()}"


class HorizonWatch:
    """One warning per holder that crosses `warn_after`, repeated every REPEAT_EVERY while it
    stays, and one line when it has gone: a log an operator can grep, not one per heartbeat."""

    def __init__(self, warn_after: timedelta, clock: Callable[[], float] = time.monotonic) -> None:
        self.warn_after = warn_after
        self.clock = clock
        self._warned: tuple[tuple[str, int | None, str], float] | None = None

    def seen(self, holder: Holder | None) -> str | None:
        """The line to log for this reading, if any (also logged here)."""
        said = self._line(holder)
        if said is None:
            return None
        level, line = said
        log.log(level, "%s", line)
        return line

    def _line(self, holder: Holder | None) -> tuple[int, str] | None:
        now = self.clock()
        if not worth_showing(holder, self.warn_after):
            if self._warned is None:
                return None
            self._warned = None
            return logging.INFO, "the vacuum horizon is no longer held back"
        assert holder is not None
        if self._warned is not None:
            key, at = self._warned
            if key == holder.key and now - at < REPEAT_EVERY.total_seconds():
                return None
        self._warned = (holder.key, now)
        return logging.WARNING, (
            f"vacuum is held back by {holder.describe()}: finished tasks' rows and index "
            "entries cannot be reclaimed meanwhile, and discovery slows as they pile up "
            "(README, A transaction held open)"
        )
