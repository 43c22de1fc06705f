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
import socket
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

import psutil
import psycopg

from slotd import db, lifecycle, logs, proc, runner
from slotd.config import Settings
from slotd.ledger import CAPACITY, Ledger, lean
from slotd.lifecycle import Settlement, not_started
from slotd.outcome import CRASHED, KILLED, SHUTDOWN, Result, past
from slotd.registry import Registry
from slotd.repository import Claimed, Repository
from slotd.watchdog import Step, Watchdog

log = logging.getLogger("slotd.slot")

CRASH_LOOP_FLOOR = 5.0  # a runner that dies younger than this counts toward the backoff
# SIGKILL ends any process but one in uninterruptible sleep (a hung NFS read, a stuck
# device): waiting longer than this for such a runner would hang the slot with it.
RUNNER_STOP_TIMEOUT = 10.0
# A running attempt re-reads its own row for a cancel every this many poll intervals (30 s at
# the default 5 s): one primary-key read per long task, and the bound on how long a cancel
# whose notification was lost can go unnoticed.
CANCEL_RECHECK_POLLS = 6
BOOT_TIMEOUT = 120.0  # importing a large application can take a while
# A busy slot's settlement lines leave in batches at most this old (see logs.HoldingHandler);
# a kill -9 loses at most this much of the log, never a settlement.
LOG_HOLD = 0.25
# A busy slot's supervisor hears of its settlements and leases at most this late: metrics,
# the dashboard's outcomes and a cancel's routing lag by as much (a slot's death does not).
RING_HOLD = 0.25


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


@dataclass
class Runner:
    pid: int
    conn: Connection
    watch: proc.ChildWatch
    started: float = field(default_factory=time.monotonic)
    tasks: int = 0

    def stop(self, timeout: float = RUNNER_STOP_TIMEOUT) -> int | None:
        """Kill the runner's group and reap it; None when it has not died within `timeout`
        (uninterruptible sleep): the caller keeps its watch and reports it stuck."""
        proc.kill_group(self.pid, signal.SIGKILL)
        status = self.watch.wait(timeout)
        self.conn.close()
        if status is not None:
            self.watch.close()
        return status


class Slot:
    def __init__(self, spec: SlotSpec, sup: Connection) -> None:
        self.spec = spec
        self.sup = sup
        self.settings = spec.settings
        self.claim_registry = spec.registry
        self.stopping = False
        self.orphaned = False  # the supervisor is gone: nothing more to report
        self.hurry = False
        self.reload = False
        self.fresh_code = False
        self.runner: Runner | None = None
        self.stuck: list[Runner] = []  # killed but not dead: uninterruptible sleep
        self.cancel_sent = False  # a CANCEL went to the runner during its last task
        self.repo: Repository | None = None
        self.crashes = 0
        self.batch: list[int] = []
        self.cancel_reason: str | None = None  # an operator cancelled the running task
        self.woken = False  # a wake token that arrived while a task ran
        self.sup_open = True
        self.log = logs.FieldsAdapter(log, {"slot": spec.number})
        self.waiter = proc.Waiter()
        self.holding: Claimed | None = None  # the lease held now, as the ledger has it
        self.unrung_since: float | None = None  # ledger entries the supervisor has not heard of

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
            if self.runner is not None:
                self.runner.stop()
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
        self._connect()
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
                self._between_tasks()
                if not awake:
                    awake = self._wait_token()
                    continue
                if self.runner is None:  # never claim work there is no runner to run
                    self._spawn_runner()
                    continue
                try:
                    claimed = self._next_claim()
                except psycopg.OperationalError as exc:
                    self._reconnect(exc)
                    continue
                if claimed is None:
                    awake = False
                    self._report("empty")
                    continue
                self.holding = claimed
                lifecycle.claimed(self.spec.ledger, claimed)  # before the message: see there
                self._report("claimed", claimed, self._runner_pid(), self.spec.ledger.count)
            claimed = self._handle(claimed)
            self._settled()

    def _settled(self) -> None:
        """No message per task: the supervisor hears of the ledger's settlements at the
        next bell (see slotd.ledger)."""
        ledger = self.spec.ledger
        now = time.monotonic()
        if self.unrung_since is None:
            self.unrung_since = now
        if ledger.unread() >= CAPACITY // 2 or now - self.unrung_since >= RING_HOLD:
            self._ring()

    def _ring(self) -> None:
        """Tell the supervisor how far the ledger goes, and the lease held now."""
        self.unrung_since = None
        lease = None if self.holding is None else lean(self.holding)
        self._report("ledger", self.spec.ledger.count, lease, self._runner_pid())

    def _pay_what_is_due(self, timeout: float | None) -> float | None:
        """Held log lines wait no longer than LOG_HOLD, unrung ledger entries no longer than
        RING_HOLD: write what is due now, and wake in time for the rest."""
        for due_in, pay in ((logs.due_in, logs.flush), (self._ring_due, self._ring)):
            if (due := due_in()) is None:
                continue
            if due <= 0:
                pay()
            else:
                timeout = due if timeout is None else min(timeout, due)
        return timeout

    def _ring_due(self) -> float | None:
        if self.unrung_since is None:
            return None
        return self.unrung_since + RING_HOLD - time.monotonic()

    def _runner_pid(self) -> int | None:
        return self.runner.pid if self.runner is not None else None

    def _next_claim(self) -> Claimed | None:
        """Claim from what the last discovery found before discovering again: one discovery
        serves up to a batch of claims."""
        if self.batch and (claimed := self._claim_batch()) is not None:
            return claimed
        if not self._discover(on_primary=False):
            return None
        if (claimed := self._claim_batch()) is not None:
            return claimed
        # Every candidate missed: other slots took them, or a lagging read lane offered rows
        # the primary already finished. One more look, on the primary (bounded: then the
        # normal path), so replica lag costs a round trip rather than a poll interval.
        assert self.repo is not None
        if self.repo.has_read_lane:
            self._report("read_miss")
        if not self._discover(on_primary=True):
            return None
        return self._claim_batch()

    def _discover(self, on_primary: bool) -> list[int]:
        assert self.repo is not None
        limit = self.settings.discovery_batch * self.settings.slots
        found = self.repo.discover(
            self.claim_registry.types,
            limit,
            self.claim_registry.concurrency_limits,
            on_primary=on_primary,
        )
        # In the discovery's order, whichever slot: slots that discovered the same rows all
        # start at the head, and the claim's SKIP LOCKED (and its recheck of a row leased
        # meanwhile) gives each the first row nobody else holds, so nothing starts before an
        # older-keyed claimable task. A rotation per slot spread the contention, and started
        # lower-priority rows before the head of the queue.
        self.batch = found
        return self.batch

    def _claim_batch(self) -> Claimed | None:
        assert self.repo is not None
        claimed = self.repo.claim(self.batch, self.claim_registry)
        if claimed is None:
            self.batch = []
        else:
            self._consumed(claimed)
        return claimed

    def _consumed(self, claimed: Claimed) -> None:
        # The claim takes the oldest claimable candidate, so every candidate before it was
        # already taken by another slot: drop those too rather than try them again.
        if claimed.id in self.batch:
            self.batch = self.batch[self.batch.index(claimed.id) + 1 :]

    def _may_chain(self) -> bool:
        """Whether the next claim may ride on this task's settlement: not when the slot is
        about to stop or to replace its runner, and only with candidates in hand."""
        if self.stopping or self.reload or self.runner is None or not self.batch:
            return False
        limit = self.settings.runner_max_tasks
        return not (limit and self.runner.tasks >= limit) and not self.settings.runner_max_rss_mib

    def _wait_token(self) -> bool:
        if self.woken:
            self.woken = False
            return True
        proc.set_title(f"slot {self.spec.number} idle")
        logs.flush()  # an idle slot holds no lines...
        if self.unrung_since is not None:  # ...and owes its supervisor no settlement
            self._ring()
        self._report("idle")
        while not self.stopping:
            watched: list[Any] = [self.sup, self.selfpipe]
            if self.runner is not None and self.runner.watch.fd is not None:
                watched.append(self.runner.watch)
            # Without a pidfd, look at the runner once a second instead.
            blind = self.runner is None or self.runner.watch.fd is None
            ready = self.waiter.wait(watched, timeout=1.0 if blind else None)
            if self.selfpipe in ready:
                self.selfpipe.drain()
            if self.runner is not None and (
                self.runner.watch in ready
                or (self.runner.watch.fd is None and self.runner.watch.poll() is not None)
            ):
                self._runner_died(Result(CRASHED, "runner died while idle"), idle=True)
            if self.runner is None:
                self._spawn_runner()
            if self.reload and not self.stopping:
                self._between_tasks()
            if self.sup in ready:
                message = self.sup.recv()
                if message[0] == "wake":
                    return True
        return False

    def _between_tasks(self) -> None:
        """Runner replacement happens here only, never mid-task: on SIGHUP (new code) or
        when recycling is configured and the runner has served enough or grown too big."""
        self._reap_stuck()
        runner_ = self.runner
        if runner_ is None:
            return
        if self.reload:
            self.reload = False
            self._reload(runner_)
            return
        reason = None
        if self.settings.runner_max_tasks and runner_.tasks >= self.settings.runner_max_tasks:
            reason = "runner_recycled"
        elif self.settings.runner_max_rss_mib:
            try:
                rss = psutil.Process(runner_.pid).memory_info().rss / 2**20
            except psutil.Error:
                rss = 0
            if rss > self.settings.runner_max_rss_mib:
                reason = "runner_recycled"
        if reason is None:
            return
        self._stop_runner(runner_)
        self.runner = None
        self._spawn_runner()
        self._report("restart", reason)

    def _reload(self, current: Runner) -> None:
        """New code: the new runner must start before the old one goes, so a broken deploy
        leaves this slot serving the code it had rather than no code at all."""
        fresh = self._fork_runner(fresh_code=True)
        if fresh is None:
            self.log.error("reload failed: the new code does not start; keeping the old runner")
            self._report("reload_failed")
            return
        self._stop_runner(current)
        self.fresh_code = True
        self.runner = fresh
        self._report("runner", fresh.pid)
        self._report("restart", "reload")
        self._report("reloaded")

    # connections

    def _connect(self) -> None:
        backoff = db.Reconnect()
        role = f"slotd slot {self.spec.number}"
        prepare = self.settings.prepare
        while not self.stopping:
            write = None
            try:
                write = db.connect(self.spec.write_url, role=role, prepare=prepare)
                read = (
                    db.connect(self.spec.read_url, role=role, prepare=prepare)
                    if self.spec.read_url
                    else None
                )
                repo = Repository.from_settings(self.settings, write, read)
                if db.session_is_ours(write, prepare):
                    repo.bind_session()
                self.repo = repo
                return
            except psycopg.OperationalError as exc:
                if write is not None:
                    write.close()
                delay = backoff.next()
                self.log.warning(
                    "database unreachable, retrying in %.1fs: %s", delay, db.first_line(exc)
                )
                self._pause(delay)
        raise SystemExit(0)

    def _reconnect(self, exc: Exception) -> None:
        self.log.warning("lost the database connection: %s", db.first_line(exc))
        if self.repo is not None:
            for conn in {self.repo.write, self.repo.read}:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass
        self.repo = None
        self.batch = []
        self._connect()

    def _pause(self, seconds: float) -> None:
        """Sleep that a shutdown signal cuts short."""
        if wait([self.selfpipe], timeout=seconds):
            self.selfpipe.drain()

    # the runner

    def _spawn_runner(self) -> None:
        if self.crashes:
            self._pause(min(0.1 * 2 ** (self.crashes - 1), 10.0))
        if self.stopping:
            return
        self.runner = self._fork_runner(self.fresh_code)
        if self.runner is None:
            self.crashes += 1
            self._report("restart", "runner_boot_failed")
        else:
            # The supervisor kills this runner's group if the slot dies: it must know the
            # current one after a recycle, a reload or an idle respawn, not the last claim's.
            self._report("runner", self.runner.pid)

    def _fork_runner(self, fresh_code: bool) -> Runner | None:
        ours, theirs = socket.socketpair()
        parent = os.getpid()
        logs.flush()  # else the runner inherits the held lines and writes them again
        pid = os.fork()
        if pid == 0:  # the runner; it never returns into the slot's stack
            try:
                logs.hold(0)  # a handler's own lines go out as they are logged
                logs.lean_records(False)
                ours.close()
                self.sup.close()
                self.selfpipe.close()
                if self.runner is not None:
                    self.runner.conn.close()
                    self.runner.watch.close()
                registry = self.spec.registry
                if fresh_code:
                    registry = runner.fresh_registry(self.spec.app)
                runner.serve(
                    Connection(theirs.detach()),
                    registry,
                    self.spec.number,
                    self.spec.faults,
                    parent=parent,
                )
            except BaseException:  # noqa: BLE001 - the slot sees the EOF and backs off
                traceback.print_exc()
            finally:
                os._exit(78)
        theirs.close()
        try:
            os.setpgid(pid, pid)  # also done by the child: whoever runs first wins the race
        except OSError:
            pass
        handle = Runner(pid, Connection(ours.detach()), proc.ChildWatch(pid))
        if not handle.conn.poll(BOOT_TIMEOUT):
            handle.stop()
            self.log.error("runner did not start within %ss", BOOT_TIMEOUT)
            return None
        try:
            _, types, ceilings, limits, concurrency = handle.conn.recv()
        except (EOFError, OSError):
            status = handle.stop()
            self.log.error("runner failed to start: %s", proc.describe_status(status))
            return None
        if fresh_code:
            self.claim_registry = _registry_view(types, ceilings, limits, concurrency)
        return handle

    def _stop_runner(self, runner_: Runner) -> int | None:
        """Stop a runner; one that does not die is kept aside, reported stuck (the
        supervisor's /healthz fails, so an orchestrator replaces the replica) and reaped
        here if it ever dies."""
        status = runner_.stop()
        if status is None:
            self.log.error(
                "runner %s did not die after SIGKILL within %ss (uninterruptible sleep?)",
                runner_.pid,
                RUNNER_STOP_TIMEOUT,
            )
            self.stuck.append(runner_)
            self._report("stuck", len(self.stuck))
        return status

    def _reap_stuck(self) -> None:
        if not self.stuck:
            return
        alive = [r for r in self.stuck if r.watch.poll() is None]
        if len(alive) < len(self.stuck):
            for r in self.stuck:
                if r not in alive:
                    r.watch.close()
            self.stuck = alive
            self._report("stuck", len(alive))

    def _runner_died(self, result: Result, idle: bool = False) -> None:
        runner_ = self.runner
        if runner_ is None:
            return
        status = self._stop_runner(runner_)
        self.runner = None
        self._report("runner", None)
        if result.kind == CRASHED:
            # Only crashes feed the backoff: a watchdog kill is the system working.
            young = time.monotonic() - runner_.started < CRASH_LOOP_FLOOR
            self.crashes = self.crashes + 1 if (young or idle) else 0
            result.error = f"{result.error}: {proc.describe_status(status)}"
        self._report("restart", "runner_killed" if result.kind != CRASHED else "runner_crashed")

    # one task

    def _handle(self, claimed: Claimed) -> Claimed | None:
        margin = self.settings.lease_margin
        deadline = claimed.deadline(margin)
        started = time.monotonic()
        self.cancel_reason = None
        if past(deadline):
            result = not_started(claimed)
        elif self.stopping or self.runner is None:  # a chained claim met a shutdown
            result = Result(SHUTDOWN, "not started: the replica is stopping")
        else:
            result = self._watch(claimed, self.runner, deadline)
            if result.duration is None:
                result.duration = time.monotonic() - started
        # Settled (database and ledger) before the next runner is forked: crash backoff and
        # a slow import could otherwise outlast the lease, and the supervisor would find the
        # settled lease still in the ledger if this slot died meanwhile.
        settlement = self._settle(claimed, result)
        self.holding = settlement.next
        if self.runner is None and not self.stopping:
            self._spawn_runner()
        if settlement.claim_tried:
            if settlement.next is not None:
                self._consumed(settlement.next)
            else:  # every candidate offered was gone: the rest may not be
                self.batch = self.batch[self.settings.discovery_batch :]
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
            self._runner_died(result)
            return result
        self.cancel_sent = False
        runner_.tasks += 1
        recheck_every = self.settings.poll_interval.total_seconds() * CANCEL_RECHECK_POLLS
        recheck_at = dog.started + recheck_every
        while True:
            now = time.monotonic()
            if self.cancel_reason is None and now >= recheck_at:
                recheck_at = now + recheck_every
                self._recheck_cancel(claimed)
            cancelled = self.cancel_reason is not None
            while (step := dog.step(now, self.stopping, self.hurry, cancelled)) is not None:
                if step is Step.CANCEL_KILL:
                    self._runner_died(Result(KILLED))
                    grace = self.settings.kill_grace.total_seconds()
                    return Result(KILLED, f"killed {grace:g}s after it was cancelled", advanced)
                if step in (Step.CANCEL, Step.INTERRUPT):
                    self.cancel_sent = self.cancel_sent or step is Step.CANCEL
                    # The runner alone: its handler's subprocesses must not get the signal.
                    proc.send(
                        runner_.pid, runner.CANCEL if step is Step.CANCEL else runner.INTERRUPT
                    )
                elif step is Step.SHUTDOWN_KILL:
                    self._runner_died(Result(SHUTDOWN))
                    return Result(
                        SHUTDOWN, "still running when the shutdown grace ran out", advanced
                    )
                else:
                    self._runner_died(Result(KILLED))
                    grace = self.settings.kill_grace.total_seconds()
                    return Result(KILLED, f"killed {grace:g}s after its deadline", advanced, True)
            proc.set_title(f"{label} {now - dog.started:.0f}s/{ceiling.total_seconds():.0f}s")
            timeout = self._pay_what_is_due(dog.wait_for(now))
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
                    self.crashes = 0
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
                self._runner_died(result)
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
                self._cancelled(claimed, message[3])

    def _recheck_cancel(self, claimed: Claimed) -> None:
        if self.repo is None:
            return
        try:
            reason = self.repo.cancel_reason(claimed.id, claimed.token)
        except psycopg.Error as exc:  # the settlement reconnects; this look can wait
            self.log.warning("could not look for a cancel of task %s: %s", claimed.id, exc)
            return
        if reason is not None:
            self._cancelled(claimed, reason)

    def _cancelled(self, claimed: Claimed, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
            self.log.info(
                "task %s#%s %s: stopping it",
                claimed.task_type,
                claimed.id,
                reason if reason.startswith("cancelled") else f"cancelled by {reason}",
                extra={"task_id": claimed.id, "task_type": claimed.task_type},
            )

    def _advance(self, claimed: Claimed, body: str) -> tuple[bool, str | None]:
        """Write a cursor for the runner. Whatever the database says about the data is the
        handler's error (raised in its frame), never this slot's."""
        try:
            ok = self._with_db(lambda repo: lifecycle.advance(repo, claimed, body), claimed)
        except Exception as exc:  # noqa: BLE001 - bad data must not take the slot down
            self.log.warning("cursor write failed: %s", db.first_line(exc), extra=_ids(claimed))
            return False, db.first_line(exc)
        return bool(ok), None

    def _settle(self, claimed: Claimed, result: Result) -> Settlement:
        # The claim riding on the settlement offers the head of the candidates, not all of
        # them: it takes the first claimable; the rest are tried in a claim of their own if
        # these are all gone.
        window = self.batch[: self.settings.discovery_batch]
        return lifecycle.conclude(
            lambda write: self._with_db(write, claimed),
            self.spec.ledger,
            claimed,
            result,
            report=self._report,
            faults=self.spec.faults,
            logger=self.log,
            shutting_down=self.stopping,
            then_claim=(window, self.claim_registry) if self._may_chain() else None,
            cancelled_by=self.cancel_reason,
            registry=self.claim_registry,
        )

    def _with_db(self, write: Any, claimed: Claimed) -> Any:
        """A write about a claimed task, retried across reconnects while the lease is still
        ours; past the lease there is nothing left to protect."""
        while True:
            try:
                if self.repo is None:
                    self._connect()
                assert self.repo is not None
                return write(self.repo)
            except psycopg.OperationalError as exc:
                if datetime.now(UTC) >= claimed.lease_expires_at or self.hurry:
                    self.log.error("giving up a settlement: the lease has lapsed (%s)", exc)
                    return None
                self._reconnect(exc)


def _ids(claimed: Claimed) -> dict[str, Any]:
    return {"task_id": claimed.id, "task_type": claimed.task_type, "attempt": claimed.attempt}


def _registry_view(
    types: list[str],
    ceilings: list[float],
    limits: list[tuple[Any, ...]],
    concurrency: dict[str, tuple[int | None, int | None]],
) -> Registry:
    """What the runner (possibly with new code) can run, with each type's ceiling and
    limits: the claim's type list, its concurrency limits and the settlement's backoff."""
    from datetime import timedelta

    def span(seconds: float | None) -> timedelta | None:
        return None if seconds is None else timedelta(seconds=seconds)

    view = Registry()
    for name, ceiling, (attempts, base, cap) in zip(types, ceilings, limits, strict=True):
        most, per_group = concurrency.get(name, (None, None))
        view.register(
            name,
            _unreachable,
            ceiling=timedelta(seconds=ceiling),
            max_attempts=attempts,
            backoff_base=span(base),
            backoff_cap=span(cap),
            max_running=most,
            max_running_per_group=per_group,
        )
    return view


def _unreachable(task: Any, ctx: Any) -> None:
    raise AssertionError("the slot never runs handlers itself")


def run_slot(spec: SlotSpec, sup: Connection) -> NoReturn:
    Slot(spec, sup).main()
