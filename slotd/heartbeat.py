"""The replica's periodic statements, posted to the chores thread by the supervisor's loop:
the heartbeat (which announces the replica, says which slot holds which lease and flushes
the outcomes counted since the last one to slotd_outcomes, the dashboard's chart) and the
hourly retention.

Posted, never run here: the loop never waits on the database (slotd/chores.py)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from slotd import maintenance
from slotd.chores import Chores
from slotd.config import Settings
from slotd.outcome import MinuteTally
from slotd.registry import Registry
from slotd.slot_pool import SlotHandle

log = logging.getLogger("slotd.supervisor")


class Heartbeat:
    def __init__(
        self,
        replica_id: str,
        settings: Settings,
        registry: Registry,
        slots: Mapping[int, SlotHandle],
    ) -> None:
        self.replica_id = replica_id
        self.settings = settings
        self.registry = registry
        self.slots = slots  # the pool's live map of slot number -> handle; only read here
        self.tally = MinuteTally()  # the dashboard's outcome chart, flushed per heartbeat
        self.unflushed: list[Any] = []  # what the heartbeat in flight carries

    def post(self, chores: Chores) -> None:
        """Announce this replica (one statement per heartbeat besides its discoveries), on
        the chores thread; one at a time, so a stalled database is not sent a pile of them.
        The same job adds the outcomes counted since the last one to slotd_outcomes (the
        dashboard's chart) and says which slot holds which lease."""
        if not chores.pending["heartbeat"]:
            replica = (self.replica_id, socket.gethostname(), os.getpid())
            slots, types = self.settings.slots, self.registry.types
            leases = {h.lease.id: n for n, h in self.slots.items() if h.lease is not None}
            limits = self.registry.concurrency_limits
            self.unflushed = rows = self.tally.drain()

            def job() -> None:
                repo = chores.repo()
                repo.heartbeat(*replica, slots, types, leases, limits)
                repo.record_outcomes(rows)

            chores.post("heartbeat", job)

    def failed(self) -> None:
        self.tally.restore(self.unflushed)  # the chart catches up at the next heartbeat

    def post_retention(self, chores: Chores) -> None:
        retention = self.settings.retention
        if not chores.pending["retention"]:
            chores.post(
                "retention", lambda: maintenance.hourly_cleanup(chores.repo(), retention, log)
            )
