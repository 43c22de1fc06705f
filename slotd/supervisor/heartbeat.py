"""The replica's periodic statements, posted to the chores thread by the supervisor's loop:
the heartbeat (which announces the replica and says which slot holds which lease), the
hourly retention, and at exit the goodbye. (The outcomes the dashboard charts are counted
in outcome_counts.py.)

Posted, never run here: the loop never waits on the database (chores.py)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from slotd.config import Settings
from slotd.registry import Registry
from slotd.repository import Beat
from slotd.supervisor import maintenance
from slotd.supervisor.chores import Chores
from slotd.supervisor.horizon import Holder, HorizonWatch
from slotd.supervisor.slot_pool import SlotHandle

log = logging.getLogger("slotd.supervisor")

GOODBYE_TIMEOUT = 10.0  # at exit: the last settlements and the replica's goodbye


class Heartbeat:
    def __init__(
        self,
        replica_id: str,
        settings: Settings,
        registry: Registry,
        slots: Mapping[int, SlotHandle],
        metrics: Callable[[], Any] = lambda: None,
    ) -> None:
        self.replica_id = replica_id
        self.settings = settings
        self.registry = registry
        self.slots = slots  # the pool's live map of slot number -> handle; only read here
        self.metrics = metrics  # the replica's Metrics, once its server runs
        self.horizon = HorizonWatch(settings.horizon_warn)

    def post(self, chores: Chores) -> None:
        """Announce this replica (one statement per heartbeat besides its discoveries), on
        the chores thread; one at a time, so a stalled database is not sent a pile of them.
        It says which slot holds which lease, and reads back who holds back vacuum (on the
        primary) and when the soonest final attempt's lease lapses (`beaten`): one statement,
        so an idle replica sends nothing between its discoveries but this."""
        if not chores.pending["heartbeat"]:
            replica = (self.replica_id, socket.gethostname(), os.getpid())
            slots, types = self.settings.slots, self.registry.types
            leases = self.leases()
            limits = self.registry.concurrency_limits
            horizon = self.settings.horizon_warn.total_seconds() > 0

            def job() -> Beat:
                repo = chores.repo()
                return repo.heartbeat(*replica, slots, types, leases, limits, horizon=horizon)

            chores.post("heartbeat", job)

    def beaten(self, beat: Beat) -> None:
        """What the heartbeat read: the horizon's holder, when it is watched."""
        if self.settings.horizon_warn.total_seconds() > 0:
            self.horizon_seen(beat.horizon)

    def horizon_seen(self, row: Mapping[str, Any] | None) -> None:
        """The horizon's holder as the chores thread read it: a warning when it is worth one
        (slotd.horizon), and the gauge."""
        holder = Holder.from_row(row)
        self.horizon.seen(holder)
        metrics = self.metrics()
        if metrics is not None:
            metrics.set_horizon(holder)

    def leases(self) -> dict[int, int]:
        """task id -> the slot holding its lease. Also read by the chores thread (the
        recorder): `list()` copies the map in one step under the GIL and each lease is read
        once, so the loop's changes meanwhile cannot break the iteration."""
        return {lease.id: n for n, h in list(self.slots.items()) if (lease := h.lease) is not None}

    def post_retention(self, chores: Chores) -> None:
        retention = self.settings.retention
        if not chores.pending["retention"]:
            chores.post(
                "retention", lambda: maintenance.hourly_cleanup(chores.repo(), retention, log)
            )

    def goodbye(self, chores: Chores) -> None:
        """The replica's last statement, then the chores thread's end."""
        replica_id = self.replica_id
        chores.post("replica_gone", lambda: chores.repo().replica_gone(replica_id))
        # The dead slots' last settlements are queued before the goodbye; a database
        # that does not answer gets a bounded wait, then the leases expire on their own.
        if not chores.stop(GOODBYE_TIMEOUT):
            log.warning("the database did not answer the goodbye within %ss", GOODBYE_TIMEOUT)
