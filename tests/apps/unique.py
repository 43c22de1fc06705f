"""A handler for the uniqueness-by-state tests: it records its start and end (with the
payload's `n`) in the runtime tests' executions table and holds its place until the file
named by the payload's `release` exists."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import slotd
from tests.apps.runtime import _record

registry = slotd.Registry()


@registry.handler("uniq.sync", ceiling=timedelta(seconds=60))
def sync(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start", note=f"{task.key}#{task.payload.get('n')}")
    while not os.path.exists(task.payload["release"]) and not ctx.cancelled:
        time.sleep(0.02)  # the handler's own wait, not a test's synchronisation
    _record(task, "end", note=f"{task.key}#{task.payload.get('n')}")
