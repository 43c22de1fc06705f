"""Django tests without a worker: `EagerBackend`, slotd's answer to Django's ImmediateBackend.

In the test settings::

    TASKS = {"default": {"BACKEND": "slotd.contrib.django.testing.EagerBackend"}}

`enqueue()` writes the queue row and the result row as SlotdBackend does (in the caller's
transaction), then claims, runs and settles that task at once on the same connection,
through the worker's own handler and slotd's eager mode (slotd.testing.eager), and returns
the finished result, as ImmediateBackend does. It needs no pytest and works under Django's
own test runner. A task runs once (MAX_ATTEMPTS 1, unless OPTIONS says otherwise): a failure
is FAILED at once; with more attempts, a failure is READY with its error and the retry is
not run (eager mode runs nothing that is not due). A `run_after` in the future is not run
either: it stays READY, as the queue would keep it.

Above the backend and the worker's handler; nothing below imports it."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.tasks import Task, TaskResult

from slotd.config import Settings
from slotd.contrib.django.backend import SlotdBackend
from slotd.contrib.django.database import cursor, raw_connection
from slotd.repository import Repository
from slotd.testing.eager import Eager


class EagerBackend(SlotdBackend):
    """A SlotdBackend whose `enqueue` runs the task before returning (see the module)."""

    default_max_attempts = 1

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        from slotd.contrib.django.worker import build_registry

        result, task_id = self.write(task, args, kwargs)
        # Inside one atomic block: the handler's own transactions nest in it as savepoints
        # and its connection recycling leaves this connection alone while the run uses it.
        with transaction.atomic(using=self.database), cursor(self.database) as cur:
            repo = Repository.from_settings(Settings(), raw_connection(self.database))
            runner = Eager(build_registry(), repo)
            runner(cur, [task_id], self.schema)
        for _task, settlement in runner.settlements:
            # ImmediateBackend lets the user's Ctrl-C through rather than record it.
            if isinstance(settlement.exception, KeyboardInterrupt):
                raise settlement.exception
        return self.get_result(result.id)
