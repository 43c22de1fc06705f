"""The results table: what `get_result()` reads and the state rules every delivery obeys.

Each transition runs in a transaction on Django's connection and starts by locking the
result row (`SELECT ... FOR UPDATE`): the rules are check-then-act, and two deliveries of
one task (a lapsed lease, a redelivery after a lost settlement) must take turns."""

from __future__ import annotations

import dataclasses
import json
import traceback
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import connections, transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.module_loading import import_string
from psycopg.types.json import JsonbLoader

from slotd import repository
from slotd.errors import SlotdError

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


class AttemptFailed(SlotdError):
    """An attempt that ended without its handler writing the outcome: killed at the
    deadline, the runner crashed, or never started. Named in `TaskError.exception_class_path`
    of the error that `get_result()` reports for it."""


def _execute(cur: psycopg.Cursor[Any], using: str, name: str, params: Any) -> Any:
    """A statement on the schema of the slotd backends writing to database `using`."""
    from slotd.contrib.django.database import schema_of

    return repository.execute(cur, name, params, schema=schema_of(using))


def raw_connection(using: str) -> psycopg.Connection[Any]:
    """Django's own psycopg 3 connection for database `using`: statements on it join
    whatever transaction Django has open there."""
    wrapper = connections[using]
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"slotd needs DATABASES[{using!r}] on django.db.backends.postgresql with "
            f"psycopg 3 installed; found {type(raw).__module__}.{type(raw).__name__}"
        )
    return raw


def cursor(using: str) -> psycopg.Cursor[Any]:
    # A plain server-binding cursor: Django's connection defaults to client-side binding
    # and loads jsonb as text (JSONField decodes itself); slotd's statements want neither.
    cur = psycopg.Cursor(raw_connection(using))
    cur.adapters.register_loader("jsonb", JsonbLoader)
    return cur


@contextmanager
def locked(using: str, result_id: str) -> Iterator[tuple[psycopg.Cursor[Any], str | None]]:
    """A transaction holding the result row's lock; yields the cursor and its status (None
    when the row is gone: pruned by retention)."""
    with transaction.atomic(using=using), cursor(using) as cur:
        row = _execute(cur, using, "django_result_lock", {"id": result_id}).fetchone()
        yield cur, (row[0] if row else None)


def start(using: str, result_id: str, worker_id: str) -> str | None:
    """READY/RUNNING -> RUNNING; FAILED -> READY -> RUNNING (a retry); SUCCESSFUL stays.
    Returns the status found before the transition."""
    params = {"id": result_id, "worker_id": worker_id}
    with locked(using, result_id) as (cur, status):
        if status == SUCCESSFUL:
            _execute(cur, using, "django_result_rerun", params)
        elif status is not None:
            if status == FAILED:
                _execute(cur, using, "django_result_reset", params)
            _execute(cur, using, "django_result_running", params)
        return status


def succeed(using: str, result_id: str, return_value: Any) -> None:
    body = json.dumps(return_value, allow_nan=False)
    with locked(using, result_id) as (cur, status):
        if status not in (None, SUCCESSFUL):
            _execute(cur, using, "django_result_succeed", {"id": result_id, "return_value": body})


def fail(using: str, result_id: str, exc: BaseException) -> str | None:
    """Record the error; FAILED unless the record is already SUCCESSFUL (sticky). Returns
    the status found before."""
    error = {
        "exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "traceback": "".join(traceback.format_exception(exc)),
    }
    with locked(using, result_id) as (cur, status):
        if status is not None:
            _execute(
                cur, using, "django_result_fail", {"id": result_id, "error": json.dumps(error)}
            )
        return status


def insert(cur: psycopg.Cursor[Any], *, schema: str, **row: Any) -> datetime:
    found = repository.execute(cur, "django_result_insert", row, schema=schema).fetchone()
    assert found is not None
    enqueued_at: datetime = found[0]
    return enqueued_at


def prune(using: str, retention: timedelta, batch: int = 1000) -> int:
    """Delete results older than the retention window, batch by batch, each batch its own
    transaction so pruning a backlog never holds one long lock."""
    total = 0
    while True:
        with transaction.atomic(using=using), cursor(using) as cur:
            params = {"retention_s": retention.total_seconds(), "batch": batch}
            deleted = _execute(cur, using, "django_results_prune", params).rowcount
        total += deleted
        if deleted < batch:
            return total


def get(using: str, result_id: str) -> TaskResult:
    try:
        key = str(uuid.UUID(str(result_id)))
    except ValueError:
        raise TaskResultDoesNotExist(result_id) from None
    with cursor(using) as cur:
        found = _execute(cur, using, "django_result_get", {"id": key})
        row = found.fetchone()
        names = [col.name for col in found.description or []]
    if row is None:
        raise TaskResultDoesNotExist(result_id)
    return build(dict(zip(names, row, strict=True)))


class ReturnValueNotJSON(TypeError):
    """A task returned a value JSON cannot carry; its result is FAILED, not retried (the
    task's side effects have happened)."""


def _unimportable(path: str, error: BaseException) -> Task:
    """A stand-in Task for a path that no longer imports (a typo, a renamed or removed
    task, code not yet deployed on this host): get_result() still reads the record, and
    calling it raises the ImportError, which the worker records at once."""
    module, _, name = path.rpartition(".")

    def call(*args: Any, **kwargs: Any) -> Any:
        raise error

    call.__module__, call.__name__, call.__qualname__ = module, name, name
    call.slotd_import_error = error  # type: ignore[attr-defined]
    return Task(func=call)


def import_error(task: Task) -> BaseException | None:
    """The ImportError behind a stand-in from _unimportable, else None."""
    return getattr(task.func, "slotd_import_error", None)


def load_task(path: str) -> Task:
    try:
        task = import_string(path)
    except ImportError as exc:  # import_string turns a missing attribute into one too
        error = ImportError(f"task {path} cannot be imported: {exc}")
        error.__cause__ = exc
        return _unimportable(path, error)
    if not isinstance(task, Task):
        return _unimportable(path, ImportError(f"{path!r} is no longer a django.tasks Task"))
    return task


def build(row: dict[str, Any]) -> TaskResult:
    task = dataclasses.replace(
        load_task(row["task_path"]),
        backend=row["backend"],
        queue_name=row["queue_name"],
        priority=row["priority"],
        run_after=row["run_after"],
    )
    errors = [TaskError(**err) for err in row["errors"]]
    status = TaskResultStatus(row["status"])
    if status != row["stored_status"] and status == FAILED:
        reason = row["queue_error"] or "its queue row is gone (a purged dead letter)"
        path = f"{AttemptFailed.__module__}.{AttemptFailed.__qualname__}"
        errors.append(TaskError(exception_class_path=path, traceback=reason))
    result = TaskResult(
        task=task,
        id=str(row["id"]),
        status=status,
        enqueued_at=row["enqueued_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"] if status in (SUCCESSFUL, FAILED) else None,
        last_attempted_at=row["last_attempted_at"],
        args=row["args"],
        kwargs=row["kwargs"],
        backend=row["backend"],
        errors=errors,
        worker_ids=list(row["worker_ids"]),
    )
    if status == SUCCESSFUL:
        object.__setattr__(result, "_return_value", row["return_value"])
    return result
