"""The worker side: `slotd run --app slotd.contrib.django.worker:registry`.

`registry()` sets Django up (DJANGO_SETTINGS_MODULE from the environment) and returns a
slotd Registry with one handler per queue of every SlotdBackend in TASKS. The handler is
the only code that runs a Django task, whoever delivers it: the daemon's runner and the
test modes both reach it through slotd.processor, so the signals and the state rules
cannot differ between production and tests."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from datetime import timedelta
from typing import Any

import slotd
from slotd.config import default_schema
from slotd.errors import ConfigError
from slotd.registry import Registry

# Not imported here: Django's settings are not configured when `slotd run --app` imports
# this module; registry() sets Django up first. The layers below (backend, configured,
# results, database) import Django at module level.

log = logging.getLogger("slotd.django")

PRUNE_CHORE = "django_results_prune"
PRUNE_PERIOD = timedelta(hours=1)
# Each runner asks for the fleet-wide election at most this often; the election itself
# makes sure one replica prunes per PRUNE_PERIOD.
_PRUNE_ASK_EVERY_S = 300.0
_next_prune_ask = 0.0
# `manage.py slotd run --queue NAME`: the queues this worker serves (comma-separated; all
# when unset), like django-tasks' `db_worker --queue-name`.
QUEUES_ENV = "SLOTD_DJANGO_QUEUES"


def registry() -> Registry:
    """What `slotd run --app slotd.contrib.django.worker:registry` loads."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise ConfigError("set DJANGO_SETTINGS_MODULE to run Django tasks")
    import django

    django.setup()
    _one_voice_for_django_logs()
    from django.apps import apps
    from django.db import DatabaseError

    from slotd.contrib.django import configured, database

    if not apps.is_installed("slotd.contrib.django"):
        raise ConfigError(
            'add "slotd.contrib.django" to INSTALLED_APPS and run manage.py migrate: its '
            "migrations create the queue's tables"
        )

    reg = build_registry()
    # The database Django enqueues into is the one to drain: `slotd run` uses it unless
    # SLOTD_DATABASE_URL says otherwise (and then warns if the two differ).
    alias = configured.database_alias(configured.slotd_backends())
    try:
        configured.require_migrated(alias)
    except DatabaseError:
        pass  # a database that is down: `slotd run` says so, and waits for it
    reg.database_url = database.conninfo(alias)
    schema = configured.schema_of(alias)
    if schema != default_schema():
        # The daemon and every process under it read SLOTD_SCHEMA; `manage.py slotd run`
        # sets it from OPTIONS SCHEMA.
        raise ConfigError(
            f"the TASKS backends' OPTIONS SCHEMA is {schema!r} but SLOTD_SCHEMA is "
            f"{default_schema()!r}: run the worker with manage.py slotd run"
        )
    return reg


def _one_voice_for_django_logs() -> None:
    """With DEBUG = True, Django's default logging prints the "django" loggers' lines (the
    tasks' RUNNING / SUCCESSFUL / FAILED and their tracebacks) to stderr itself, and they
    reach slotd's own handler as well: every line twice. Where slotd's handler is there,
    Django's default console handler goes (a project's own LOGGING handlers stay)."""
    from django.utils.log import RequireDebugTrue

    if not logging.getLogger().handlers:
        return  # nobody else prints them
    django_log = logging.getLogger("django")
    for handler in list(django_log.handlers):
        default = handler.get_name() == "console" and any(
            isinstance(f, RequireDebugTrue) for f in handler.filters
        )
        if default:
            django_log.removeHandler(handler)


def build_registry() -> Registry:
    """One generic handler per configured queue. A queue served by two aliases shares one
    task type, so both must agree on its ceiling."""
    from slotd.contrib.django.configured import slotd_backends

    wanted = [q for q in os.environ.get(QUEUES_ENV, "").split(",") if q]
    reg = Registry()
    ceilings: dict[str, timedelta] = {}
    served: set[str] = set()
    for backend in slotd_backends():
        for config in backend.queue_configs():
            served.add(config.name)
            if wanted and config.name not in wanted:
                continue
            known = ceilings.get(config.task_type)
            if known is None:
                ceilings[config.task_type] = config.ceiling
                # keep_history: a success stays answerable (slotd.result, `slotd result`)
                # as long as the Django result, and its attempt is remembered with its
                # worker, which get_result's worker_ids read (slotd_attempts).
                reg.register(
                    config.task_type,
                    run_django_task,
                    ceiling=config.ceiling,
                    keep_history=backend.result_retention,
                )
            elif known != config.ceiling:
                raise ConfigError(
                    f"queue {config.name!r} has two ceilings ({known} and {config.ceiling}) "
                    "in two TASKS aliases; one task type can have only one"
                )
    unknown = sorted(set(wanted) - served)
    if unknown:
        raise ConfigError(
            f"--queue {unknown[0]!r} is not a queue of the slotd TASKS backends "
            f"(they have: {', '.join(sorted(served))})"
        )
    if not len(reg):
        raise ConfigError("no TASKS backend is slotd.contrib.django.SlotdBackend")
    return reg


def _worker_id() -> str:
    # The runner is forked from its slot: compute per process, not at import.
    return f"{socket.gethostname()}:{os.getpid()}"


def run_django_task(task: slotd.Task, ctx: slotd.Context) -> None:
    """Deliver one Django task: mark it started, call it, record how it ended.

    Raises what the task raised, so slotd retries it with backoff and dead-letters it at
    the attempt limit (its result then stays FAILED)."""
    from django.tasks import task_backends

    payload = json.loads(task.payload) if isinstance(task.payload, str) else task.payload
    backend = task_backends[payload["backend"]]
    _recycle_connections()
    try:
        _deliver(backend, payload["result_id"], ctx, attempt=task.attempt)
    finally:
        _maybe_prune(backend)
        _recycle_connections()


def _deliver(
    backend: Any, result_id: str, ctx: slotd.Context | None = None, *, attempt: int | None = None
) -> None:
    from django.tasks import TaskContext
    from django.tasks.signals import task_finished, task_started

    from slotd.contrib.django.results import (
        FAILED,
        SUCCESSFUL,
        ReturnValueNotJSON,
        import_error,
    )

    table = backend.results
    before = table.start(result_id, _worker_id(), attempt)
    if before is None:
        # Only retention deletes a result, long after its task finished.
        log.warning("django task result %s is gone; not running it again", result_id)
        return
    snapshot = table.get(result_id)
    sender = type(backend)
    task_started.send(sender=sender, task_result=snapshot)
    django_task = snapshot.task
    try:
        args = snapshot.args
        if django_task.takes_context:
            args = [TaskContext(task_result=snapshot), *args]
        value = _call(django_task, args, snapshot.kwargs, backend.database)
        value = _json_return(value, django_task.module_path)
    except BaseException as exc:
        # Another attempt would fail the same way (or repeat side effects that have
        # happened): FAILED now, and the queue row is done with.
        hopeless = exc is import_error(django_task) or isinstance(exc, ReturnValueNotJSON)
        # Released at shutdown, the attempt does not count: READY whatever the count.
        final = True if hopeless else (False if ctx is not None and ctx.shutting_down else None)
        prior, now = table.fail(result_id, exc, final=final, attempt=attempt)
        if now == FAILED and prior != SUCCESSFUL:
            # Once, at the end (Django's meaning of FAILED); sent inside the except block,
            # as Django's own backend does: receivers (its logger) see sys.exc_info().
            task_finished.send(sender=sender, task_result=table.get(result_id))
        if prior == SUCCESSFUL:
            return  # a failed re-run of a finished task: recorded, not retried
        if hopeless:
            log.error("django task %s: %s; FAILED, not retried", django_task.module_path, exc)
            return
        raise
    table.succeed(result_id, value)
    task_finished.send(sender=sender, task_result=table.get(result_id))


def _call(django_task: Any, args: Any, kwargs: Any, db: str) -> Any:
    """A coroutine task runs on the runner's own event loop (slotd.aio), kept for its life
    and cancelled at the deadline and at shutdown like any async handler; Task.call would
    run it on a fresh loop in another thread, where neither reaches it. Inside a caller's
    atomic block (the test modes) Task.call stays: its ORM calls come back to this thread's
    connection, the one that sees the caller's uncommitted rows."""
    from inspect import iscoroutinefunction

    from django.db import connections

    if iscoroutinefunction(django_task.func) and not connections[db].in_atomic_block:
        from slotd.runner import aio

        return aio.current().run(_acall(django_task, args, kwargs))
    return django_task.call(*args, **kwargs)


async def _acall(django_task: Any, args: Any, kwargs: Any) -> Any:
    from asgiref.sync import sync_to_async

    # The async ORM runs on asgiref's one sync thread: its connections are recycled there.
    await sync_to_async(_recycle_connections)()
    try:
        return await django_task.acall(*args, **kwargs)
    finally:
        await sync_to_async(_recycle_connections)()


def _json_return(value: Any, path: str) -> Any:
    from django.utils.json import normalize_json

    from slotd.contrib.django.results import ReturnValueNotJSON

    try:
        normalized = normalize_json(value)
        json.dumps(normalized, allow_nan=False)
    except (TypeError, ValueError) as exc:
        shown = repr(value)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise ReturnValueNotJSON(
            f"task {path} returned {shown} ({type(value).__name__}), which is not JSON: "
            f"return JSON-serializable data (str, int, float, bool, None, list, dict) ({exc})"
        ) from exc
    return normalized


def _recycle_connections() -> None:
    """What Django does around a request: drop connections that are broken or past
    CONN_MAX_AGE. Never inside an atomic block (a test's transaction): closing there
    would throw the caller's uncommitted work away."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def _maybe_prune(backend: Any) -> None:
    global _next_prune_ask
    now = time.monotonic()
    if now < _next_prune_ask:
        return
    _next_prune_ask = now + _PRUNE_ASK_EVERY_S
    from django.db import transaction

    from slotd import repository
    from slotd.contrib.django.database import cursor

    try:
        with transaction.atomic(using=backend.database), cursor(backend.database) as c:
            params = {"chore": PRUNE_CHORE, "period_s": PRUNE_PERIOD.total_seconds() * 0.95}
            found = repository.execute(c, "elect_chore", params, schema=backend.schema)
            elected = found.fetchone() is not None
        if elected:
            pruned = backend.results.prune(backend.result_retention)
            log.info("pruned %d django task results", pruned, extra={"pruned": pruned})
    except Exception:  # noqa: BLE001 - housekeeping never fails the task it follows
        log.exception("pruning django task results failed")
