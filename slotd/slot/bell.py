"""When a busy slot tells its supervisor how far its ledger goes (slotd.ledger): at most
RING_HOLD seconds after a settlement, at once when the ring is half full, and before the
slot goes idle. No message per task: the bell carries the ledger's count, the lease held now
and the runner's pid. Its due time shares the slot's one wait with the held log lines."""

from __future__ import annotations

import time
from collections.abc import Callable

from slotd import logs
from slotd.repository import Claimed
from slotd.slot.ledger import CAPACITY, Ledger, lean

# A busy slot's supervisor hears of its settlements and leases at most this late: metrics,
# the dashboard's outcomes and a cancel's routing lag by as much (a slot's death does not).
RING_HOLD = 0.25


class Bell:
    def __init__(
        self, ledger: Ledger, report: Callable[..., None], runner_pid: Callable[[], int | None]
    ) -> None:
        self.ledger, self.report, self.runner_pid = ledger, report, runner_pid
        self.holding: Claimed | None = None  # the lease held now, as the ledger has it
        self.unrung_since: float | None = None  # entries the supervisor has not heard of

    def settled(self) -> None:
        """After a settlement went into the ledger: ring if it is due."""
        now = time.monotonic()
        if self.unrung_since is None:
            self.unrung_since = now
        if self.ledger.unread() >= CAPACITY // 2 or now - self.unrung_since >= RING_HOLD:
            self.ring()

    def ring(self) -> None:
        """Tell the supervisor how far the ledger goes, and the lease held now."""
        self.unrung_since = None
        lease = None if self.holding is None else lean(self.holding)
        self.report("ledger", self.ledger.count, lease, self.runner_pid())

    def before_idle(self) -> None:
        if self.unrung_since is not None:
            self.ring()

    def pay_what_is_due(self, timeout: float | None) -> float | None:
        """Held log lines wait no longer than their hold, unrung ledger entries no longer
        than RING_HOLD: write what is due now, and wake in time for the rest."""
        for due_in, pay in ((logs.due_in, logs.flush), (self._due_in, self.ring)):
            if (due := due_in()) is None:
                continue
            if due <= 0:
                pay()
            else:
                timeout = due if timeout is None else min(timeout, due)
        return timeout

    def _due_in(self) -> float | None:
        if self.unrung_since is None:
            return None
        return self.unrung_since + RING_HOLD - time.monotonic()
