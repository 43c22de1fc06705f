"""A registry with schedules for the daemon tests, declared from $SLOTD_TEST_SCHEDULES (a JSON
list of Registry.schedule keyword arguments, `every` in seconds). The handler records each
run, with the task's run_at (its fire time) in `note`, in the runtime tests' executions table."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import slotd
from tests.apps.runtime import _record

registry = slotd.Registry()


@registry.handler("sched.record", ceiling=timedelta(seconds=30))
def record(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start", note=task.run_at.isoformat())
    time.sleep(float(os.environ.get("SLOTD_TEST_HANDLER_SECONDS", "0")))
    _record(task, "end", note=task.run_at.isoformat())


for spec in json.loads(os.environ.get("SLOTD_TEST_SCHEDULES", "[]")):
    if "every" in spec:
        spec["every"] = timedelta(seconds=spec["every"])
    registry.schedule(spec.pop("name"), task_type="sched.record", **spec)
