"""A slot: one process, its own connections, one task at a time. It waits for a wake token,
discovers, claims, hands the task to its runner, watches it, and settles the row itself.

The slot is its runner's watchdog. At the handler's deadline it interrupts the handler in its
frame; a kill grace later it kills the runner's whole process group; either way it settles
the row (fenced on the token) and forks a fresh runner, so a handler that ignores its
context can neither leak the slot nor run beside its own retry.

An operator's cancel of the running task reaches the slot from its supervisor (which heard it
on the control channel) and is carried out like a deadline: ctx.cancelled at once, the kill a
kill grace later, the row settled `cancelled`. A long attempt also looks for a cancel itself
now and then, so a notification lost on the way (a LISTEN reconnect) still stops it."""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

import psycopg

from slotd import db, lifecycle, logs, proc, runner
from slotd.bell import Bell
from slotd.candidates import Candidates
from slotd.config import Settings
from slotd.ledger import Ledger
from slotd.lifecycle import Settlement, not_started
from slotd.outcome import CRASHED, KILLED, SHUTDOWN, Result, past
from slotd.registry import Registry
from slotd.repository import Claimed, Repository
from slotd.runner_keeper import Runner, RunnerKeeper
from slotd.slot_connections import SlotConnections
from slotd.watchdog import Step, Watchdog

log = logging.getLogger("slotd.slot")

# A running attempt re-reads its own row for a cancel every this many poll intervals (30 s at
# the default 5 s): one primary-key read per long task, and the bound on how long a cancel
# whose notification was lost can go unnoticed.
CANCEL_RECHECK_POLLS = 6
# A busy slot's settlement lines leave in batches at most this old (see logs.HoldingHandler);
# a kill -9 loses at most this much of the log, never a settlement.
LOG_HOLD = 0.25


@dataclass
class SlotSpec:
    number: int
    app: str
    registry: Registry
    settings: Settings
    write_url: str
    read_url: str | None
    faults: Any = None  # slotd.faults.Injector, when chaos is enabled
    # The pid of the process that forks the slot, recorded before the fork (1 in a container).
    parent: int = field(default_factory=os.getpid)
    # Where the slot writes its settlements, its lease and each attempt's outcome before
    # settling it, for the supervisor (slotd.ledger).
    ledger: Ledger = field(default_factory=Ledger)


class OperatorCancel:
    """An operator's cancel of the attempt a slot is running: heard from the supervisor
    (which heard it on the control channel), or found by the attempt's own look at its row
    every CANCEL_RECHECK_POLLS poll intervals, so a notification lost on the way (a LISTEN
    reconnect) still stops it. Carried out like a deadline (see slotd.watchdog)."""

    def __init__(self, recheck_every: float, log: logs.FieldsAdapter) -> None:
        self.recheck_every, self.log = recheck_every, log
        self.reason: str | None = None
        self.recheck_at = 0.0

    def begin(self, started: float) -> None:
        self.reason = None
        self.recheck_at = started + self.recheck_every

    def look_if_due(self, now: float, claimed: Claimed, repo: Repository | None) -> None:
        if self.reason is not None or now < self.recheck_at or repo is None:
            return
        self.recheck_at = now + self.recheck_every
        try:
            reason = repo.cancel_reason(claimed.id, claimed.token)
        except psycopg.Error as exc:  # the settlement reconnects; this look can wait
            self.log.warning("could not look for a cancel of task %s: %s", claimed.id, exc)
            return
        if reason is not None:
            self.heard(claimed, reason)

    def heard(self, claimed: Claimed, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.log.info(
                "task %s#%s %s: stopping it",
                claimed.task_type,
                claimed.id,
                reason if reason.startswith("cancelled") else f"cancelled by {reason}",
                extra={"task_id": claimed.id, "task_type": claimed.task_type},
            )


class Slot:
    def __init__(self, spec: SlotSpec, sup: Connection) -> None:
        self.spec = spec
        self.sup = sup
        self.settings = spec.settings
        self.stopping = False
        self.orphaned = False  # the supervisor is gone: nothing more to report
        self.hurry = False
        self.reload = False
        self.cancel_sent = False  # a CANCEL went to the runner during its last task
        self.woken = False  # a wake token that arrived while a task ran
        self.sup_open = True
        self.log = logs.FieldsAdapter(log, {"slot": spec.number})
        self.waiter = proc.Waiter()
        settings = spec.settings
        self.candidates = Candidates(settings.discovery_batch, settings.slots)
        self.runners = RunnerKeeper(
            spec.number,
            spec.app,
            spec.registry,
            settings,
            spec.faults,
            report=self._report,
            pause=self._pause,
            close_in_child=self._close_in_runner,
            log=self.log,
        )
        self.conns = SlotConnections(
            spec.number,
            settings,
            spec.write_url,
            spec.read_url,
            pause=self._pause,
            stopping=lambda: self.stopping,
            on_reconnect=self.candidates.forget,
            log=self.log,
        )
        self.bell = Bell(spec.ledger, self._report, lambda: self.runners.pid)
        recheck = settings.poll_interval.total_seconds() * CANCEL_RECHECK_POLLS
        self.cancel = OperatorCancel(recheck, self.log)

    # process set-up and the loop

    def main(self) -> NoReturn:
        code = 0
        try:
            self._setup()
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - report, then let the supervisor restart us
            if db.is_prepare_error(exc):
                # Loud and final: a restarted slot would meet the same pooler again.
                reason = db.PREPARE_ADVICE.format(error=db.first_line(exc))
                self.log.error("%s", reason)
                try:
                    self._report("fatal", reason)
                except OSError:
                    pass
                code = 1
            elif not isinstance(exc, SystemExit | BrokenPipeError | EOFError):
                self.log.error("slot failed: %s", traceback.format_exc().strip())
                code = 1
        finally:
            if self.runners.current is not None:
                self.runners.current.stop(polite=not self.hurry)
            logs.flush()  # os._exit would drop the held lines
            os._exit(code)

    def _setup(self) -> None:
        # SIGTERM is still blocked (proc.fork_guarded): a parent death or a stop that lands
        # now is taken by our handler below, as a stop, never by the default action.
        proc.die_with_parent(signal.SIGTERM, self.spec.parent)
        proc.set_title(f"slot {self.spec.number} starting")
        logs.configure(self.settings.log_format, role=f"slot {self.spec.number}")
        logs.hold(LOG_HOLD)
        logs.lean_records(True)
        self.selfpipe = proc.SelfPipe()
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor, which leads
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        proc.unblock_forked()
        if self.spec.faults is not None:
            self.spec.faults.on_fault = lambda kind: self._report("fault", kind)
        self.conns.connect()
        self._spawn_runner()
        self._report("ready")

    def _on_term(self, signum: int, frame: Any) -> None:
        # A second SIGTERM from a living supervisor cuts the grace short. The parent-death
        # signal can come twice (the kernel sends it again each time a multi-threaded
        # parent's dying threads hand us on), and is never a hurry: an orphaned slot still
        # gets the whole grace to release its lease.
        if self.stopping and os.getppid() == self.spec.parent:
            self.hurry = True
        self.stopping = True

    def _on_hup(self, signum: int, frame: Any) -> None:
        self.reload = True

    def _report(self, *message: Any) -> None:
        """Tell the supervisor; if it is gone, carry on to the end of the task in hand (its
        settlement is ours to write) and stop: nobody hands out tokens any more."""
        if self.orphaned:
            return
        try:
            proc.tell(self.sup, message)
        except OSError:  # BrokenPipeError, ConnectionResetError: the supervisor died
            self.orphaned = True
            self.stopping = True

    def _loop(self) -> None:
        awake = False
        claimed: Claimed | None = None  # the next task, when a settlement claimed it
        while claimed is not None or not self.stopping:
            if claimed is None:
                self.runners.between_tasks(self.reload, lambda: self.stopping)
                self.reload = False
                if not awake:
                    awake = self._wait_token()
                    continue
                if self.runners.current is None:  # never claim work there is no runner to run
                    self._spawn_runner()
                    continue
                try:
                    claimed = self._next_claim()
                except psycopg.OperationalError as exc:
                    self.conns.reconnect(exc)
                    continue
                if claimed is None:
                    awake = False
                    self._report("empty", self.candidates.retry_in)
                    continue
                self.bell.holding = claimed
                lifecycle.claimed(self.spec.ledger, claimed)  # before the message: see there
                self._report("claimed", claimed, self.runners.pid, self.spec.ledger.count)
            claimed = self._handle(claimed)
            self.bell.settled()

    def _next_claim(self) -> Claimed | None:
        repo = self.conns.repo if self.conns.repo is not None else self.conns.connect()
        return self.candidates.next_claim(repo, self.runners.registry, self._report)

    def _spawn_runner(self) -> None:
        self.runners.spawn(lambda: self.stopping)

    def _close_in_runner(self) -> None:
        # The runner keeps nothing of the slot's: not its supervisor's pipe, not its
        # self-pipe.
        self.sup.close()
        self.selfpipe.close()

    def _pause(self, seconds: float) -> None:
        """Sleep that a shutdown signal cuts short."""
        if wait([self.selfpipe], timeout=seconds):
            self.selfpipe.drain()

    def _may_chain(self) -> bool:
        """Whether the next claim may ride on this task's settlement: not when the slot is
        about to stop or to replace its runner, and only with candidates in hand."""
        if self.stopping or self.reload or not self.candidates.batch:
            return False
        return self.runners.may_serve_again()

    def _wait_token(self) -> bool:
        if self.woken:
            self.woken = False
            return True
        proc.set_title(f"slot {self.spec.number} idle")
        logs.flush()  # an idle slot holds no lines...
        self.bell.before_idle()  # ...and owes its supervisor no settlement
        self._report("idle")
        while not self.stopping:
            current = self.runners.current
            watched: list[Any] = [self.sup, self.selfpipe]
            if current is not None and current.watch.fd is not None:
                watched.append(current.watch)
            # Without a pidfd, look at the runner once a second instead.
            blind = current is None or current.watch.fd is None
            ready = self.waiter.wait(watched, timeout=1.0 if blind else None)
            if self.selfpipe in ready:
                self.selfpipe.drain()
            if current is not None and (
                current.watch in ready
                or (current.watch.fd is None and current.watch.poll() is not None)
            ):
                self.runners.died(Result(CRASHED, "runner died while idle"), idle=True)
            if self.runners.current is None:
                self._spawn_runner()
            if self.reload and not self.stopping:
                self.runners.between_tasks(self.reload, lambda: self.stopping)
                self.reload = False
            if self.sup in ready:
                message = self.sup.recv()
                if message[0] == "wake":
                    return True
        return False

    # one task

    def _handle(self, claimed: Claimed) -> Claimed | None:
        margin = self.settings.lease_margin
        deadline = claimed.deadline(margin)
        started = time.monotonic()
        self.cancel.begin(started)
        if past(deadline):
            result = not_started(claimed)
        elif self.stopping or self.runners.current is None:  # a chained claim met a shutdown
            result = lifecycle.not_started_at_shutdown()
        else:
            result = self._watch(claimed, self.runners.current, deadline)
            if result.duration is None:
                result.duration = time.monotonic() - started
        # Settled (database and ledger) before the next runner is forked: crash backoff and
        # a slow import could otherwise outlast the lease, and the supervisor would find the
        # settled lease still in the ledger if this slot died meanwhile.
        settlement = self._settle(claimed, result)
        self.bell.holding = settlement.next
        if self.runners.current is None and not self.stopping:
            self._spawn_runner()
        self.candidates.chained(settlement.claim_tried, settlement.next)
        return settlement.next

    def _watch(self, claimed: Claimed, runner_: Runner, deadline: datetime) -> Result:
        dog = Watchdog.for_deadline(
            deadline, self.settings.kill_grace, self.settings.shutdown_grace
        )
        advanced = False
        ceiling = claimed.lease_expires_at - claimed.claimed_at - self.settings.lease_margin
        label = f"slot {self.spec.number} running {claimed.task_type}#{claimed.id}"
        try:
            # A cancel sent during the last task may have landed after its result: the
            # runner forgets it on this message, never on its own, so a cancel sent from
            # here on (a SIGTERM while it receives the task) is kept.
            proc.tell(runner_.conn, runner.run_message(claimed.task(), deadline, self.cancel_sent))
        except OSError:  # it died between tasks, before we noticed: ours to settle
            result = Result(CRASHED, "runner died before it got the task")
            self.runners.died(result)
            return result
        self.cancel_sent = False
        runner_.tasks += 1
        while True:
            now = time.monotonic()
            self.cancel.look_if_due(now, claimed, self.conns.repo)
            cancelled = self.cancel.reason is not None
            while (step := dog.step(now, self.stopping, self.hurry, cancelled)) is not None:
                if step is Step.CANCEL_KILL:
                    self.runners.died(Result(KILLED))
                    grace = self.settings.kill_grace.total_seconds()
                    return Result(KILLED, f"killed {grace:g}s after it was cancelled", advanced)
                if step in (Step.CANCEL, Step.INTERRUPT):
                    self.cancel_sent = self.cancel_sent or step is Step.CANCEL
                    # The runner alone: its handler's subprocesses must not get the signal.
                    proc.send(
                        runner_.pid, runner.CANCEL if step is Step.CANCEL else runner.INTERRUPT
                    )
                elif step is Step.SHUTDOWN_KILL:
                    self.runners.died(Result(SHUTDOWN))
                    return Result(
                        SHUTDOWN, "still running when the shutdown grace ran out", advanced
                    )
                else:
                    self.runners.died(Result(KILLED))
                    grace = self.settings.kill_grace.total_seconds()
                    return Result(KILLED, f"killed {grace:g}s after its deadline", advanced, True)
            proc.set_title(f"{label} {now - dog.started:.0f}s/{ceiling.total_seconds():.0f}s")
            timeout = self.bell.pay_what_is_due(dog.wait_for(now))
            watched = [runner_.conn, self.selfpipe]
            if runner_.watch.fd is not None:  # no pidfd (old kernel, seccomp): polled below
                watched.append(runner_.watch)
            ready = self.waiter.wait(
                [*watched, self.sup] if self.sup_open else watched, timeout=timeout
            )
            if self.selfpipe in ready:
                self.selfpipe.drain()
            if self.sup in ready:
                self._from_supervisor(claimed)
            if runner_.conn in ready:
                try:
                    message = runner_.conn.recv()
                except (EOFError, OSError):
                    message = None
                if message is not None and message[0] == "result":
                    result = Result(*message[1:])
                    result.advanced = result.advanced or advanced
                    self.runners.crashes = 0
                    if result.extra.get(runner.RECYCLE):  # what the attempt started runs on
                        self.runners.died(result)  # ended before the settlement, not after
                    return result
                if message is not None and message[0] == "fault":
                    self._report("fault", message[1])
                    continue
                if message is not None and message[0] == "cursor":
                    ok, error = self._advance(claimed, message[1])
                    advanced = advanced or ok
                    runner_.conn.send(("cursor_ok", ok, error))
                    continue
            exited = runner_.watch in ready or runner_.conn in ready or runner_.watch.fd is None
            if exited and runner_.watch.wait(1.0 if runner_.conn in ready else 0) is not None:
                result = Result(CRASHED, "runner died under the handler", advanced)
                self.runners.died(result)
                return result

    def _from_supervisor(self, claimed: Claimed) -> None:
        while proc.ready_now(self.sup):
            try:
                message = self.sup.recv()
            except (EOFError, OSError):
                # The supervisor is gone; its parent-death signal (SIGTERM) is on its way
                # and the task is released as at any shutdown. Stop watching the pipe.
                self.sup_open = False
                return
            if message[0] == "wake":
                self.woken = True  # kept for the next wait, never lost
            elif message[0] == "cancel" and message[2] == str(claimed.token):
                self.cancel.heard(claimed, message[3])

    def _advance(self, claimed: Claimed, body: str) -> tuple[bool, str | None]:
        """Write a cursor for the runner. Whatever the database says about the data is the
        handler's error (raised in its frame), never this slot's."""
        try:
            ok = self._write(lambda repo: lifecycle.advance(repo, claimed, body), claimed)
        except Exception as exc:  # noqa: BLE001 - bad data must not take the slot down
            self.log.warning("cursor write failed: %s", db.first_line(exc), extra=_ids(claimed))
            return False, db.first_line(exc)
        return bool(ok), None

    def _settle(self, claimed: Claimed, result: Result) -> Settlement:
        registry = self.runners.registry
        chain = (self.candidates.window(), registry) if self._may_chain() else None
        return lifecycle.conclude(
            lambda write: self._write(write, claimed),
            self.spec.ledger,
            claimed,
            result,
            report=self._report,
            faults=self.spec.faults,
            logger=self.log,
            shutting_down=self.stopping,
            then_claim=chain,
            cancelled_by=self.cancel.reason,
            registry=registry,
        )

    def _write(self, write: Any, claimed: Claimed) -> Any:
        return self.conns.write_while_leased(write, claimed, lambda: self.hurry)


def _ids(claimed: Claimed) -> dict[str, Any]:
    return {"task_id": claimed.id, "task_type": claimed.task_type, "attempt": claimed.attempt}


def run_slot(spec: SlotSpec, sup: Connection) -> NoReturn:
    Slot(spec, sup).main()
