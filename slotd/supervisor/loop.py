"""The supervisor: holds the LISTEN connection and the shared ticker, hands wake tokens to
one idle slot at a time, forks and reaps slots, and leads shutdown and reload.

One loop, one `wait` over the LISTEN socket, the signal self-pipe, the slots' pipes, the
slots' exit descriptors and the chores pipe, with the next timer as its timeout. Signal
handlers only record. The loop never waits on the database: every statement it needs is a
job for the chores thread (chores.py), whose results come back on a pipe. It never
runs handler code and never uses a connection in a child it forked.

What the loop hears it hands to the rooms that own it: the slots' processes to the pool
(slot_pool.py), what they say to slot_messages.py, the LISTEN connection and its
self-test to the listener (listener.py), control notifications to the cancel routing
(control_routing.py), /healthz and /readyz to slotd/ops/health.py, every statement to the
chores thread and what it hands back to chore_results.py, a dead slot's lease to
orphans.py, every settlement heard of to the counters (outcome_counts.py). They
are passed narrow callables and maps, never the supervisor, so nothing calls back up into it."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import uuid
from typing import Any

from slotd import db, lifecycle, proc
from slotd.config import Settings
from slotd.ops import health
from slotd.registry import Registry
from slotd.repository import Beat
from slotd.slot.ledger import Ledger
from slotd.slot.spec import SlotSpec
from slotd.slot.voice import SlotsVoice
from slotd.supervisor import sdnotify
from slotd.supervisor.chore_results import ChoreResults
from slotd.supervisor.chores import Chores
from slotd.supervisor.control_routing import ControlRouting
from slotd.supervisor.heartbeat import Heartbeat
from slotd.supervisor.listener import Listener
from slotd.supervisor.orphans import Orphans
from slotd.supervisor.outcome_counts import OutcomeCounts
from slotd.supervisor.recorder import Recorder
from slotd.supervisor.slot_messages import SlotMessages
from slotd.supervisor.slot_pool import SlotHandle, SlotPool
from slotd.supervisor.sweep_timer import SweepTimer
from slotd.supervisor.wake import Tokens

log = logging.getLogger("slotd.supervisor")

CHORES_EVERY = 600.0


class Supervisor:
    def __init__(
        self,
        app: str,
        registry: Registry,
        settings: Settings,
        write_url: str,
        read_url: str | None = None,
        faults: Any = None,
    ) -> None:
        self.app = app
        self.registry = registry
        self.settings = settings
        self.waiter = proc.Waiter()  # one poll object for the loop's life
        self.write_url = write_url
        self.read_url = read_url
        self.faults = faults
        self.replica_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.chores: Chores | None = None
        self.stopping = False
        self.stop_deadline: float | None = None
        self.signals: list[int] = []
        self.announced_ready = False
        self.exit_code = 0
        self.loop_seen = time.monotonic()
        self.metrics: Any = None
        self.server: Any = None
        # What the slots share to tell a database outage once between them (slot/voice.py).
        self.voice = SlotsVoice()
        # As pid 1 (a container's command) every orphan in the namespace is ours to reap.
        self.reaps_orphans = os.getpid() == 1
        self.schedules: Any = None  # slotd.scheduler.ScheduleThread, when any are declared
        self.runtime_schedules: Any = None  # slotd.supervisor.runtime_schedules, always
        # The rooms the loop delegates to, each given only the maps and callables it needs.
        self.counts = OutcomeCounts(metrics=lambda: self.metrics)
        self.orphans = Orphans(
            registry,
            chores=lambda: self.chores,
            stopping=lambda: self.stopping,
            counted=self.counts.count,
        )
        self.pool = SlotPool(
            self._slot_spec,
            self._forget_in_child,
            counted=self.counts.count,
            orphaned=self.orphans.settle,
            restarted=self.counts.restarted,
        )
        self.slots = self.pool.slots  # the live map, read by the loop and the routing
        self.tokens = Tokens(self.pool.send_token)
        self.sweeps = SweepTimer()
        self.control = ControlRouting(self.slots)
        self.listener = Listener(
            settings, db.listen_url(settings, write_url), self.replica_id, self.control.heard
        )
        self.messages = SlotMessages(
            self.pool,
            self.tokens,
            self.control,
            counted=self.counts.count,
            metrics=lambda: self.metrics,
            ready=self._maybe_ready,
            fatal=self._fatal,
            expires=self.sweeps.expire_in,
        )
        self.heartbeat = Heartbeat(
            self.replica_id, settings, registry, self.slots, metrics=lambda: self.metrics
        )
        self.chore_results = ChoreResults(
            self.listener,
            self.tokens,
            self.orphans,
            chores=lambda: self.chores,
            stopping=lambda: self.stopping,
            counted=self.counts.count,
            ready=self._maybe_ready,
            fatal=self._fatal,
            beaten=self._beaten,
            sweeps=self.sweeps,
        )

    # public

    def run(self) -> int:
        proc.set_title(f"supervisor {self.app} ({self.settings.slots} slots)")
        # First: an address that cannot be bound is a one-line refusal (ConfigError) before
        # any signal handler, thread or slot exists.
        self.metrics, self.server = health.serve_metrics(
            self.settings, self.registry, self.read_url or self.write_url, self._vitals
        )
        self.selfpipe = proc.SelfPipe()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        recorder = Recorder(self.counts.tally, self.replica_id, self.heartbeat.leases)
        chores = self.chores = Chores(self.settings, self.write_url, recorder)
        for number in range(self.settings.slots):
            self.pool.spawn(number)
        self._start_schedules()
        next_tick = time.monotonic() + self.settings.poll_interval.total_seconds()
        next_heartbeat = 0.0
        next_chores = time.monotonic() + 60.0
        watchdog_every = sdnotify.watchdog_interval()
        next_watchdog = 0.0
        while self.slots or not self.stopping:
            now = time.monotonic()
            self.loop_seen = now
            self._handle_signals()
            if not self.stopping:
                self.pool.respawn_due(now)
                if self.listener.due(now, chores):
                    self.listener.open(chores, first=not self.announced_ready)
                if now >= next_tick:
                    self.tokens.offer(remember=False)
                    next_tick = now + self.settings.poll_interval.total_seconds()
                # Only when something is to sweep (slotd/supervisor/sweep_timer.py), one at
                # a time (lifecycle).
                if self.sweeps.due(now) and not chores.pending["sweep"]:
                    lapses = self.sweeps.take()
                    go_on = self.registry.sequences_go_on
                    chores.post(
                        "sweep", lambda x=lapses, g=go_on: lifecycle.sweep(chores.repo(), x, g)
                    )
                if self.tokens.retry_due(now):  # a full rate window has room again
                    self.tokens.offer(remember=False)
                if now >= next_heartbeat:
                    self._heartbeat()
                    next_heartbeat = now + self.settings.heartbeat_interval.total_seconds()
                if now >= next_chores:
                    self.heartbeat.post_retention(chores)
                    next_chores = now + CHORES_EVERY
                deadline = self.listener.selftest_deadline
                if deadline is not None and now >= deadline:
                    self.listener.selftest_failed()
            elif self.stop_deadline is not None and now >= self.stop_deadline:
                self.pool.kill_remaining()
                self.stop_deadline = None
            if watchdog_every and now >= next_watchdog:
                sdnotify.notify("WATCHDOG=1")
                next_watchdog = now + watchdog_every
            timers = [next_tick, next_heartbeat, *self.pool.respawn_at.values()]
            if self.tokens.retry_at is not None:
                timers.append(self.tokens.retry_at)
            if (sweep_at := self.sweeps.next_at()) is not None and not self.stopping:
                timers.append(sweep_at)
            if self.listener.due(float("inf"), chores) and not self.stopping:
                timers.append(self.listener.retry_at)
            if self.listener.selftest_deadline is not None:
                timers.append(self.listener.selftest_deadline)
            if self.stop_deadline is not None:
                timers.append(self.stop_deadline)
            if watchdog_every:
                timers.append(next_watchdog)
            timeout = max(0.0, min(timers) - time.monotonic())
            self._dispatch(self.waiter.wait(self._watched(), timeout=timeout))
        self._finish()
        return self.exit_code

    # signals

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            if signum in (signal.SIGTERM, signal.SIGINT):
                self._begin_stop()
            elif signum == signal.SIGHUP and not self.stopping:
                log.info("SIGHUP: replacing runners one slot at a time, between tasks")
                self.pool.reload_start()

    def _begin_stop(self) -> None:
        if self.stopping:
            log.warning("second stop signal: cutting the shutdown grace short")
            self.pool.signal_all(signal.SIGTERM)
            self.stop_deadline = time.monotonic() + self.settings.kill_grace.total_seconds() + 5
            return
        self.stopping = True
        in_flight = self.pool.in_flight()
        sdnotify.notify("STOPPING=1", f"STATUS=stopping: releasing {in_flight} leases")
        log.info(
            "stopping: cancelling %d in-flight tasks, grace %ss",
            in_flight,
            self.settings.shutdown_grace.total_seconds(),
        )
        self.pool.stop()
        grace = self.settings.shutdown_grace + self.settings.kill_grace
        self.stop_deadline = time.monotonic() + grace.total_seconds() + 10.0

    # slots

    def _slot_spec(self, number: int) -> SlotSpec:
        return SlotSpec(
            number,
            self.app,
            self.registry,
            self.settings,
            self.write_url,
            self.read_url,
            self.faults,
            parent=os.getpid(),
            ledger=Ledger(),
            voice=self.voice,
        )

    def _forget_in_child(self) -> None:
        # A forked slot keeps nothing of the supervisor's (the pool has closed the other
        # slots' pipes): not the self-pipe, not the chores pipe, not the metrics socket.
        self.selfpipe.close()
        if self.chores is not None:
            self.chores.close_in_child()
        if self.server is not None:
            try:
                os.close(self.server.fileno())
            except OSError:
                pass
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)

    def _watched(self) -> list[Any]:
        watched: list[Any] = [self.selfpipe]
        if self.chores is not None:
            watched.append(self.chores)
        if (listening := self.listener.socket()) is not None:
            watched.append(listening)
        watched.extend(self.pool.watched())
        return watched

    def _dispatch(self, ready: list[Any]) -> None:
        if self.selfpipe in ready:
            self.selfpipe.drain()
        if self.chores is not None and self.chores in ready:
            for done in self.chores.finished():
                self.chore_results.done(done)
        listening = self.listener.socket()
        if listening is not None and listening in ready and self.listener.notifications():
            self.tokens.offer()
        for handle in list(self.slots.values()):
            if handle.conn in ready:
                self.messages.read(handle)
        for handle in list(self.slots.values()):
            # Only a slot whose exit descriptor fired (or that has none) is worth a waitpid.
            watched = handle.watch.fd is None or handle.watch in ready
            if watched and handle.watch.poll() is not None:
                self._slot_exited(handle)
        if self.reaps_orphans:
            proc.reap_orphans(self.pool.pids())

    def _slot_exited(self, handle: SlotHandle) -> None:
        status = handle.watch.poll()
        self.messages.read(handle)  # whatever it said before it went
        self.tokens.slot_gone(handle.number)
        self.pool.bury(handle, status)

    def _fatal(self, reason: str) -> None:
        """A misconfiguration every slot would hit (server-side prepared statements through
        a transaction pooler): stop the replica with exit status 2 instead of restarting
        slots in a loop that looks like work."""
        if self.exit_code == 0:
            log.error("stopping: %s", reason)
        self.exit_code = 2
        if not self.stopping:
            self._begin_stop()

    def _maybe_ready(self) -> None:
        listening = self.listener.conn is not None
        ready = listening and all(h.ready for h in self.slots.values())
        if ready and not self.announced_ready and len(self.slots) == self.settings.slots:
            self.announced_ready = True
            log.info(
                "serving %s with %d slots (%s)",
                self.app,
                self.settings.slots,
                ", ".join(self.registry.types),
            )
            sdnotify.notify("READY=1", f"STATUS=serving with {self.settings.slots} slots")

    def _beaten(self, beat: Beat) -> None:
        self.heartbeat.beaten(beat)
        self.sweeps.lapsed(beat.lapse_s)

    def _heartbeat(self) -> None:
        assert self.chores is not None
        self.heartbeat.post(self.chores)
        in_flight = self.pool.in_flight()
        sdnotify.notify(f"STATUS=serving: {len(self.slots)} slots, {in_flight} in flight")

    # metrics and the end

    def _start_schedules(self) -> None:
        """No schedules declared in code: no thread for them, no connection, no statement
        (nor the module's import). Runtime schedules (slotd.put_schedule) have a thread of
        their own on every replica: any replica may fire them."""
        from slotd.supervisor import runtime_schedules

        listener = self.listener
        self.runtime_schedules = runtime_schedules.start(
            self.settings,
            self.write_url,
            # A put's notification reaches us: LISTEN is up and its self-test came back.
            lambda: (
                listener.conn is not None and listener.selftest_seen and listener.notify_reaches
            ),
        )
        self.control.on_schedule = self.runtime_schedules.poke
        listener.on_open = self.runtime_schedules.poke
        if self.registry.schedules:
            from slotd.supervisor.scheduler import start

            self.schedules = start(
                self.registry.schedules,
                self.settings,
                self.write_url,
                self.replica_id,
                self.metrics,
            )

    def _vitals(self) -> health.Vitals:
        # Asked on the metrics server's thread: a copy, never the live objects.
        return health.Vitals(
            slots_up=len(self.slots),
            slots_wanted=self.settings.slots,
            stuck=[h.number for h in self.slots.values() if h.stuck],
            loop_seen=self.loop_seen,
            poll_interval=self.settings.poll_interval,
            stopping=self.stopping,
            listening=self.listener.conn is not None,
            announced_ready=self.announced_ready,
            notify_reaches=self.listener.notify_reaches,
        )

    def _finish(self) -> None:
        if self.schedules is not None:
            self.schedules.stop()
        if self.runtime_schedules is not None:
            self.runtime_schedules.stop()
        self.listener.close()
        if self.chores is not None:
            self.heartbeat.goodbye(self.chores)
        if self.server is not None:
            self.server.close()
        log.info("stopped")
