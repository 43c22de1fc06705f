"""The supervisor's side of the slot pipe: what a slot says (slotd/slot/loop.py), handed to the
room that acts on it.

A slot reports state changes, not work: that it is idle (the wake tokens), that it claimed a
lease (the cancel routing, the cascade of tokens), its ledger's bell (slotd.ledger), its
runner's pid, readiness and reload progress (the pool), and the few counters only it sees
(the metrics). Read without blocking, by the supervisor's loop, when the pipe is ready."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slotd import proc
from slotd.slot.ledger import Settled, unlean
from slotd.supervisor.control_routing import ControlRouting
from slotd.supervisor.slot_pool import SlotHandle, SlotPool
from slotd.supervisor.wake import Tokens


class SlotMessages:
    def __init__(
        self,
        pool: SlotPool,
        tokens: Tokens,
        control: ControlRouting,
        *,
        counted: Callable[[Settled], None],
        metrics: Callable[[], Any],
        ready: Callable[[], None],
        fatal: Callable[[str], None],
        expires: Callable[[float], None] = lambda _seconds: None,
    ) -> None:
        self._pool = pool
        self._tokens = tokens
        self._control = control
        self._counted = counted
        self._metrics = metrics  # the replica's Metrics, or None without a metrics server
        self._ready = ready  # every slot may be up now: announce readiness once
        self._fatal = fatal  # a misconfiguration every slot would hit: stop the replica
        self._expires = expires  # when a task expires: the next sweep (sweep_timer.py)

    def read(self, handle: SlotHandle) -> None:
        """Everything the slot has said since the last read, in order."""
        while proc.ready_now(handle.conn):
            try:
                message = handle.conn.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "idle":
                handle.busy = False
                self._tokens.slot_idle(handle.number)
            elif kind == "claimed":
                handle.lease, handle.runner_pid = message[1], message[2]
                self._pool.read_ledger(handle, message[3])
                self._control.claimed(handle)
                self._tokens.offer(remember=False)  # the cascade
            elif kind == "ledger":  # the slot's bell: see slotd.ledger
                _, upto, lease, runner_pid = message
                self._pool.read_ledger(handle, upto)
                handle.runner_pid = runner_pid or handle.runner_pid
                known, handle.lease = handle.lease, unlean(lease)
                if handle.lease is not None and (
                    known is None or known.token != handle.lease.token
                ):
                    self._control.claimed(handle)
                    self._tokens.offer(remember=False)  # the cascade, as for any claim
            elif kind == "settled":  # one the ledger could not take
                self._counted(tuple(message[1:5]))
                handle.settled_token = message[5]
            elif kind == "runner":  # after a recycle, a reload or a respawn
                handle.runner_pid = message[1]
            elif kind == "stuck":
                handle.stuck = message[1]
            elif kind == "empty":
                if (metrics := self._metrics()) is not None:
                    metrics.record_empty_claim()
                # A full rate window's end, or the next row not yet due (a delay, a
                # backoff): the slot's next wake, instead of the next poll tick.
                if len(message) > 1 and message[1] is not None:
                    self._tokens.retry_in(message[1])
            elif kind == "sweep":  # a discovery saw a task expire then: sweep it then
                self._expires(message[1])
            elif kind == "read_miss":
                if (metrics := self._metrics()) is not None:
                    metrics.record_read_lane_miss()
            elif kind == "restart":
                if (metrics := self._metrics()) is not None:
                    metrics.record_restart(message[1])
            elif kind == "fault":
                if (metrics := self._metrics()) is not None:
                    metrics.record_fault(message[1])
            elif kind == "ready":
                self._pool.started(handle)
                self._ready()
            elif kind == "reloaded":
                self._pool.reload_next()
            elif kind == "fatal":
                self._fatal(message[1])
            elif kind == "reload_failed":
                self._pool.reload_failed(handle)
