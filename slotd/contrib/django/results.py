"""The results table: what `get_result()` reads and the state rules every delivery obeys.

Each transition runs in a transaction on Django's connection and starts by locking the
result row (`SELECT ... FOR UPDATE`): the rules are check-then-act, and two deliveries of
one task (a lapsed lease, a redelivery after a lost settlement) must take turns.

Above slotd.contrib.django.database, below the backend: a `Results` is told its database
alias and schema by the backend that owns it, so reading one backend's result never
builds the other TASKS backends."""

from __future__ import annotations

import dataclasses
import json
import traceback
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.module_loading import import_string

from slotd import repository
from slotd.contrib.django.database import cursor, raw_connection
from slotd.errors import SlotdError
from slotd.producer.results import Attempt, attempts

__all__ = ["AttemptFailed", "Results", "ReturnValueNotJSON", "cursor", "raw_connection"]

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


class AttemptFailed(SlotdError):
    """An attempt that ended without its handler writing the outcome: killed at the
    deadline, the runner crashed, or never started. Named in `TaskError.exception_class_path`
    of the error that `get_result()` reports for it."""


ATTEMPT_FAILED_PATH = f"{AttemptFailed.__module__}.{AttemptFailed.__qualname__}"


@dataclass(frozen=True)
class Results:
    """The results of the tasks a backend enqueues: on database `using`, in `schema`."""

    using: str
    schema: str

    def _execute(self, cur: psycopg.Cursor[Any], name: str, params: Any) -> Any:
        return repository.execute(cur, name, params, schema=self.schema)

    @contextmanager
    def locked(self, result_id: str) -> Iterator[tuple[psycopg.Cursor[Any], str | None]]:
        """A transaction holding the result row's lock; yields the cursor and its status
        (None when the row is gone: pruned by retention)."""
        with transaction.atomic(using=self.using), cursor(self.using) as cur:
            row = self._execute(cur, "django_result_lock", {"id": result_id}).fetchone()
            yield cur, (row[0] if row else None)

    def start(self, result_id: str, worker_id: str, attempt: int | None = None) -> str | None:
        """READY/RUNNING -> RUNNING; FAILED -> READY -> RUNNING (an operator's retry of a
        dead letter); SUCCESSFUL stays. Found RUNNING, the attempt before never wrote its
        end (killed, crashed): its error is recorded now, from the queue row. Returns the
        status found before the transition. `attempt`: this attempt's number (slotd's)."""
        params = {
            "id": result_id,
            "worker_id": worker_id,
            "lost_class": ATTEMPT_FAILED_PATH,
            "attempt": attempt,
        }
        with self.locked(result_id) as (cur, status):
            if status == SUCCESSFUL:
                self._execute(cur, "django_result_rerun", params)
            elif status is not None:
                if status == FAILED:
                    self._execute(cur, "django_result_reset", params)
                self._execute(cur, "django_result_running", params)
            return status

    def succeed(self, result_id: str, return_value: Any) -> None:
        body = json.dumps(return_value, allow_nan=False)
        with self.locked(result_id) as (cur, status):
            if status not in (None, SUCCESSFUL):
                params = {"id": result_id, "return_value": body}
                self._execute(cur, "django_result_succeed", params)

    def fail(
        self,
        result_id: str,
        exc: BaseException,
        *,
        final: bool | None = None,
        attempt: int | None = None,
    ) -> tuple[str | None, str | None]:
        """Record the attempt's error. The result is FAILED (finished) only when no attempt
        follows: `final` True (the worker will not retry it), or None and the queue row is
        on its last attempt or gone. Otherwise it is READY for the retry, and stays so when
        `final` is False (released at shutdown). A SUCCESSFUL record keeps its status.
        Returns the status before and after. `attempt`: the attempt's number (slotd's),
        which get_result matches with slotd's record of the attempt."""
        error: dict[str, Any] = {
            "exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "traceback": "".join(traceback.format_exception(exc)),
        }
        if attempt is not None:
            error["attempt"] = attempt
        params = {"id": result_id, "error": json.dumps(error), "final": final}
        with self.locked(result_id) as (cur, status):
            if status is None:
                return None, None
            row = self._execute(cur, "django_result_fail", params).fetchone()
            return status, row[0]

    def insert(self, cur: psycopg.Cursor[Any], **row: Any) -> datetime:
        """The result row, in the enqueueing transaction (`cur`); returns its enqueued_at."""
        found = self._execute(cur, "django_result_insert", row).fetchone()
        assert found is not None
        enqueued_at: datetime = found[0]
        return enqueued_at

    def prune(self, retention: timedelta, batch: int = 1000) -> int:
        """Delete results older than the retention window, batch by batch, each batch its
        own transaction so pruning a backlog never holds one long lock."""
        total = 0
        while True:
            with transaction.atomic(using=self.using), cursor(self.using) as cur:
                params = {"retention_s": retention.total_seconds(), "batch": batch}
                deleted = self._execute(cur, "django_results_prune", params).rowcount
            total += deleted
            if deleted < batch:
                return total

    def get(self, result_id: str) -> TaskResult:
        try:
            key = str(uuid.UUID(str(result_id)))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        with cursor(self.using) as cur:
            found = self._execute(cur, "django_result_get", {"id": key})
            row = found.fetchone()
            names = [col.name for col in found.description or []]
            if row is None:
                raise TaskResultDoesNotExist(result_id)
            fields = dict(zip(names, row, strict=True))
            # Every attempt slotd remembers of the task (sql/030): the worker that ran it,
            # and the error of those the task's own code never got to record.
            ran = attempts(cur, fields["task_id"], schema=self.schema)
        return build(fields, ran)


class ReturnValueNotJSON(TypeError):
    """A task returned a value JSON cannot carry; its result is FAILED, not retried (the
    task's side effects have happened)."""


def _unimportable(path: str, error: BaseException, fields: dict[str, Any]) -> Task:
    """A stand-in Task for a path that no longer imports (a typo, a renamed or removed
    task, code not yet deployed on this host): get_result() still reads the record, and
    calling it raises the ImportError, which the worker records at once."""
    module, _, name = path.rpartition(".")

    def call(*args: Any, **kwargs: Any) -> Any:
        raise error

    call.__module__, call.__name__, call.__qualname__ = module, name, name
    call.slotd_import_error = error  # type: ignore[attr-defined]
    # Every field named: Django 6.0's Task has no defaults for them (6.1 has).
    return Task(func=call, **fields)


def import_error(task: Task) -> BaseException | None:
    """The ImportError behind a stand-in from _unimportable, else None."""
    return getattr(task.func, "slotd_import_error", None)


def load_task(path: str, fields: dict[str, Any]) -> Task:
    try:
        task = import_string(path)
    except ImportError as exc:  # import_string turns a missing attribute into one too
        error = ImportError(f"task {path} cannot be imported: {exc}")
        error.__cause__ = exc
        return _unimportable(path, error, fields)
    if not isinstance(task, Task):
        gone = ImportError(f"{path!r} is no longer a django.tasks Task")
        return _unimportable(path, gone, fields)
    return task


def _error(stored: dict[str, Any]) -> TaskError:
    return TaskError(
        exception_class_path=stored["exception_class_path"], traceback=stored["traceback"]
    )


def _lost(reason: str) -> TaskError:
    return TaskError(exception_class_path=ATTEMPT_FAILED_PATH, traceback=reason)


# An attempt's end that is not a failure: nothing for TaskResult.errors.
_CLEAN_ENDS = (None, "success", "continued", "snoozed", "suspended")


def errors_of(stored: list[dict[str, Any]], ran: Sequence[Attempt]) -> list[TaskError]:
    """TaskResult.errors, one per failed attempt, oldest first: the error the task's own
    code recorded for that attempt (its exception's class and traceback), else slotd's
    record of it (an AttemptFailed in the queue's words: killed at its deadline, its runner
    crashed, its lease lapsed, cancelled while it ran), else the error the next attempt
    found missing. Errors recorded before attempts had numbers come first, as they were."""
    own: dict[int, dict[str, Any]] = {}
    lost: dict[int, dict[str, Any]] = {}
    errors = []
    for err in stored:
        number = err.get("attempt")
        if number is None:
            errors.append(_error(err))
        elif err["exception_class_path"] == ATTEMPT_FAILED_PATH:
            lost.setdefault(number, err)
        else:
            own.setdefault(number, err)
    # An attempt slotd remembers with no worker is a lapse (its replica died or froze): the
    # queue never heard its end, but the task's code may have finished it (a success whose
    # settlement was lost is re-run, not failed). It is an error only where Django saw it
    # unfinished: the next delivery found it RUNNING (`lost`), or nothing came after it.
    newest = max((a.number for a in ran), default=0)
    remembered = {
        a.number: a
        for a in ran
        if a.outcome not in _CLEAN_ENDS
        and a.error
        and (a.worker is not None or a.number in lost or a.number == newest)
    }
    for number in sorted({*own, *lost, *remembered}):
        if number in own or number not in remembered:
            err = own.get(number) or lost[number]
            errors.append(_error(err))
        else:
            errors.append(_lost(remembered[number].error or ""))
    return errors


def worker_ids_of(stored: list[str], ran: Sequence[Attempt]) -> list[str]:
    """TaskResult.worker_ids: the worker of each attempt slotd remembers ("host:pid:slot",
    as slotd.result's attempts and `slotd result` show it). The result row's own list
    (host:pid of each start) when slotd remembers fewer runs than it counted: a result
    older than slotd's attempts table, a lapsed attempt slotd did not record, a running
    attempt whose replica has not reported it yet, a re-run of a settled attempt."""
    workers = [a.worker for a in ran if a.worker]
    return workers if len(workers) >= len(stored) else list(stored)


def build(row: dict[str, Any], ran: Sequence[Attempt] = ()) -> TaskResult:
    fields = {
        "backend": row["backend"],
        "queue_name": row["queue_name"],
        "priority": row["priority"],
        "run_after": row["run_after"],
    }
    task = dataclasses.replace(load_task(row["task_path"], fields), **fields)
    errors = errors_of(row["errors"], ran)
    status = TaskResultStatus(row["status"])
    if status != row["stored_status"] and status == FAILED:
        # Ended by the queue, not by the task's code: its reason, unless the last attempt's
        # own record says it already.
        last = next((a for a in reversed(ran) if a.outcome is not None), None)
        if last is None or last.outcome in _CLEAN_ENDS or not last.error:
            reason = row["queue_error"] or "its queue row is gone (a purged dead letter)"
            errors.append(_lost(reason))
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
        worker_ids=worker_ids_of(list(row["worker_ids"]), ran),
    )
    if status == SUCCESSFUL:
        object.__setattr__(result, "_return_value", row["return_value"])
    return result
