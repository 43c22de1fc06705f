"""The supervisor: holds the LISTEN connection and the shared ticker, hands wake tokens to
one idle slot at a time, forks and reaps slots, and leads shutdown and reload.

One loop, one `wait` over the LISTEN socket, the signal self-pipe, the slots' pipes, the
slots' exit descriptors and the chores pipe, with the next timer as its timeout. Signal
handlers only record. The loop never waits on the database: every statement it needs is a
job for the chores thread (slotd/chores.py), whose results come back on a pipe. It never
runs handler code and never uses a connection in a child it forked."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import psycopg

from slotd import db, maintenance, proc, repository, sdnotify
from slotd.chores import Chores, Done
from slotd.config import Settings, format_duration
from slotd.ledger import Ledger, unlean
from slotd.outcome import CRASHED, SHUTDOWN, MinuteTally
from slotd.processor import Result, settle
from slotd.registry import Registry
from slotd.repository import Claimed
from slotd.slot import SlotSpec, run_slot
from slotd.wake import Tokens

log = logging.getLogger("slotd.supervisor")

SELFTEST_WAIT = 5.0  # how long the NOTIFY self-test waits for its own notification
CHORES_EVERY = 600.0
GOODBYE_TIMEOUT = 10.0  # at exit: the last settlements and the replica's goodbye
SLOT_BACKOFF_CAP = 30.0
# How long a cancel of a lease no slot here has reported is remembered: its claim may have
# committed (before the cancel) with the slot's "claimed" message still in the pipe.
CANCEL_MEMORY = 60.0


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
        self.listen_url = db.listen_url(settings, write_url)
        self.faults = faults
        self.replica_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.slots: dict[int, SlotHandle] = {}
        self.respawn_at: dict[int, float] = {}
        self.slot_failures: dict[int, int] = {}
        self.tokens = Tokens(self._send_token)
        self.listen_conn: psycopg.Connection[Any] | None = None
        self.listen_retry_at = 0.0
        self.listen_backoff = db.Reconnect()
        self.chores: Chores | None = None
        self.stopping = False
        self.stop_deadline: float | None = None
        self.signals: list[int] = []
        self.reload_queue: list[int] = []
        self.announced_ready = False
        self.cancels: dict[str, tuple[float, int, str]] = {}  # token -> (forget at, id, by)
        self.selftest_payload = f"selftest {self.replica_id}"
        self.selftest_deadline: float | None = None
        self.selftest_seen = False
        self.notify_reaches = True  # until a self-test's notification fails to arrive
        self.exit_code = 0
        self.loop_seen = time.monotonic()
        self.metrics: Any = None
        self.server: Any = None
        # As pid 1 (a container's command) every orphan in the namespace is ours to reap.
        self.reaps_orphans = os.getpid() == 1
        self.tally = MinuteTally()  # the dashboard's outcome chart, flushed per heartbeat
        self.unflushed: list[Any] = []  # what the heartbeat in flight carries
        self.schedules: Any = None  # slotd.scheduler.ScheduleThread, when any are declared

    # public

    def run(self) -> int:
        proc.set_title(f"supervisor {self.app} ({self.settings.slots} slots)")
        self.selfpipe = proc.SelfPipe()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        self.chores = Chores(self.settings, self.write_url)
        self._start_metrics()
        for number in range(self.settings.slots):
            self._spawn(number)
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
                self._respawn_due(now)
                if self._listen_due(now):
                    self._listen()
                if now >= next_tick:
                    self.tokens.offer(remember=False)
                    next_tick = now + self.settings.poll_interval.total_seconds()
                if now >= next_heartbeat:
                    self._heartbeat()
                    next_heartbeat = now + self.settings.heartbeat_interval.total_seconds()
                if now >= next_chores:
                    self._chores()
                    next_chores = now + CHORES_EVERY
                if self.selftest_deadline is not None and now >= self.selftest_deadline:
                    self._selftest_failed()
            elif self.stop_deadline is not None and now >= self.stop_deadline:
                self._kill_remaining()
            if watchdog_every and now >= next_watchdog:
                sdnotify.notify("WATCHDOG=1")
                next_watchdog = now + watchdog_every
            timers = [next_tick, next_heartbeat, *self.respawn_at.values()]
            if self._listen_due(float("inf")) and not self.stopping:
                timers.append(self.listen_retry_at)
            if self.selftest_deadline is not None:
                timers.append(self.selftest_deadline)
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
                self.reload_queue = sorted(self.slots)
                self._reload_next()

    def _begin_stop(self) -> None:
        if self.stopping:
            log.warning("second stop signal: cutting the shutdown grace short")
            for handle in self.slots.values():
                proc.send(handle.pid, signal.SIGTERM)
            self.stop_deadline = time.monotonic() + self.settings.kill_grace.total_seconds() + 5
            return
        self.stopping = True
        sdnotify.notify("STOPPING=1", f"STATUS=stopping: releasing {self._in_flight()} leases")
        log.info(
            "stopping: cancelling %d in-flight tasks, grace %ss",
            self._in_flight(),
            self.settings.shutdown_grace.total_seconds(),
        )
        for handle in self.slots.values():
            proc.send(handle.pid, signal.SIGTERM)
        self.respawn_at.clear()
        grace = self.settings.shutdown_grace + self.settings.kill_grace
        self.stop_deadline = time.monotonic() + grace.total_seconds() + 10.0

    def _reload_next(self) -> None:
        while self.reload_queue:
            number = self.reload_queue.pop(0)
            handle = self.slots.get(number)
            if handle is not None:
                proc.send(handle.pid, signal.SIGHUP)
                return
        log.info("reload complete")

    # slots

    def _spawn(self, number: int) -> None:
        ours, theirs = socket.socketpair()
        spec = SlotSpec(
            number,
            self.app,
            self.registry,
            self.settings,
            self.write_url,
            self.read_url,
            self.faults,
            parent=os.getpid(),
            ledger=Ledger(),
        )
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
        if self.listen_conn is not None:
            watched.append(self.listen_conn.pgconn.socket)
        for handle in self.slots.values():
            watched.append(handle.conn)
            if handle.watch.fd is not None:
                watched.append(handle.watch)
        return watched

    def _dispatch(self, ready: list[Any]) -> None:
        if self.selfpipe in ready:
            self.selfpipe.drain()
        if self.chores is not None and self.chores in ready:
            for done in self.chores.finished():
                self._chore_done(done)
        if self.listen_conn is not None and self.listen_conn.pgconn.socket in ready:
            self._notifications()
        for handle in list(self.slots.values()):
            if handle.conn in ready:
                self._from_slot(handle)
        for handle in list(self.slots.values()):
            # Only a slot whose exit descriptor fired (or that has none) is worth a waitpid.
            watched = handle.watch.fd is None or handle.watch in ready
            if watched and handle.watch.poll() is not None:
                self._slot_exited(handle)
        if self.reaps_orphans:
            proc.reap_orphans({h.pid for h in self.slots.values()})

    def _from_slot(self, handle: SlotHandle) -> None:
        while proc.ready_now(handle.conn):
            try:
                message = handle.conn.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "idle":
                handle.busy = False
                self.tokens.slot_idle(handle.number)
            elif kind == "claimed":
                handle.lease, handle.runner_pid = message[1], message[2]
                self._read_ledger(handle, message[3])
                self._cancel_if_asked(handle)
                self.tokens.offer(remember=False)  # the cascade
            elif kind == "ledger":  # the slot's bell: see slotd.ledger
                _, upto, lease, runner_pid = message
                self._read_ledger(handle, upto)
                handle.runner_pid = runner_pid or handle.runner_pid
                known, handle.lease = handle.lease, unlean(lease)
                if handle.lease is not None and (
                    known is None or known.token != handle.lease.token
                ):
                    self._cancel_if_asked(handle)
                    self.tokens.offer(remember=False)  # the cascade, as for any claim
            elif kind == "settled":  # one the ledger could not take
                self._count(*message[1:])
            elif kind == "runner":  # after a recycle, a reload or a respawn
                handle.runner_pid = message[1]
            elif kind == "stuck":
                handle.stuck = message[1]
            elif kind == "empty":
                if self.metrics is not None:
                    self.metrics.record_empty_claim()
            elif kind == "read_miss":
                if self.metrics is not None:
                    self.metrics.record_read_lane_miss()
            elif kind == "restart":
                if self.metrics is not None:
                    self.metrics.record_restart(message[1])
            elif kind == "fault":
                if self.metrics is not None:
                    self.metrics.record_fault(message[1])
            elif kind == "ready":
                handle.ready = True
                self.slot_failures.pop(handle.number, None)
                self._maybe_ready()
            elif kind == "reloaded":
                self._reload_next()
            elif kind == "fatal":
                self._fatal(message[1])
            elif kind == "reload_failed":
                log.error(
                    "reload stopped at slot %d: the new code does not start; every slot "
                    "keeps serving the code it has",
                    handle.number,
                )
                self.reload_queue = []

    def _read_ledger(self, handle: SlotHandle, upto: int | None) -> None:
        for settled in handle.ledger.consume(upto):
            self._count(*settled)

    def _count(
        self, task_type: str, outcome: str, duration: float | None, delay: float | None
    ) -> None:
        if self.metrics is not None:
            self.metrics.record_outcome(task_type, outcome, duration, delay)
        self.tally.add(task_type, outcome)

    def _send_token(self, number: int) -> None:
        handle = self.slots.get(number)
        if handle is None:
            return
        handle.busy = True
        try:
            handle.conn.send(("wake",))
        except OSError:
            pass  # the slot is dying; its exit is handled on the next pass

    def _slot_exited(self, handle: SlotHandle) -> None:
        status = handle.watch.poll()
        self._from_slot(handle)  # whatever it said before it went
        del self.slots[handle.number]
        self.tokens.slot_gone(handle.number)
        handle.conn.close()
        handle.watch.close()
        if handle.runner_pid:
            proc.kill_group(handle.runner_pid, signal.SIGKILL)
        # What it wrote and did not ring for, and the lease it held: from the page, which
        # nothing writes any more (slotd.ledger).
        self._read_ledger(handle, None)
        handle.lease = handle.ledger.lease()
        if handle.lease is not None:
            self._settle_orphan(handle.lease, handle.ledger.heard(handle.lease.token))
        handle.ledger.close()
        if self.stopping:
            return
        failures = self.slot_failures.get(handle.number, 0) + 1
        self.slot_failures[handle.number] = failures
        delay = min(0.5 * 2 ** (failures - 1), SLOT_BACKOFF_CAP) if failures > 1 else 0.0
        log.error(
            "slot %d %s; restarting it%s",
            handle.number,
            proc.describe_status(status),
            f" in {delay:.1f}s" if delay else "",
            extra={"slot": handle.number, "runner_pid": handle.runner_pid},
        )
        if self.metrics is not None:
            self.metrics.record_restart("slot_died")
        self.respawn_at[handle.number] = time.monotonic() + delay

    def _respawn_due(self, now: float) -> None:
        for number, when in list(self.respawn_at.items()):
            if now >= when:
                self._spawn(number)

    def _settle_orphan(self, lease: Claimed, outcome: Result | None) -> None:
        """A slot died holding a lease it had reported: settle it now, fenced, rather than
        leaving the row to wait out ceiling + margin (on the chores thread: the database
        may be the reason the slot died). By the attempt's outcome when the slot reported one
        before dying (a success is dequeued, never run again); a crash only when the slot died
        with the handler's outcome unknown. The token fence makes this safe when the slot's
        own settlement did land: ours then matches nothing (`lost`)."""
        assert self.chores is not None
        chores, stopping, registry = self.chores, self.stopping, self.registry
        kind = SHUTDOWN if stopping else CRASHED
        result = outcome if outcome is not None else Result(kind, "its slot died")

        def job() -> tuple[Claimed, str, float | None]:
            repo = chores.repo()
            # A slot killed while it stopped a cancelled task: settle it as the cancel.
            cancelled = repo.cancel_reason(lease.id, lease.token)
            # With the registry: a failure backs off by its type's own backoff, as the
            # slot's own settlement would have (the worker's default only for types
            # without one).
            settled = settle(
                repo,
                lease,
                result,
                shutting_down=stopping,
                logger=log,
                cancelled_by=cancelled,
                registry=registry,
            )
            return lease, str(settled.outcome), result.duration

        chores.post("settle_orphan", job)

    def _fatal(self, reason: str) -> None:
        """A misconfiguration every slot would hit (server-side prepared statements through
        a transaction pooler): stop the replica with exit status 2 instead of restarting
        slots in a loop that looks like work."""
        if self.exit_code == 0:
            log.error("stopping: %s", reason)
        self.exit_code = 2
        if not self.stopping:
            self._begin_stop()

    def _kill_remaining(self) -> None:
        for handle in list(self.slots.values()):
            log.error("slot %d did not stop in time; killing it", handle.number)
            proc.kill_group(handle.pid, signal.SIGKILL)
            if handle.runner_pid:
                proc.kill_group(handle.runner_pid, signal.SIGKILL)
        self.stop_deadline = None

    def _in_flight(self) -> int:
        return sum(1 for h in self.slots.values() if h.lease is not None)

    def _maybe_ready(self) -> None:
        ready = self.listen_conn is not None and all(h.ready for h in self.slots.values())
        if ready and not self.announced_ready and len(self.slots) == self.settings.slots:
            self.announced_ready = True
            log.info(
                "serving %s with %d slots (%s)",
                self.app,
                self.settings.slots,
                ", ".join(self.registry.types),
            )
            sdnotify.notify("READY=1", f"STATUS=serving with {self.settings.slots} slots")

    # the database

    def _listen_due(self, now: float) -> bool:
        assert self.chores is not None
        return (
            self.listen_conn is None
            and not self.chores.pending["listen"]
            and now >= self.listen_retry_at
        )

    def _listen(self) -> None:
        """Open the LISTEN connection on the chores thread; `_listening` takes it over."""
        url, prepare = self.listen_url, self.settings.prepare
        first = not self.announced_ready

        def job() -> psycopg.Connection[Any]:
            conn = db.connect(url, role="slotd listen", prepare=prepare)
            try:
                repository.listen(conn)
                repository.listen_control(conn)
                if first:  # pauses made before we listened are told nowhere else
                    _log_pauses(repository.paused_types(conn))
            except BaseException:
                conn.close()
                raise
            return conn

        assert self.chores is not None
        self.chores.post("listen", job)

    def _listening(self, done: Done) -> None:
        if done.error is not None:
            delay = self.listen_backoff.next()
            log.warning(
                "database unreachable, retrying in %.1fs: %s", delay, db.first_line(done.error)
            )
            self.listen_retry_at = time.monotonic() + delay
            return
        if self.stopping:
            done.value.close()
            return
        # From here on only this loop uses the connection, and only without blocking: its
        # socket is watched and read with consume_input. Its keepalives (db.connect) notice
        # a peer that died silently.
        self.listen_conn = done.value
        self.listen_backoff.reset()
        # Notifications sent while we were deaf are lost: look once now, not at the next tick.
        self.tokens.offer()
        self._maybe_ready()
        self._selftest_send()

    def _chore_done(self, done: Done) -> None:
        if done.name == "listen":
            self._listening(done)
        elif done.name == "settle_orphan":
            if done.error is not None:
                log.error("could not settle the task of a dead slot: %s", db.first_line(done.error))
            else:
                lease, outcome, duration = done.value
                self.tally.add(lease.task_type, outcome)
                if self.metrics is not None:
                    self.metrics.record_outcome(lease.task_type, outcome, duration, None)
        elif done.name == "selftest":
            self._selftest_sent(done)
        elif done.error is not None and done.name == "heartbeat":
            if db.is_prepare_error(done.error):
                self._fatal(db.PREPARE_ADVICE.format(error=db.first_line(done.error)))
            log.warning("heartbeat failed: %s", db.first_line(done.error))
            self.tally.restore(self.unflushed)  # the chart catches up at the next heartbeat
        elif done.error is not None and done.name == "retention":
            log.warning("retention cleanup failed: %s", db.first_line(done.error))

    def _selftest_send(self) -> None:
        """Prove that NOTIFY reaches this LISTEN connection: send one on the primary, as a
        producer would, and expect it back within SELFTEST_WAIT. Through a transaction-mode
        pooler it never arrives, and the replica would otherwise wait silently for ticks."""
        assert self.chores is not None
        chores, payload = self.chores, self.selftest_payload
        self.selftest_seen = False
        chores.post("selftest", lambda: repository.notify_selftest(chores.repo().write, payload))

    def _selftest_sent(self, done: Done) -> None:
        if done.error is not None:
            log.warning("NOTIFY self-test not sent: %s", db.first_line(done.error))
        elif not self.selftest_seen:  # the notification may have beaten this news here
            self.selftest_deadline = time.monotonic() + SELFTEST_WAIT

    def _selftest_passed(self) -> None:
        self.selftest_seen = True
        self.selftest_deadline = None
        if not self.notify_reaches:
            log.info("NOTIFY reaches the LISTEN connection again")
        self.notify_reaches = True

    def _selftest_failed(self) -> None:
        self.selftest_deadline = None
        self.notify_reaches = False
        log.warning(
            "NOTIFY did not reach the LISTEN connection within %.0fs: this replica runs on "
            "its %s poll. LISTEN through a transaction-mode pooler never hears anything: "
            "point SLOTD_DATABASE_URL_LISTEN at the primary directly (or a session-mode pool)",
            SELFTEST_WAIT,
            format_duration(self.settings.poll_interval),
        )

    def _notifications(self) -> None:
        conn = self.listen_conn
        assert conn is not None
        control = repository.CONTROL_CHANNEL.encode()
        try:
            conn.pgconn.consume_input()
            woken = False
            while (note := conn.pgconn.notifies()) is not None:
                if note.relname == control:
                    self._control(note.extra.decode())
                else:
                    woken = True
                    if note.extra == self.selftest_payload.encode():
                        self._selftest_passed()
            if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("LISTEN connection closed")
        except (psycopg.Error, OSError) as exc:
            self._lost_listen(exc)
            return
        if woken:
            self.tokens.offer()

    # operator control

    def _control(self, payload: str) -> None:
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

    def _cancel_if_asked(self, handle: SlotHandle) -> None:
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

    def _lost_listen(self, exc: BaseException) -> None:
        log.warning("lost the LISTEN connection (%s); reconnecting", db.first_line(exc))
        try:
            assert self.listen_conn is not None
            self.listen_conn.close()
        except Exception:  # noqa: BLE001
            pass
        self.listen_conn = None
        self.listen_retry_at = time.monotonic() + 0.2

    def _heartbeat(self) -> None:
        """Announce this replica (one statement per heartbeat besides its discoveries), on
        the chores thread; one at a time, so a stalled database is not sent a pile of them.
        The same job adds the outcomes counted since the last one to slotd_outcomes (the
        dashboard's chart) and says which slot holds which lease."""
        assert self.chores is not None
        chores = self.chores
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
        sdnotify.notify(f"STATUS=serving: {len(self.slots)} slots, {self._in_flight()} in flight")

    def _chores(self) -> None:
        assert self.chores is not None
        chores, retention = self.chores, self.settings.retention
        if not chores.pending["retention"]:
            chores.post(
                "retention", lambda: maintenance.hourly_cleanup(chores.repo(), retention, log)
            )

    # metrics and the end

    def _start_metrics(self) -> None:
        addr = self.settings.metrics_addr
        if addr in ("", "off", "none"):
            return
        import prometheus_client

        from slotd import metrics

        # *_created series double the exposition and nobody alerts on them.
        prometheus_client.disable_created_metrics()
        self.metrics = metrics.Metrics(
            self.settings.slots,
            self.registry.types,
            metrics.db_gauge_source(
                self.read_url or self.write_url,
                limits=self.registry.concurrency_limits,
                priority_step=self.settings.priority_step,
                prepare=self.settings.prepare,
            ),
            limits=self.registry.concurrency_limits,
        )
        self.server = metrics.serve(addr, self.metrics, self._health, self._readiness)
        log.info("metrics on %s/metrics", self.server.url)

    def _start_schedules(self) -> None:
        """Schedule evaluation runs in a thread of its own, on its own connection: the
        loop never waits for it. No schedules: no thread, no connection, no statement."""
        if not self.registry.schedules:
            return
        from slotd.scheduler import ScheduleThread

        self.schedules = ScheduleThread(
            self.registry.schedules, self.settings, self.write_url, self.replica_id
        )
        if self.metrics is not None:
            self.metrics.registry.register(self.schedules.collector())
        self.schedules.start()
        log.info(
            "evaluating %d schedule(s): %s",
            len(self.registry.schedules),
            ", ".join(sc.name for sc in self.registry.schedules),
        )

    def _health(self) -> tuple[bool, str]:
        alive = len(self.slots)
        stale = time.monotonic() - self.loop_seen
        if stale > 3 * self.settings.poll_interval.total_seconds() + 5:
            return False, f"supervisor loop stalled for {stale:.0f}s"
        if alive < self.settings.slots and not self.stopping:
            return False, f"{alive}/{self.settings.slots} slots up"
        stuck = [h.number for h in self.slots.values() if h.stuck]
        if stuck:
            return False, f"slots {stuck} hold a runner that SIGKILL did not end"
        return True, f"{alive}/{self.settings.slots} slots up"

    def _readiness(self) -> tuple[bool, str]:
        if self.stopping:
            return False, "stopping"
        if self.listen_conn is None:
            return False, "not listening"
        if not self.announced_ready:
            return False, "slots starting"
        if not self.notify_reaches:
            # Still serving, on the ticker: ready, with the reason an operator needs.
            poll = format_duration(self.settings.poll_interval)
            return True, f"polling every {poll}: NOTIFY does not reach the LISTEN connection"
        return True, "listening"

    def _finish(self) -> None:
        if self.schedules is not None:
            self.schedules.stop()
        if self.listen_conn is not None:
            try:
                self.listen_conn.close()
            except Exception:  # noqa: BLE001
                pass
        if self.chores is not None:
            chores, replica_id = self.chores, self.replica_id
            chores.post("replica_gone", lambda: chores.repo().replica_gone(replica_id))
            # The dead slots' last settlements are queued before the goodbye; a database
            # that does not answer gets a bounded wait, then the leases expire on their own.
            if not chores.stop(GOODBYE_TIMEOUT):
                log.warning("the database did not answer the goodbye within %ss", GOODBYE_TIMEOUT)
        if self.server is not None:
            self.server.close()
        log.info("stopped")


def _log_pauses(paused: list[dict[str, Any]]) -> None:
    for pause in paused:
        until = pause["until"]
        log.info(
            "task type %s is paused (by %s since %s, %s): not claiming it",
            pause["task_type"],
            pause["paused_by"],
            pause["paused_at"].isoformat(timespec="seconds"),
            f"until {until.isoformat(timespec='seconds')}" if until else "until resumed",
            extra={"task_type": pause["task_type"], "by": pause["paused_by"]},
        )
