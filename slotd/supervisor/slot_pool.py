"""The supervisor's slots: forked, watched, respawned with a backoff, killed when they outstay
a stop.

The pool keeps the slots' processes and handles, reads what a slot left in its ledger, and
hands on what that means through the callables it is given: a settlement to count, a lease
a dead slot held (the supervisor settles it), a restart to record. What a slot says on its
pipe is the supervisor's (loop.py). Nothing here waits: a slot's exit is noticed
by the supervisor's one wait, on the exit descriptor each handle carries."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from slotd import lifecycle, proc
from slotd.outcome import Result
from slotd.repository import Claimed
from slotd.slot.ledger import Ledger, Settled
from slotd.slot.loop import run_slot
from slotd.slot.spec import SlotSpec

log = logging.getLogger("slotd.supervisor")

SLOT_BACKOFF_CAP = 30.0


@dataclass
class SlotHandle:
    number: int
    pid: int
    conn: Connection
    watch: proc.ChildWatch
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    busy: bool = False
    lease: Claimed | None = None
    # Its settlements, lease and last words (slotd.ledger).
    ledger: Ledger = field(default_factory=Ledger)
    runner_pid: int | None = None
    stuck: int = 0  # runners that did not die after SIGKILL (uninterruptible sleep)
    # The lease its last "settled" message settled: a slot killed before it dropped that
    # lease from its ledger has settled it already (see Ledger.settled).
    settled_token: bytes | None = None


class SlotPool:
    def __init__(
        self,
        spec_for: Callable[[int], SlotSpec],
        forget_in_child: Callable[[], None],
        *,
        counted: Callable[[Settled], None],
        orphaned: Callable[[Claimed, Result | None], None],
        restarted: Callable[[str], None],
    ) -> None:
        self._spec_for = spec_for
        # What else of the supervisor's a forked child must let go of (its self-pipe, the
        # chores pipe, the metrics socket, its signal handlers).
        self._forget_rest = forget_in_child
        self._counted = counted
        self._orphaned = orphaned
        self._restarted = restarted
        self.slots: dict[int, SlotHandle] = {}
        self.respawn_at: dict[int, float] = {}
        self.failures: dict[int, int] = {}
        self.reload_queue: list[int] = []
        self.stopping = False

    def spawn(self, number: int) -> None:
        ours, theirs = socket.socketpair()
        spec = self._spec_for(number)
        pid = proc.fork_guarded()
        if pid == 0:
            try:  # a forked child never returns into the supervisor's stack
                ours.close()
                self._forget_in_child()
                run_slot(spec, Connection(theirs.detach()))
            finally:
                os._exit(1)
        theirs.close()
        self.slots[number] = SlotHandle(
            number,
            pid,
            Connection(ours.detach()),
            proc.ChildWatch(pid),
            ledger=spec.ledger,
        )
        self.respawn_at.pop(number, None)

    def _forget_in_child(self) -> None:
        # The child keeps nothing of the supervisor's: not the other slots' pipes (their EOF
        # is how a dead peer is noticed), not the self-pipe, not the metrics socket.
        for handle in self.slots.values():
            handle.conn.close()
            handle.watch.close()
            handle.ledger.close()
        self._forget_rest()

    def watched(self) -> list[Any]:
        watched: list[Any] = []
        for handle in self.slots.values():
            watched.append(handle.conn)
            if handle.watch.fd is not None:
                watched.append(handle.watch)
        return watched

    def send_token(self, number: int) -> None:
        handle = self.slots.get(number)
        if handle is None:
            return
        handle.busy = True
        try:
            handle.conn.send(("wake",))
        except OSError:
            pass  # the slot is dying; its exit is handled on the next pass

    def started(self, handle: SlotHandle) -> None:
        handle.ready = True
        self.failures.pop(handle.number, None)

    def read_ledger(self, handle: SlotHandle, upto: int | None) -> None:
        for settled in handle.ledger.consume(upto):
            self._counted(settled)

    def bury(self, handle: SlotHandle, status: int | None) -> None:
        """A slot exited: count what it left, hand on the lease it held, restart it."""
        del self.slots[handle.number]
        handle.conn.close()
        handle.watch.close()
        if handle.runner_pid:
            proc.kill_group(handle.runner_pid, signal.SIGKILL)
        # What it wrote and did not ring for, and the lease it held: from the page, which
        # nothing writes any more (slotd.ledger).
        self.read_ledger(handle, None)
        batch = handle.ledger.batch()  # its prefetched tasks and unsettled successes (#43)
        batched = {lease.token.bytes for lease, _ in batch}
        handle.lease = handle.ledger.lease()
        if (
            handle.lease is not None
            and handle.lease.token.bytes != handle.settled_token
            and handle.lease.token.bytes not in batched  # the batch's word wins: see ledger
        ):
            self._orphaned(handle.lease, handle.ledger.heard(handle.lease.token))
        for lease, state in batch:
            self._orphaned(lease, lifecycle.batched_words(state))
        handle.ledger.close()
        if self.stopping:
            return
        # A slot that keeps dying backs off instead of forking in a loop; the first death
        # restarts at once, and a slot that reports ready again is forgiven (`started`).
        failures = self.failures.get(handle.number, 0) + 1
        self.failures[handle.number] = failures
        delay = min(0.5 * 2 ** (failures - 1), SLOT_BACKOFF_CAP) if failures > 1 else 0.0
        log.error(
            "slot %d %s; restarting it%s",
            handle.number,
            proc.describe_status(status),
            f" in {delay:.1f}s" if delay else "",
            extra={"slot": handle.number, "runner_pid": handle.runner_pid},
        )
        self._restarted("slot_died")
        self.respawn_at[handle.number] = time.monotonic() + delay

    def respawn_due(self, now: float) -> None:
        for number, when in list(self.respawn_at.items()):
            if now >= when:
                self.spawn(number)

    def signal_all(self, sig: int) -> None:
        for handle in self.slots.values():
            proc.send(handle.pid, sig)

    def stop(self) -> None:
        """Ask every slot to stop (each releases its lease within the shutdown grace) and
        restart none that exits from now on."""
        self.stopping = True
        self.signal_all(signal.SIGTERM)
        self.respawn_at.clear()

    # the rolling reload (SIGHUP): one slot at a time, between tasks

    def reload_start(self) -> None:
        self.reload_queue = sorted(self.slots)
        self.reload_next()

    def reload_next(self) -> None:
        while self.reload_queue:
            number = self.reload_queue.pop(0)
            handle = self.slots.get(number)
            if handle is not None:
                proc.send(handle.pid, signal.SIGHUP)
                return
        log.info("reload complete")

    def reload_failed(self, handle: SlotHandle) -> None:
        log.error(
            "reload stopped at slot %d: the new code does not start; every slot "
            "keeps serving the code it has",
            handle.number,
        )
        self.reload_queue = []

    def kill_remaining(self) -> None:
        for handle in list(self.slots.values()):
            log.error("slot %d did not stop in time; killing it", handle.number)
            proc.kill_group(handle.pid, signal.SIGKILL)
            if handle.runner_pid:
                proc.kill_group(handle.runner_pid, signal.SIGKILL)

    def in_flight(self) -> int:
        return sum(1 for h in self.slots.values() if h.lease is not None)

    def pids(self) -> set[int]:
        return {h.pid for h in self.slots.values()}
