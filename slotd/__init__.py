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
from slotd.repository.admin import TaskInfo
from slotd.task import Context, Task
from slotd.typed.handle import TaskHandle
from slotd.typed.ids import EnqueuedId

__all__ = [
    "Attempt",
    "Cancelled",
    "Context",
    "DeadlineExceeded",
    "Discard",
    "EnqueuedId",
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
    "TaskHandle",
    "TaskInfo",
    "TaskResult",
    "UnknownParents",
    "batch",
    "batch_async",
    "cancel",
    "cancel_async",
    "emit",
    "emit_async",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "delete_schedule",
    "pause",
    "pause_async",
    "purge",
    "purge_async",
    "put_schedule",
    "result",
    "result_async",
    "resume",
    "resume_sequence",
    "resume_sequence_async",
    "resume_async",
    "retry",
    "retry_async",
    "tasks",
    "tasks_async",
    "wait_result",
    "wait_result_async",
]
__version__ = "0.2.0.dev0"

from slotd.producer.admin import purge, purge_async, retry, retry_async, tasks, tasks_async  # noqa: E402
from slotd.producer.batches import batch, batch_async  # noqa: E402
from slotd.producer.control import (  # noqa: E402
    cancel,
    cancel_async,
    pause,
    pause_async,
    resume,
    resume_async,
)
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
from slotd.producer.schedules import delete_schedule, put_schedule  # noqa: E402
from slotd.producer.sequences import resume_sequence, resume_sequence_async  # noqa: E402
