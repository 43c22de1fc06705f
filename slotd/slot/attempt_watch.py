"""One attempt under its slot's watch: the task handed to the runner, then one wait over the
runner's pipe and exit, the supervisor's pipe and the slot's self-pipe, until the runner
answers, dies, or the watchdog's next step (slotd.watchdog) ends it: the deadline's
interrupt and kill, an operator's cancel and its kill, the shutdown grace. Meanwhile the
runner's cursors are written (fenced, through the lifecycle) and the supervisor's messages
heard: a wake token kept for the slot's next wait, a cancel of this very lease.

The slot (slotd.slot) claims and settles; this room only watches, and returns the Result
the lifecycle settles."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from multiprocessing.connection import Connection
from typing import Any, Protocol

import psycopg

from slotd import db, lifecycle, logs, proc
from slotd.config import Settings
from slotd.outcome import CRASHED, KILLED, SHUTDOWN, Result
from slotd.repository import Claimed, Repository
from slotd.runner import child as runner
from slotd.slot.bell import Bell
from slotd.slot.connections import SlotConnections
from slotd.slot.runner_keeper import Runner, RunnerKeeper
from slotd.slot.spec import SlotSpec
from slotd.slot.watchdog import Step, Watchdog

# A running attempt re-reads its own row for a cancel every this many poll intervals (30 s at
# the default 5 s): one primary-key read per long task, and the bound on how long a cancel
# whose notification was lost can go unnoticed.
CANCEL_RECHECK_POLLS = 6


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


class WatchedSlot(Protocol):
    """What the watch uses of the slot it serves (slot.loop.Slot): its parts and two doors,
    so the watch stands below the slot's loop instead of importing it."""

    spec: SlotSpec
    settings: Settings
    sup: Connection
    selfpipe: proc.SelfPipe
    waiter: proc.Waiter
    log: logs.FieldsAdapter
    runners: RunnerKeeper
    conns: SlotConnections
    bell: Bell
    stopping: bool
    hurry: bool

    def _report(self, *message: Any) -> None: ...

    def batch_chores(self) -> float | None: ...

    @property
    def holds_batch(self) -> bool: ...

    def _write(self, write: Any, claimed: Claimed) -> Any: ...


class AttemptWatch:
    """The slot's watch over its attempts, one at a time (`run`), and what it hears meanwhile
    that outlives an attempt: a wake token for the slot's next wait, a CANCEL signal sent to
    the runner (which the next task's message tells it to forget), a closed supervisor pipe."""

    def __init__(self, slot: WatchedSlot) -> None:
        self.slot = slot
        recheck = slot.settings.poll_interval.total_seconds() * CANCEL_RECHECK_POLLS
        self.cancel = OperatorCancel(recheck, slot.log)
        self.cancel_sent = False  # a CANCEL went to the runner during its last task
        self.woken = False  # a wake token that arrived while a task ran
        self.sup_open = True

    def run(self, claimed: Claimed, runner_: Runner, deadline: datetime) -> Result:
        """Hand `claimed` to the runner and watch it to its end: the attempt's Result."""
        s = self.slot
        dog = Watchdog.for_deadline(deadline, s.settings.kill_grace, s.settings.shutdown_grace)
        ceiling = claimed.lease_expires_at - claimed.claimed_at - s.settings.lease_margin
        label = f"slot {s.spec.number} running {claimed.task_type}#{claimed.id}"
        try:
            # A cancel sent during the last task may have landed after its result: the
            # runner forgets it on this message, never on its own, so a cancel sent from
            # here on (a SIGTERM while it receives the task) is kept.
            message = runner.claimed_message(claimed, deadline, self.cancel_sent)
            proc.tell(runner_.conn, message)
        except OSError:  # it died between tasks, before we noticed: ours to settle
            result = Result(CRASHED, "runner died before it got the task")
            s.runners.died(result)
            return result
        self.cancel_sent = False
        runner_.tasks += 1
        try:
            return self._watch(claimed, runner_, dog, label, ceiling)
        finally:
            if proc.title_is(label):  # a long attempt's title, gone with it
                proc.set_title(f"slot {s.spec.number} busy")

    def _watch(
        self, claimed: Claimed, runner_: Runner, dog: Watchdog, label: str, ceiling: timedelta
    ) -> Result:
        s = self.slot
        advanced = False
        # No title for the first pass: most attempts end before the second (the runner's
        # answer), and a title per task was a system call per task (prctl) in the slot; a
        # longer attempt gets it at the watchdog's next wake, at most a second later.
        first = True
        while True:
            # The batch's bounds hold while this attempt runs (a stop gives it back at once;
            # the running attempt has its shutdown grace).
            batch_in = s.batch_chores() if s.holds_batch else None
            now = time.monotonic()
            self.cancel.look_if_due(now, claimed, s.conns.repo)
            cancelled = self.cancel.reason is not None
            while (step := dog.step(now, s.stopping, s.hurry, cancelled)) is not None:
                if step is Step.CANCEL_KILL:
                    s.runners.died(Result(KILLED))
                    grace = s.settings.kill_grace.total_seconds()
                    return Result(KILLED, f"killed {grace:g}s after it was cancelled", advanced)
                if step in (Step.CANCEL, Step.INTERRUPT):
                    self.cancel_sent = self.cancel_sent or step is Step.CANCEL
                    # The runner alone: its handler's subprocesses must not get the signal.
                    proc.send(
                        runner_.pid, runner.CANCEL if step is Step.CANCEL else runner.INTERRUPT
                    )
                elif step is Step.SHUTDOWN_KILL:
                    s.runners.died(Result(SHUTDOWN))
                    return Result(
                        SHUTDOWN, "still running when the shutdown grace ran out", advanced
                    )
                else:
                    s.runners.died(Result(KILLED))
                    grace = s.settings.kill_grace.total_seconds()
                    return Result(KILLED, f"killed {grace:g}s after its deadline", advanced, True)
            if not first:
                proc.set_title(f"{label} {now - dog.started:.0f}s/{ceiling.total_seconds():.0f}s")
            first = False
            timeout = s.bell.pay_what_is_due(dog.wait_for(now))
            if batch_in is not None:
                timeout = batch_in if timeout is None else min(timeout, batch_in)
            watched = [runner_.conn, s.selfpipe]
            if runner_.watch.fd is not None:  # no pidfd (old kernel, seccomp): polled below
                watched.append(runner_.watch)
            ready = s.waiter.wait([*watched, s.sup] if self.sup_open else watched, timeout=timeout)
            if s.selfpipe in ready:
                s.selfpipe.drain()
            if s.sup in ready:
                self._from_supervisor(claimed)
            if runner_.conn in ready:
                try:
                    message = runner_.conn.recv()
                except (EOFError, OSError):
                    message = None
                if message is not None and message[0] == "result":
                    result = Result(*message[1:])
                    result.advanced = result.advanced or advanced
                    s.runners.crashes = 0
                    if result.extra.get(runner.RECYCLE):  # what the attempt started runs on
                        s.runners.died(result)  # ended before the settlement, not after
                    return result
                if message is not None and message[0] == "fault":
                    s._report("fault", message[1])
                    continue
                if message is not None and message[0] == "cursor":
                    ok, error = self._advance(claimed, message[1])
                    advanced = advanced or ok
                    runner_.conn.send(("cursor_ok", ok, error))
                    continue
                if message is not None and message[0] == "wait":
                    runner_.conn.send(("wait_ok", *self._wait(claimed, *message[1:])))
                    continue
                if message is not None and message[0] == "step":
                    runner_.conn.send(("step_ok", *self._step(claimed, *message[1:])))
                    continue
            exited = runner_.watch in ready or runner_.conn in ready or runner_.watch.fd is None
            if exited and runner_.watch.wait(1.0 if runner_.conn in ready else 0) is not None:
                result = Result(CRASHED, "runner died under the handler", advanced)
                s.runners.died(result)
                return result

    def _from_supervisor(self, claimed: Claimed) -> None:
        s = self.slot
        while proc.ready_now(s.sup):
            try:
                message = s.sup.recv()
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
        s = self.slot
        try:
            ok = s._write(lambda repo: lifecycle.advance(repo, claimed, body), claimed)
        except Exception as exc:  # noqa: BLE001 - bad data must not take the slot down
            s.log.warning("cursor write failed: %s", db.first_line(exc), extra=_ids(claimed))
            return False, db.first_line(exc)
        return bool(ok), None

    def _step(self, claimed: Claimed, index: int, name: str, text: str) -> tuple[bool, str | None]:
        """Store a durable step's value for the runner, fenced, before its handler goes on;
        the database's word on the data is the handler's error, as for a cursor."""
        s = self.slot
        try:
            ok = s._write(lambda repo: lifecycle.step(repo, claimed, index, name, text), claimed)
        except Exception as exc:  # noqa: BLE001 - bad data must not take the slot down
            s.log.warning("step write failed: %s", db.first_line(exc), extra=_ids(claimed))
            return False, db.first_line(exc)
        return bool(ok), None

    def _wait(
        self, claimed: Claimed, index: int, name: str, event: str | None, for_s: float | None
    ) -> tuple[str | None, str | None, Any]:
        """A durable sleep or event wait for the runner (lifecycle.wait): the verdict (None:
        refused), the database's error (the handler's to see) and the event's data."""
        s = self.slot
        try:
            answer = s._write(
                lambda repo: lifecycle.wait(repo, claimed, index, name, event, for_s), claimed
            )
        except Exception as exc:  # noqa: BLE001 - bad data must not take the slot down
            s.log.warning("wait write failed: %s", db.first_line(exc), extra=_ids(claimed))
            return None, db.first_line(exc), None
        if answer is None:
            return None, None, None
        return answer[0], None, answer[1]


def _ids(claimed: Claimed) -> dict[str, Any]:
    return {"task_id": claimed.id, "task_type": claimed.task_type, "attempt": claimed.attempt}
