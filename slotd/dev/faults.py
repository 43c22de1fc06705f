"""Chaos for staging: SLOTD_FAULT_* probabilities turned into real faults.

Off by default, and `slotd run` refuses them unless SLOTD_ALLOW_FAULTS=1, because a
production deployment that inherits a staging environment file must not start failing
tasks on purpose. Every fault injected is logged at WARNING ("injected fault: ...") and
reported through `on_fault(kind)` so it is counted apart from genuine failures
(slotd_faults_injected_total{kind}); a chaos run is only readable if the injected faults
can be subtracted from what the system did on its own.

Where each kind acts, so that it exercises the recovery path it is meant to:

- ``error``: the runner raises InjectedFault instead of calling the handler; settled as a
  failure (backoff, eventually a dead letter) through the ordinary settle path.
- ``latency``: the runner sleeps ``latency_seconds`` before the handler, eating into its
  deadline exactly as a slow dependency would.
- ``crash``: the runner process exits with status 70 before the handler; the slot sees a
  dead runner and settles the attempt as ``crashed``.
- ``lost_settlement``: the slot skips writing the outcome, so the lease is left to expire
  and another worker redelivers the task: the at-least-once path.
- ``slot_crash``: the slot process exits with status 70 after it has left the supervisor the
  attempt's outcome (its last words) and before it writes the settlement; the supervisor
  settles the lease by that outcome (a success is dequeued, not run again) and counts the
  settlements the slot made before it, all from the slot's ledger (slotd.ledger).
- ``answer_lost``: the slot's connection is closed right after a success's settlement
  committed (with or without the next task's claim riding on it), before its answer is read:
  the slot reconnects and finds its claim by the token it chose, or its row gone
  (slotd.lifecycle, "answer lost"), rather than counting the success `lost` and leaving the
  new lease to lapse.
- ``slot_crash_settled``: the slot exits with status 70 after its settlement is written and
  counted in its ledger, before the lease leaves the ledger: the supervisor must neither
  settle that lease again nor miss the count (slotd.ledger.Ledger.settled).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any

import psycopg

from slotd.config import Faults, Settings
from slotd.errors import ConfigError, SlotdError

log = logging.getLogger("slotd.faults")

KINDS = (
    "error",
    "latency",
    "crash",
    "lost_settlement",
    "slot_crash",
    "slot_crash_settled",
    "answer_lost",
)
CRASH_STATUS = 70  # EX_SOFTWARE: distinguishable from a signal or an OOM kill in the slot log


class InjectedFault(SlotdError):
    """Raised in place of a handler call by SLOTD_FAULT_ERROR."""


def refuse_unless_allowed(settings: Settings) -> None:
    """Fault settings without the explicit opt-in are a configuration error."""
    if settings.faults.any and not settings.allow_faults:
        raise ConfigError("SLOTD_FAULT_* set but SLOTD_ALLOW_FAULTS is not 1")


def describe(faults: Faults) -> str:
    """One line for the startup warning, e.g. "error=0.05 crash=0.01"."""
    parts = [f"{kind}={getattr(faults, kind):g}" for kind in KINDS if getattr(faults, kind) > 0]
    if faults.latency > 0:
        parts.append(f"latency_seconds={faults.latency_seconds:g}")
    return " ".join(parts) or "none"


class Injector:
    """Draws each configured fault independently, once per opportunity.

    `rng` makes a chaos run reproducible (tests pass a seeded one); `sleep` and `exit` are
    parameters so that tests can observe latency and crashes without paying for them."""

    def __init__(
        self,
        faults: Faults,
        rng: random.Random | None = None,
        on_fault: Callable[[str], None] | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.faults = faults
        self.rng = rng or random.Random()
        # A runner is forked from its slot with the rng state copied: without a reseed
        # every runner would draw the same sequence and the slots would fault in step.
        # A caller-supplied rng is a request for reproducibility and is left alone.
        self._reseed_after_fork = rng is None
        self._pid = os.getpid()
        self.on_fault = on_fault
        self._sleep = sleep
        self._exit = exit

    @classmethod
    def from_settings(
        cls, settings: Settings, on_fault: Callable[[str], None] | None = None
    ) -> Injector | None:
        """The injector `slotd run` should use, or None when no fault is configured.
        Raises ConfigError when faults are set without SLOTD_ALLOW_FAULTS=1."""
        refuse_unless_allowed(settings)
        if not settings.faults.any:
            return None
        log.warning("fault injection enabled: %s", describe(settings.faults))
        return cls(settings.faults, on_fault=on_fault)

    def _draw(self, probability: float) -> bool:
        # No draw at all for a disabled kind, so enabling one kind does not change the
        # sequence another kind sees under a fixed seed.
        if probability <= 0:
            return False
        if self._reseed_after_fork and os.getpid() != self._pid:
            self.rng, self._pid = random.Random(), os.getpid()
        return self.rng.random() < probability

    def _report(self, kind: str, detail: str) -> None:
        log.warning("injected fault: %s (%s)", kind, detail, extra={"fault": kind})
        if self.on_fault is not None:
            try:
                self.on_fault(kind)
            except Exception:  # a broken counter must not turn into a handler failure
                log.exception("fault counter failed for %s", kind)

    def before_handler(self) -> None:
        """Called in the runner just before the handler. May exit the process (crash),
        sleep (latency) and/or raise InjectedFault (error), in that order: a crash makes
        the rest moot, and a slow call that then fails is the realistic combination."""
        faults = self.faults
        if self._draw(faults.crash):
            self._crash("crash", f"runner exits with status {CRASH_STATUS}")
            return  # only reached when a test replaced exit
        if self._draw(faults.latency):
            self._report("latency", f"{faults.latency_seconds:g}s before the handler")
            self._sleep(faults.latency_seconds)
        if self._draw(faults.error):
            self._report("error", "handler replaced by InjectedFault")
            raise InjectedFault("injected fault: handler error (SLOTD_FAULT_ERROR)")

    def _crash(self, kind: str, detail: str) -> None:
        self._report(kind, detail)
        for handler in logging.getLogger().handlers:
            handler.flush()  # os._exit skips the interpreter's own flushing
        self._exit(CRASH_STATUS)

    def crash_slot_before_settlement(self) -> None:
        """Called in the slot once the outcome is reported and before it is written: may
        exit the slot process, the window in which only the supervisor knows the outcome."""
        if self._draw(self.faults.slot_crash):
            self._crash("slot_crash", f"slot exits with status {CRASH_STATUS} before settling")

    def crash_slot_after_settlement(self) -> None:
        """Called in the slot between the settlement's record in its ledger and the lease's
        removal from it: may exit the slot process in that window."""
        if self._draw(self.faults.slot_crash_settled):
            self._crash(
                "slot_crash_settled", f"slot exits with status {CRASH_STATUS} after settling"
            )

    def answer_lost(self, repo: Any) -> None:
        """Called in the slot once a success's settlement committed, before its answer is
        read: may close the connection and raise as a dropped one would, the window in which
        only the database knows the row was dequeued (and the next one claimed)."""
        if self._draw(self.faults.answer_lost):
            self._report("answer_lost", "connection closed after a settlement committed")
            repo.write.close()
            raise psycopg.OperationalError("injected fault: connection lost after commit")

    def lose_settlement(self) -> bool:
        """Called in the slot before it writes an outcome: True means skip the write and
        leave the lease to expire, as if the slot died between handler and settlement."""
        if self._draw(self.faults.lost_settlement):
            self._report("lost_settlement", "outcome not written; lease left to expire")
            return True
        return False
