"""What the chores thread hands back (chores.py), handed to the room it concerns: the
LISTEN connection it opened and the self-test it sent (listener.py), a dead slot's
settled lease (orphans.py), what the sweeps ended (slotd/lifecycle/, "expired" and
"lapsed"), and the heartbeat's and the retention's failures.

Read by the supervisor's loop when the chores pipe is ready; nothing here waits."""

from __future__ import annotations

import logging
from collections.abc import Callable

from slotd import db
from slotd.lifecycle import Swept
from slotd.logs import Repeats
from slotd.repository import Beat
from slotd.slot.ledger import Settled
from slotd.supervisor.chores import Chores, Done
from slotd.supervisor.listener import Listener
from slotd.supervisor.orphans import Orphans
from slotd.supervisor.sweep_timer import SweepTimer
from slotd.supervisor.wake import Tokens

log = logging.getLogger("slotd.supervisor")


class ChoreResults:
    def __init__(
        self,
        listener: Listener,
        tokens: Tokens,
        orphans: Orphans,
        *,
        chores: Callable[[], Chores | None],
        stopping: Callable[[], bool],
        counted: Callable[[Settled], None],
        ready: Callable[[], None],
        fatal: Callable[[str], None],
        beaten: Callable[[Beat], None] = lambda _beat: None,
        sweeps: SweepTimer | None = None,
    ) -> None:
        self._listener = listener
        self._tokens = tokens
        self._orphans = orphans
        self._chores = chores  # the supervisor's chores thread, once it runs
        self._stopping = stopping
        self._counted = counted
        self._ready = ready  # every slot may be up now: announce readiness once
        self._fatal = fatal  # a misconfiguration every slot would hit: stop the replica
        # What a heartbeat read: who holds back vacuum, when a lease lapses (the loop's).
        self._beaten = beaten
        self._sweeps = sweeps if sweeps is not None else SweepTimer()
        # A database gone fails a sweep every poll: a run of failures is told in steps.
        self._repeats = {"sweep": Repeats(), "heartbeat": Repeats()}

    def done(self, done: Done) -> None:
        if done.name == "listen":
            if self._listener.opened(done, stopping=self._stopping()):
                chores = self._chores()
                assert chores is not None
                # Notifications sent while we were deaf are lost: look once now, not at the
                # next tick.
                self._tokens.offer()
                self._ready()
                self._listener.selftest_send(chores)
        elif done.name == "settle_orphan":
            self._orphans.settled(done)
        elif done.name == "sweep":
            if done.error is not None:
                level = self._repeats["sweep"].level()
                log.log(level, "sweep failed: %s", db.first_line(done.error))
                return
            self._repeats["sweep"].ok()
            self._swept(done.value)
        elif done.name == "selftest":
            self._listener.selftest_sent(done)
        elif done.name == "heartbeat":
            if done.error is None:
                self._repeats["heartbeat"].ok()
                self._beaten(done.value)
                return
            if db.is_prepare_error(done.error):
                self._fatal(db.PREPARE_ADVICE.format(error=db.first_line(done.error)))
            level = self._repeats["heartbeat"].level()
            log.log(level, "heartbeat failed: %s", db.first_line(done.error))
        elif done.error is not None and done.name == "retention":
            log.warning("retention cleanup failed: %s", db.first_line(done.error))

    def _swept(self, swept: Swept) -> None:
        self._sweeps.swept(swept.full)
        for (task_type, reason), n in swept.lapsed.items():
            log.warning(
                "%d %s task(s) became dead letters (%s): their final attempt's lease "
                "lapsed with no replica left to settle it",
                n,
                task_type,
                reason,
            )
        for task_type, n in swept.expired.items():
            log.info("%d %s task(s) expired unstarted", n, task_type)
        for task_type, outcome, n in swept.outcomes():
            for _ in range(n):
                self._counted((task_type, str(outcome), None, None))
