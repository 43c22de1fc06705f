"""Control notifications, as the supervisor hears them on its LISTEN connection: a cancel
goes to the slot holding the lease, a pause or resume is logged.

Every replica hears every cancel (sql `cancel` notifies the whole fleet), and only the one
whose slot holds the lease acts on it. A cancel for a lease no slot here has reported is kept
for CANCEL_MEMORY: its claim may have committed before the cancel with the slot's "claimed"
message still in the pipe, and `claimed` delivers it when that message arrives."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping

from slotd.supervisor.slot_pool import SlotHandle

log = logging.getLogger("slotd.supervisor")

# How long a cancel of a lease no slot here has reported is remembered: its claim may have
# committed (before the cancel) with the slot's "claimed" message still in the pipe.
CANCEL_MEMORY = 60.0


class ControlRouting:
    def __init__(self, slots: Mapping[int, SlotHandle]) -> None:
        self.slots = slots  # the pool's live map of slot number -> handle; only read here
        # A runtime schedule put somewhere in the fleet (sql `runtime_schedule_put`): the
        # schedule thread's poke, once it runs.
        self.on_schedule: Callable[[], None] | None = None
        self.cancels: dict[str, tuple[float, int, str]] = {}  # token -> (forget at, id, by)

    def heard(self, payload: str) -> None:
        """A cancel, pause or resume committed somewhere in the fleet (sql `cancel`, `pause`,
        `resume`): route a cancel to the slot holding the lease, log the rest."""
        try:
            message = json.loads(payload)
            op, by = message["op"], message["by"]
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed control notification %r", payload[:200])
            return
        if op == "cancel":
            self._route_cancel(str(message.get("token")), int(message.get("id") or 0), by)
        elif op == "pause":
            until = message.get("until")
            log.info(
                "task type %s paused by %s%s",
                message.get("task_type"),
                by,
                f" until {until}" if until else "",
                extra={"task_type": message.get("task_type"), "by": by},
            )
        elif op == "schedule":
            if self.on_schedule is not None:
                self.on_schedule()
        elif op == "resume":
            log.info(
                "task type %s resumed by %s",
                message.get("task_type"),
                by,
                extra={"task_type": message.get("task_type"), "by": by},
            )

    def _route_cancel(self, token: str, task_id: int, by: str) -> None:
        for handle in self.slots.values():
            if handle.lease is not None and str(handle.lease.token) == token:
                self._tell_cancel(handle, task_id, token, by)
                return
        # Not a lease any slot here has reported: another replica's, or one whose "claimed"
        # message is still on its way. Every replica hears every cancel, so keep it briefly.
        now = time.monotonic()
        self.cancels = {t: c for t, c in self.cancels.items() if c[0] > now}
        self.cancels[token] = (now + CANCEL_MEMORY, task_id, by)

    def claimed(self, handle: SlotHandle) -> None:
        """A slot reported a new lease: deliver a cancel that arrived before the report."""
        if self.cancels and handle.lease is not None:
            asked = self.cancels.pop(str(handle.lease.token), None)
            if asked is not None:
                self._tell_cancel(handle, asked[1], str(handle.lease.token), asked[2])

    def _tell_cancel(self, handle: SlotHandle, task_id: int, token: str, by: str) -> None:
        log.info(
            "task %s cancelled by %s: stopping it in slot %d",
            task_id,
            by,
            handle.number,
            extra={"task_id": task_id, "by": by},
        )
        try:
            handle.conn.send(("cancel", task_id, token, by))
        except OSError:
            pass  # the slot is dying; the cancelled row is dead once its lease is settled
