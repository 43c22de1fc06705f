"""The closed set of ways one attempt can end, as metrics and logs name them."""

from enum import StrEnum


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    TIMEOUT = "timeout"
    CONTINUED = "continued"
    CANCELLED = "cancelled"
    LOST = "lost"
    CRASHED = "crashed"


# What the runner (or the slot on its behalf) reports about a handler call.
DONE = "done"
CONTINUE = "continue"
ERROR = "error"
SHUTDOWN = "shutdown"  # raised Cancelled, or still running when the shutdown grace ran out
KILLED = "killed"  # ended by the watchdog after the deadline and the kill grace
CRASHED = "crashed"  # the runner died under the handler
