"""Handlers for the dashboard's browser tests: one that fails until its fix is "deployed"
(a file appears), one that runs until released, one whose error repeats its payload."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import slotd

registry = slotd.Registry()


@registry.handler("dash.flaky", ceiling=timedelta(seconds=30))
def flaky(task: slotd.Task, ctx: slotd.Context) -> None:
    if not os.path.exists(task.payload["fixed"]):
        raise ValueError(f"org {task.payload.get('org')} not fixed yet")


@registry.handler("dash.slow", ceiling=timedelta(seconds=60))
def slow(task: slotd.Task, ctx: slotd.Context) -> None:
    while not os.path.exists(task.payload["release"]) and not ctx.cancelled:
        time.sleep(0.05)  # the handler's own wait, not a test's synchronisation
    ctx.check()  # stopped (a cancel, the shutdown): says so instead of returning as done


@registry.handler("dash.echo", ceiling=timedelta(seconds=30))
def echo(task: slotd.Task, ctx: slotd.Context) -> None:
    raise RuntimeError(task.payload["note"])


@registry.handler("dash.digest", ceiling=timedelta(seconds=30))
def digest(task: slotd.Task, ctx: slotd.Context) -> None:
    pass


# Its first fire is a week after the fleet first sees it: on the page, never in the way.
registry.schedule("weekly-digest", task_type="dash.digest", every=timedelta(days=7))
