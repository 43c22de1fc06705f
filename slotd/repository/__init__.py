"""Every statement slotd runs against the queue. The SQL itself is in sql/; this package
loads it (named), binds parameters and says what a zero-row match means, one module per
concern:

- named: sql/ loaded and spliced, a statement run by name
- schema: the migrations; the databases the embedded and test servers create
- producing: enqueue, its input validated first
- lanes: a worker's write and read lanes, every write bounded
- queue: the queue protocol (discover, claim, the fenced settlements)
- control: operator control (gauges, dead letters, cancel, pause, resume)
- fleet: replica heartbeats, chore elections, the outcome record
- schedules: periodic schedules
- testmodes: the test modes' views and clock
- dashboard: the web dashboard's reads
- dependencies: enqueue(..., after=): parents marked, dependants waiting, cancels cascaded
- batched: several tasks claimed, several successes settled, per statement (#43)
- batches: slotd.batch: the batch row, its tasks joining it, the seal, the operators' reads
- results: stored results (slotd.result), their notifications and their prune
- sessions: liveness, LISTEN/NOTIFY, lock waits of one connection's session

`Repository` is all of a worker's concerns on one pair of lanes. Every name stays
importable from `slotd.repository`."""

from __future__ import annotations

from slotd.repository.batched import BatchedQueue, lease_tokens
from slotd.repository.batches import BatchInFlight, BatchState, BatchStore
from slotd.repository.control import (
    CONTROL_CHANNEL,
    CancelledTask,
    OperatorControl,
    cancel_tasks,
    pause_type,
    paused_types,
    resume_type,
)
from slotd.repository.dashboard import DashboardReads
from slotd.repository.dependencies import DependencyStore, UnknownParents
from slotd.repository.fleet import Beat, Fleet
from slotd.repository.lanes import Lanes
from slotd.repository.named import _BLOCK as _BLOCK
from slotd.repository.named import _SPLICE as _SPLICE
from slotd.repository.named import AsyncExecutor, Executor, execute, sql_dir, statements
from slotd.repository.named import _dicts as _dicts
from slotd.repository.named import _interval as _interval
from slotd.repository.named import _sql as _sql
from slotd.repository.producing import _KEY_TRIES as _KEY_TRIES
from slotd.repository.producing import (
    PRIORITY_RANGE,
    PRIORITY_SPAN,
    NewTask,
    enqueue_many,
    enqueue_many_async,
    enqueue_params,
)
from slotd.repository.producing import _enqueue_one as _enqueue_one
from slotd.repository.producing import _found as _found
from slotd.repository.producing import _json_object as _json_object
from slotd.repository.producing import _one as _one
from slotd.repository.producing import _priority as _priority
from slotd.repository.producing import _seconds as _seconds
from slotd.repository.queue import (
    ERROR_LIMIT,
    Claimed,
    Failure,
    Limits,
    QueueProtocol,
    array_literal,
    id_array,
    limit_params,
    storable,
)
from slotd.repository.results import RESULT_CHANNEL, ResultStore
from slotd.repository.schedules import Schedules
from slotd.repository.schema import (
    create_database,
    migrate,
    migrate_lock_holders,
    migrations,
    newest_migration,
    schema_present,
    unapplied_migrations,
)
from slotd.repository.sessions import (
    WAKE_CHANNEL,
    backend_pid,
    cancel_backend,
    listen,
    listen_control,
    notify_selftest,
    ping,
    plan_generically,
    read_committed_session,
    waiting_for,
)
from slotd.repository.testmodes import Inspection

__all__ = [
    "BatchedQueue",
    "CONTROL_CHANNEL",
    "ERROR_LIMIT",
    "PRIORITY_RANGE",
    "PRIORITY_SPAN",
    "RESULT_CHANNEL",
    "WAKE_CHANNEL",
    "AsyncExecutor",
    "BatchInFlight",
    "BatchState",
    "Beat",
    "BatchStore",
    "CancelledTask",
    "Claimed",
    "DashboardReads",
    "DependencyStore",
    "Executor",
    "Failure",
    "Fleet",
    "Inspection",
    "Lanes",
    "Limits",
    "NewTask",
    "OperatorControl",
    "QueueProtocol",
    "Repository",
    "ResultStore",
    "Schedules",
    "UnknownParents",
    "array_literal",
    "backend_pid",
    "cancel_backend",
    "cancel_tasks",
    "create_database",
    "enqueue_many",
    "enqueue_many_async",
    "enqueue_params",
    "execute",
    "id_array",
    "lease_tokens",
    "limit_params",
    "listen",
    "listen_control",
    "migrate",
    "migrate_lock_holders",
    "migrations",
    "notify_selftest",
    "pause_type",
    "paused_types",
    "ping",
    "plan_generically",
    "read_committed_session",
    "resume_type",
    "schema_present",
    "newest_migration",
    "unapplied_migrations",
    "sql_dir",
    "statements",
    "storable",
    "waiting_for",
]


class Repository(
    BatchedQueue,
    QueueProtocol,
    OperatorControl,
    Fleet,
    Schedules,
    Inspection,
    ResultStore,
    DependencyStore,
    BatchStore,
):
    """The queue on one worker's connections: discovery on the read lane, claims and
    fenced settlements on the write lane, each write bounded by SET LOCAL timeouts."""
