"""A slot: one process, its own connections, one task at a time. It waits for a wake token,
discovers, claims, hands the task to its runner, watches it, and settles the row itself.

The slot is its runner's watchdog. At the handler's deadline it interrupts the handler in its
frame; a kill grace later it kills the runner's whole process group; either way it settles
the row (fenced on the token) and forks a fresh runner, so a handler that ignores its
context can neither leak the slot nor run beside its own retry.

An operator's cancel of the running task reaches the slot from its supervisor (which heard it
on the control channel) and is carried out like a deadline: ctx.cancelled at once, the kill a
kill grace later, the row settled `cancelled`. A long attempt also looks for a cancel itself
now and then, so a notification lost on the way (a LISTEN reconnect) still stops it. The
watch over one attempt is its own room, slotd.attempt_watch; the slot claims and settles."""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

import psycopg

from slotd import db, lifecycle, logs, proc
from slotd.lifecycle import Settlement, not_started
from slotd.outcome import CRASHED, Result, past
from slotd.repository import Claimed
from slotd.slot.attempt_watch import AttemptWatch
from slotd.slot.batching import Batch
from slotd.slot.bell import Bell
from slotd.slot.candidates import Candidates
from slotd.slot.connections import SlotConnections
from slotd.slot.runner_keeper import RunnerKeeper
from slotd.slot.spec import SlotSpec

log = logging.getLogger("slotd.slot")

# A busy slot's settlement lines leave in batches at most this old (see logs.HoldingHandler);
# a kill -9 loses at most this much of the log, never a settlement.
LOG_HOLD = 0.25


class Slot:
    def __init__(self, spec: SlotSpec, sup: Connection) -> None:
        self.spec = spec
        self.sup = sup
        self.settings = spec.settings
        self.stopping = False
        self.orphaned = False  # the supervisor is gone: nothing more to report
        self.hurry = False
        self.reload = False
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
            voice=spec.voice,
        )
        self.bell = Bell(spec.ledger, self._report, lambda: self.runners.pid)
        self.attempt = AttemptWatch(self)  # the watch over each attempt (slotd.attempt_watch)
        self.batch = Batch(
            settings.lease_margin, settings.claim_batch
        )  # prefetched and unsettled (#43)

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
        while claimed is not None or self.batch.holds or not self.stopping:
            if claimed is None and self.batch.holds:
                # A runner is recycled or reloaded between tasks, a prefetched one's too.
                self.runners.between_tasks(self.reload, lambda: self.stopping)
                self.reload = False
                try:
                    claimed = self._from_batch()
                except psycopg.OperationalError as exc:
                    self.conns.reconnect(exc)
                    continue
                if claimed is None:
                    continue
            if claimed is None:
                self.runners.between_tasks(self.reload, lambda: self.stopping)
                self.reload = False
                if not awake:
                    awake = self._wait_token()
                    # One title per busy spell, not one per task (see AttemptWatch.run).
                    proc.set_title(f"slot {self.spec.number} busy")
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

    def _from_batch(self) -> Claimed | None:
        """The next prefetched task to run, after what is due first: a stop gives the
        batch back; a prefetched task past its wait bound is released; held successes due
        for their statement are settled, with the next batch's claim riding on it when
        nothing is left to run (slotd.slot.batching)."""
        batch = self.batch
        if self.stopping:
            self.give_back()
            return None
        if late := batch.overdue():
            self._release_unstarted(late, "it waited too long behind its batch")
        if batch.settle_due():
            self._settle_batch(chain=not batch.waiting)
        claimed = batch.next()
        if claimed is not None:
            lifecycle.started(self.spec.ledger, claimed)
            self.bell.holding = claimed
        return claimed

    @property
    def holds_batch(self) -> bool:
        return self.batch.holds

    def batch_chores(self) -> float | None:
        """While an attempt runs, the batch's bounds still hold (slotd.slot.batching): a
        stop gives it back, a prefetched task past its bound is released for another slot,
        held successes past theirs are settled. Seconds until the next is due."""
        if self.stopping:
            self.give_back(attempt_running=True)
            return None
        if late := self.batch.overdue():
            self._release_unstarted(late, "it waited too long behind its batch")
        if self.batch.held_too_long():
            self._settle_batch(chain=False, attempt_running=True)
        return self.batch.due_in()

    def give_back(self, attempt_running: bool = False) -> None:
        """A stop: the prefetched tasks released unstarted, the held successes settled,
        at once (not after the running attempt: it may take the whole shutdown grace)."""
        if self.batch.waiting:
            self._release_unstarted(self.batch.take_waiting(), "the replica is stopping")
        if self.batch.done:
            self._settle_batch(chain=False, attempt_running=attempt_running)

    def _release_unstarted(self, leases: list[Claimed], reason: str) -> None:
        lifecycle.released_unstarted(
            lambda write: self._write(write, leases[0]),
            self.spec.ledger,
            leases,
            reason,
            report=self._report,
            logger=self.log,
        )

    def _settle_batch(self, chain: bool, attempt_running: bool = False) -> None:
        """The held successes in one statement, the next batch's claim riding on it.
        A chaos run's faults only when no attempt runs: a death injected beside a running
        attempt would be a slot killed before that attempt's last words, a crash that is
        rightly run again, not the window the faults are about (slotd.dev.faults)."""
        done = self.batch.take_done()
        then = None
        offered: list[int] = []
        if chain and self._may_chain():
            offered = self.candidates.offered()
            then = (offered, self.batch.size(len(self.candidates.batch)))
        claims = lifecycle.conclude_many(
            lambda write: self._write(write, done[0][0]),
            self.spec.ledger,
            done,
            self.runners.registry,
            then_claim=then,
            report=self._report,
            faults=None if attempt_running else self.spec.faults,
            logger=self.log,
        )
        if then is not None:
            self.candidates.chained_many(offered, claims)
        self.batch.fetched(claims)

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
        if self.attempt.woken:
            self.attempt.woken = False
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
        self.attempt.cancel.begin(started)
        if past(deadline):
            result = not_started(claimed)
        elif self.stopping or self.runners.current is None:  # a chained claim met a shutdown
            result = lifecycle.not_started_at_shutdown()
        else:
            result = self.attempt.run(claimed, self.runners.current, deadline)
            if result.duration is None:
                result.duration = time.monotonic() - started
        self.batch.measured(result.duration)
        if self._defer(claimed, result):
            self.bell.holding = None
            if self.batch.settle_due():
                self._settle_batch(chain=not self.batch.waiting)
            if self.runners.current is None and not self.stopping:
                self._spawn_runner()
            return None
        # Settled (database and ledger) before the next runner is forked: crash backoff and
        # a slow import could otherwise outlast the lease, and the supervisor would find the
        # settled lease still in the ledger if this slot died meanwhile.
        settlement = self._settle(claimed, result)
        self.bell.holding = settlement.next
        if self.runners.current is None and not self.stopping:
            self._spawn_runner()
        self.candidates.chained(settlement.claim_tried, settlement.next)
        return settlement.next

    def _defer(self, claimed: Claimed, result: Result) -> bool:
        """Hold a plain success for its batch's statement (slotd.slot.batching): while a
        batch is in hand, or when the next claim would be one of several."""
        repo = self.conns.repo
        if repo is None or not lifecycle.deferrable(claimed, result, repo.keep_history_s):
            return False
        if not self.batch.holds and (
            not self._may_chain() or self.batch.size(len(self.candidates.batch)) < 2
        ):
            return False
        lifecycle.deferred(self.spec.ledger, claimed)
        self.batch.defer(claimed, result)
        return True

    def _settle(self, claimed: Claimed, result: Result) -> Settlement:
        registry = self.runners.registry
        alone = self.batch.holds  # a batch in hand: its statement claims the next ones
        chain = (self.candidates.window(), registry) if self._may_chain() and not alone else None
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
            cancelled_by=self.attempt.cancel.reason,
            registry=registry,
        )

    def _write(self, write: Any, claimed: Claimed) -> Any:
        return self.conns.write_while_leased(write, claimed, lambda: self.hurry)


def run_slot(spec: SlotSpec, sup: Connection) -> NoReturn:
    Slot(spec, sup).main()
