"""Exceptions a handler, a caller or an operator can meet."""

from datetime import timedelta


class SlotdError(Exception):
    """Base of every slotd error."""


class ConfigError(SlotdError, ValueError):
    """Bad settings or usage: the CLI exits 2 with this one line; to Python callers it is
    a ValueError."""


class Cancelled(SlotdError):
    """The replica is shutting down; the handler should stop and return."""


class DeadlineExceeded(SlotdError):
    """The handler's deadline (lease minus margin) has passed."""


class LeaseLost(SlotdError):
    """A fenced write matched nothing: this worker no longer owns the row."""

    def __init__(self, message: str, next_claim: object = None) -> None:
        super().__init__(message)
        # A settlement that also claimed the next task refused the first half only: the
        # claim is this worker's all the same.
        self.next_claim = next_claim


def _delay(value: object, what: str) -> float:
    """A non-negative timedelta (or seconds) as seconds, else TypeError/ValueError."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"{what} takes a timedelta (or seconds), not {value!r}")
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"{what}: the delay must be finite and not negative, not {value!r}")
    return float(seconds)


class Snooze(SlotdError):
    """Raised by a handler: not now, again after `delay` (a timedelta). Costs no attempt;
    a task's snoozes are counted and capped (slotd.lifecycle.MAX_SNOOZES), past which it is
    a dead letter saying so. A snooze beyond the task's expires_in lets it expire."""

    def __init__(self, delay: timedelta | float) -> None:
        self.delay_s = _delay(delay, "Snooze")
        super().__init__(f"snoozed for {self.delay_s:g}s")


class Discard(SlotdError):
    """Raised by a handler: this task can never succeed; a dead letter now (reason
    "discarded", `reason` kept as its error), whatever attempts remain. Its dependants are
    cancelled and its batch counts it failed, as for any dead letter."""

    def __init__(self, reason: str = "discarded by its handler") -> None:
        self.reason = reason
        super().__init__(reason)


class RetryAfter(SlotdError):
    """Raised by a handler: a failure whose next attempt is due after `delay` (an HTTP 429's
    Retry-After), instead of the backoff's; still bounded by max_attempts."""

    def __init__(self, delay: timedelta | float, message: str | None = None) -> None:
        self.delay_s = _delay(delay, "RetryAfter")
        super().__init__(message or f"retry after {self.delay_s:g}s")


class Suspended(BaseException):  # noqa: N818 - a signal to slotd, not an error
    """Raised by ctx.sleep / ctx.wait_event once the wait is written: the attempt ends here
    and the task runs again from the top when it wakes. A BaseException, so a handler's
    `except Exception` does not swallow it; let it through."""


class StepMismatch(SlotdError):
    """A run's durable steps no longer match the ones its task stored (the handler's code
    changed under a task that took steps): the step is named; nothing runs twice."""


class UnknownTaskType(SlotdError):
    """A claimed row names a type this registry has no handler for."""


class SchemaNotMigrated(SlotdError):
    """The database lacks slotd's schema, or has an older one than this code needs: the
    fix is `slotd migrate` (the CLI exits 2 with this one line)."""


class UnsafeMigration(ConfigError):
    """`slotd migrate` refused a contract step: replicas whose code still uses what it
    removes are alive (exit 2, naming them; `--force` applies it anyway)."""


class MigrationLockTimeout(SlotdError):
    """A migration step could not take a table's lock within its bound: the migration
    rolled back whole (nothing applied). slotd.live_migrate tries again."""

    def __init__(self, step: str) -> None:
        super().__init__(f"{step} could not take its table lock in time")
        self.step = step


class MigrationBlocked(SlotdError):
    """`slotd migrate` gave up: a step's table stayed locked for as long as it was told to
    wait (exit 1, one line naming the holders; nothing applied)."""
