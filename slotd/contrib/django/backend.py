"""`django.tasks` backend: a Django task is a slotd row written on Django's own connection.

TASKS = {
    "default": {
        "BACKEND": "slotd.contrib.django.SlotdBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "CEILING": "10m",            # per-attempt deadline, the lease derives from it
            "MAX_ATTEMPTS": 3,           # then the task is a dead letter, its result FAILED
            "QUEUE_OPTIONS": {"emails": {"CEILING": "1m", "MAX_ATTEMPTS": 5}},
            "DATABASE": "default",       # the Django database alias holding slotd's tables
            "RESULT_RETENTION": "7d",    # finished results older than this are pruned
            "SCHEMA": "jobs",            # slotd's tables (default: SLOTD_SCHEMA, else public)
        },
    }
}
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from difflib import get_close_matches
from typing import Any

import psycopg
from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.json import normalize_json

import slotd
from slotd import db, repository
from slotd.config import default_schema, parse_duration, validate_schema
from slotd.contrib.django.database import cursor
from slotd.contrib.django.results import Results
from slotd.errors import ConfigError, SchemaNotMigrated
from slotd.producer.enqueue import hooks_held, test_mode_active
from slotd.registry import TYPE_NAME

TYPE_PREFIX = "django."
DEFAULT_CEILING = timedelta(minutes=10)
DEFAULT_RETENTION = timedelta(days=7)
# A task that raises is retried twice (after ~15 s and ~30 s) and then FAILED. Django's own
# backends never retry and django-tasks-db marks a raised task FAILED at once; slotd keeps
# a little of its durability (a crashed worker or a transient error is retried) without
# leaving a failing task READY for hours. MAX_ATTEMPTS: 1 gives Django's own semantics.
DEFAULT_MAX_ATTEMPTS = 3
_OPTIONS_ATTR = "slotd_options"


def task_options(*, max_attempts: int | None = None) -> Callable[[Any], Any]:
    """Per-task slotd options, beside (below or above) Django's ``@task``::

        @task(queue_name="emails")
        @task_options(max_attempts=5)
        def send_receipt(order_id): ...

    ``max_attempts`` wins over the queue's MAX_ATTEMPTS. The ceiling is the queue's (it is
    the lease of the queue's task type): give a long task a queue of its own."""
    if max_attempts is not None and (
        not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
    ):
        raise ValueError(f"task_options(max_attempts={max_attempts!r}): a whole number >= 1")

    def mark(target: Any) -> Any:
        func = target.func if isinstance(target, Task) else target
        setattr(func, _OPTIONS_ATTR, {"max_attempts": max_attempts})
        return target

    return mark


def _task_max_attempts(task: Task) -> int | None:
    options: dict[str, Any] = getattr(task.func, _OPTIONS_ATTR, {})
    return options.get("max_attempts")


@dataclass(frozen=True)
class QueueConfig:
    """What the worker registers for one Django queue."""

    name: str
    task_type: str
    ceiling: timedelta
    max_attempts: int


# QUEUES: [] is Django's "any queue name": every queue not named in QUEUE_OPTIONS shares
# this one slotd task type (a queue's type is TYPE_PREFIX + its name, which never has a
# colon after "django"), so one worker drains them all.
ANY_QUEUE = "*"
ANY_QUEUE_TYPE = "django:any"
# What OPTIONS may say, and what each QUEUE_OPTIONS entry may: a misspelt key would
# otherwise be a silently ignored setting (a CEILNG that leaves the 10-minute ceiling).
OPTION_KEYS = ("CEILING", "MAX_ATTEMPTS", "QUEUE_OPTIONS", "DATABASE", "RESULT_RETENTION", "SCHEMA")
QUEUE_OPTION_KEYS = ("CEILING", "MAX_ATTEMPTS")


def task_type_for(queue_name: str) -> str:
    return f"{TYPE_PREFIX}{queue_name}"


def _unknown_keys(given: Any, known: tuple[str, ...], where: str) -> None:
    if not isinstance(given, dict):
        raise ConfigError(f"{where} must be a dict, not {type(given).__name__}")
    for key in given:
        if key in known:
            continue
        near = get_close_matches(str(key).upper(), known, n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{where} has an unknown key {key!r}{hint}; known: {', '.join(known)}")


class SlotdBackend(BaseTaskBackend):
    # run_after becomes the row's run_at, which discovery already orders by.
    supports_defer = True
    # The worker calls Task.call(), which runs coroutine functions to completion.
    supports_async_task = True
    # Results live in slotd_django_results, readable from any process.
    supports_get_result = True
    # Django's -100..100 is slotd's priority as is: a head start of priority x
    # SLOTD_PRIORITY_STEP, so urgent work goes first without starving the rest.
    supports_priority = True
    # MAX_ATTEMPTS when OPTIONS does not say (testing.EagerBackend runs a task once).
    default_max_attempts = DEFAULT_MAX_ATTEMPTS

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("DATABASE", "default")

    # configuration

    def queue_configs(self) -> list[QueueConfig]:
        """One slotd task type per declared queue; with QUEUES [] (any name), one per queue
        in QUEUE_OPTIONS and ANY_QUEUE's for the rest. Raises ConfigError on bad OPTIONS."""
        _unknown_keys(self.options, OPTION_KEYS, "OPTIONS")
        per_queue: dict[str, dict[str, Any]] = self.options.get("QUEUE_OPTIONS", {})
        if not isinstance(per_queue, dict):
            raise ConfigError(f"QUEUE_OPTIONS must be a dict, not {type(per_queue).__name__}")
        for name, own in per_queue.items():
            _unknown_keys(own, QUEUE_OPTION_KEYS, f"QUEUE_OPTIONS[{name!r}]")
        unknown = sorted(set(per_queue) - self.queues) if self.queues else []
        if unknown:
            raise ConfigError(f"QUEUE_OPTIONS names queues not in QUEUES: {unknown}")
        names = sorted(self.queues) if self.queues else [*sorted(per_queue), ANY_QUEUE]
        configs = []
        for name in names:
            own = {**self.options, **per_queue.get(name, {})}
            ceiling = parse_duration(own.get("CEILING", DEFAULT_CEILING), name="CEILING")
            if ceiling <= timedelta(0):
                raise ConfigError(f"queue {name!r}: CEILING must be positive")
            attempts = own.get("MAX_ATTEMPTS", self.default_max_attempts)
            if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
                raise ConfigError(f"queue {name!r}: MAX_ATTEMPTS must be a whole number >= 1")
            task_type = ANY_QUEUE_TYPE if name == ANY_QUEUE else task_type_for(name)
            configs.append(QueueConfig(name, task_type, ceiling, attempts))
        return configs

    def queue_config(self, queue_name: str) -> QueueConfig:
        configs = self.queue_configs()
        for config in configs:
            if config.name == queue_name:
                return config
        if not self.queues:
            return next(config for config in configs if config.name == ANY_QUEUE)
        raise InvalidTask(f"Queue '{queue_name}' is not valid for backend.")

    @property
    def schema(self) -> str:
        """The schema holding slotd's objects (`manage.py migrate` creates it), the one the
        worker drains: OPTIONS SCHEMA, else SLOTD_SCHEMA, else public."""
        if "SCHEMA" in self.options:
            return validate_schema(self.options["SCHEMA"], source="OPTIONS SCHEMA")
        return default_schema()

    @property
    def results(self) -> Results:
        """This backend's results table: its own database and schema, nothing else's."""
        return Results(self.database, self.schema)

    @property
    def result_retention(self) -> timedelta:
        raw = self.options.get("RESULT_RETENTION", DEFAULT_RETENTION)
        return parse_duration(raw, name="RESULT_RETENTION")

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = []

        def error(msg: str, hint: str | None = None) -> None:
            errors.append(checks.Error(msg, hint=hint, obj=f"TASKS[{self.alias!r}]"))

        if not apps.is_installed("slotd.contrib.django"):
            error(
                "slotd.contrib.django is not in INSTALLED_APPS: its migration creates the "
                "queue's tables (without it, enqueue fails: relation slotd_tasks does not exist)",
                hint='Add "slotd.contrib.django" to INSTALLED_APPS and run manage.py migrate.',
            )
        per_queue = self.options.get("QUEUE_OPTIONS", {})
        for name in sorted(self.queues or (per_queue if isinstance(per_queue, dict) else ())):
            if not TYPE_NAME.match(task_type_for(name)):
                error(
                    f"queue name {name!r} cannot be a slotd task type",
                    hint="Use lower case letters, digits and _ . : - (at most 120 characters).",
                )
        try:
            self.queue_configs()
            _ = self.result_retention
            _ = self.schema
        except ConfigError as exc:
            error(str(exc))
        if self.database not in settings.DATABASES:
            error(f"OPTIONS DATABASE {self.database!r} is not in DATABASES")
        elif connections[self.database].vendor != "postgresql":
            error(f"DATABASES[{self.database!r}] must be PostgreSQL (psycopg 3)")
        return errors

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if self.queues and not TYPE_NAME.match(task_type_for(task.queue_name)):
            raise InvalidTask(
                f"Queue '{task.queue_name}' cannot be a slotd task type: use lower case "
                "letters, digits and _ . : -"
            )

    # the producer side

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Write the queue row and the result row in the caller's transaction on Django's
        connection: inside `transaction.atomic()` they commit or roll back with the business
        write; in autocommit mode they commit together, at once."""
        return self.write(task, args, kwargs)[0]

    def write(self, task: Task, args: Any, kwargs: Any) -> tuple[TaskResult, int]:
        """enqueue(), and the id of the slotd task that delivers the result."""
        self.validate_task(task)
        # Django's own rule (JSON round trip) applied before anything is written.
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        json.dumps([args, kwargs], allow_nan=False)
        config = self.queue_config(task.queue_name)
        result_id = str(uuid.uuid4())
        run_after = _aware(task.run_after)
        delay = max((run_after - timezone.now()).total_seconds(), 0.0) if run_after else None
        payload = {
            "result_id": result_id,
            "backend": self.alias,
            "task": task.module_path,
            "args": args,
            "kwargs": kwargs,
            "takes_context": task.takes_context,
        }
        attempts = _task_max_attempts(task) or config.max_attempts
        with (
            transaction.atomic(using=self.database),
            cursor(self.database) as cur,
            # Eager mode (slotd.testing) runs the task once its result row exists too.
            hooks_held(),
            _schema_hint(self.database),
        ):
            task_id = slotd.enqueue(
                cur,
                config.task_type,
                payload,
                delay=delay,
                max_attempts=attempts,
                priority=task.priority,
                schema=self.schema,
            )
            if run_after is not None:
                params = {"id": task_id, "run_at": run_after}
                repository.execute(cur, "django_defer", params, schema=self.schema)
            enqueued_at = self.results.insert(
                cur,
                id=result_id,
                task_id=task_id,
                backend=self.alias,
                queue_name=task.queue_name,
                task_path=task.module_path,
                priority=task.priority,
                takes_context=task.takes_context,
                run_after=run_after,
                args=json.dumps(args),
                kwargs=json.dumps(kwargs),
            )
        result = TaskResult(
            task=task,
            id=result_id,
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        if test_mode_active():
            # Eager mode ran the task when the block above ended: return it as it is now
            # (finished), as Django's ImmediateBackend does, not the READY of before.
            result = self.get_result(result_id)
        # The signal says the task exists: not before, and never for a rolled-back one.
        transaction.on_commit(
            lambda: task_enqueued.send(type(self), task_result=result),
            using=self.database,
            robust=True,
        )
        return result, task_id

    def get_result(self, result_id: str) -> TaskResult:
        return self.results.get(result_id)


@contextmanager
def _schema_hint(alias: str) -> Iterator[None]:
    try:
        yield
    except (psycopg.errors.UndefinedTable, SchemaNotMigrated) as exc:
        # slotd.enqueue says "run slotd migrate"; here the fix is Django's own command.
        cause = exc.__cause__ if isinstance(exc, SchemaNotMigrated) and exc.__cause__ else exc
        raise ImproperlyConfigured(
            f"slotd's tables are missing from database {alias!r} ({db.first_line(cause)}): add "
            '"slotd.contrib.django" to INSTALLED_APPS and run manage.py migrate'
        ) from exc


def _aware(value: datetime | None) -> datetime | None:
    if value is None or timezone.is_aware(value):
        return value
    return timezone.make_aware(value)
