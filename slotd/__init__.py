"""slotd: a durable PostgreSQL task queue and the worker daemon that drains it."""

from slotd.errors import (
    Cancelled,
    DeadlineExceeded,
    Discard,
    LeaseLost,
    RetryAfter,
    SchemaNotMigrated,
    SlotdError,
    Snooze,
    StepMismatch,
)
from slotd.outcome import Outcome
from slotd.registry import Registry
from slotd.repository import NewTask, UnknownParents
from slotd.task import Context, Task

__all__ = [
    "Attempt",
    "Cancelled",
    "Context",
    "DeadlineExceeded",
    "Discard",
    "LeaseLost",
    "NewTask",
    "Outcome",
    "Registry",
    "RetryAfter",
    "SchemaNotMigrated",
    "SlotdError",
    "Snooze",
    "StepMismatch",
    "Task",
    "TaskResult",
    "UnknownParents",
    "batch",
    "batch_async",
    "cancel",
    "emit",
    "emit_async",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "pause",
    "result",
    "result_async",
    "resume",
    "wait_result",
    "wait_result_async",
]
__version__ = "0.2.0.dev0"

from slotd.producer.batches import batch, batch_async  # noqa: E402
from slotd.producer.control import cancel, pause, resume  # noqa: E402
from slotd.producer.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async  # noqa: E402
from slotd.producer.events import emit, emit_async  # noqa: E402
from slotd.producer.results import (  # noqa: E402
    Attempt,
    TaskResult,
    result,
    result_async,
    wait_result,
    wait_result_async,
)
