"""What a replica records for the dashboard between its chores, on the chores thread (never
the supervisor's loop): its outcome tally (every few seconds while attempts end, and once
more at shutdown), which slot holds which lease (within seconds of a change, not at the
next heartbeat), and, once a minute for the whole fleet, the backlog by type.

Each is one statement when there is something to write and none otherwise, and each
failure is only a later try: the dashboard's record must never cost the queue a chore."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import psycopg

from slotd import db
from slotd.outcome import MinuteTally
from slotd.repository import Repository
from slotd.repository import history as record

log = logging.getLogger("slotd.chores")

# How stale the outcome chart and the lease holders may be: short enough that a storm of
# lost or crashed attempts shows while it happens, and a task of a few seconds shows its
# holder. One statement per period at most, none while nothing changes.
EVERY = 2.0
HISTORY_EVERY = 60.0  # the backlog charts are by minute


class Recorder:
    def __init__(
        self,
        tally: MinuteTally,
        replica_id: str | None = None,
        leases: Callable[[], Mapping[int, int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tally, self.replica_id, self.leases, self.clock = tally, replica_id, leases, clock
        self._leases_written: Mapping[int, int] | None = None
        self._next = clock() + EVERY
        self._next_history = clock() + HISTORY_EVERY / 4  # a first sample soon after start

    def timeout(self) -> float:
        """Seconds until the next record is due (the chores thread's wait between jobs)."""
        return max(self._next - self.clock(), 0.0)

    def tick(self, repo: Callable[[], Repository]) -> bool:
        """Between two jobs: whatever is due. False after a database error (the caller
        drops its connection; what was not written waits for the next period)."""
        now = self.clock()
        if now < self._next:
            return True
        self._next = now + EVERY
        ok = self._attempt(self._outcomes, repo) and self._attempt(self._lease_holders, repo)
        if ok and now >= self._next_history:
            self._next_history = now + HISTORY_EVERY
            ok = self._attempt(record.sample_history, repo)
        return ok

    def final(self, repo: Callable[[], Repository]) -> bool:
        """At shutdown, after the last job: the last outcomes (the replica's row is gone)."""
        return self._attempt(self._outcomes, repo)

    def _attempt(
        self, write: Callable[[Repository], object], repo: Callable[[], Repository]
    ) -> bool:
        try:
            write(repo())
        except psycopg.Error as exc:
            log.debug("dashboard record not written yet: %s", db.first_line(exc))
            return False
        return True

    def _outcomes(self, repo: Repository) -> None:
        rows = self.tally.drain()
        if not rows:
            return
        try:
            repo.record_outcomes(rows)
        except BaseException:
            self.tally.restore(rows)  # nothing counted is lost: the next flush carries it
            raise

    def _lease_holders(self, repo: Repository) -> None:
        if self.leases is None or self.replica_id is None:
            return
        leases = dict(self.leases())
        if leases != self._leases_written:
            record.record_leases(repo, self.replica_id, leases)
            self._leases_written = leases
