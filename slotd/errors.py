"""Exceptions a handler, a caller or an operator can meet."""


class SlotdError(Exception):
    """Base of every slotd error."""


class ConfigError(SlotdError):
    """Bad settings or usage: the CLI exits 2 with this one line."""


class Cancelled(SlotdError):
    """The replica is shutting down; the handler should stop and return."""


class DeadlineExceeded(SlotdError):
    """The handler's deadline (lease minus margin) has passed."""


class LeaseLost(SlotdError):
    """A fenced write matched nothing: this worker no longer owns the row."""


class UnknownTaskType(SlotdError):
    """A claimed row names a type this registry has no handler for."""
