"""Exceptions a handler, a caller or an operator can meet."""


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
