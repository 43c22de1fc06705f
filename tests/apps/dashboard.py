"""Handlers for the dashboard's browser tests: one that fails until its fix is "deployed"
(a file appears), one that runs until released, one whose error repeats its payload, one
that fails once then succeeds (its history kept), one that takes steps then waits for an
event, one that takes a step then sleeps durably."""

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


@registry.handler(
    "dash.twice",
    ceiling=timedelta(seconds=30),
    max_attempts=3,
    backoff_base=timedelta(milliseconds=10),
    backoff_cap=timedelta(milliseconds=20),
    keep_history=timedelta(hours=1),
)
def twice(task: slotd.Task, ctx: slotd.Context) -> None:
    """Fails its first attempt, succeeds its second: its page keeps both attempts."""
    if task.attempt == 1:
        raise ConnectionError(f"card gateway timed out for order {task.payload['order']}")


@registry.handler(
    "dash.again",
    ceiling=timedelta(seconds=60),
    max_attempts=2,
    backoff_base=timedelta(milliseconds=10),
    backoff_cap=timedelta(milliseconds=20),
)
def again(task: slotd.Task, ctx: slotd.Context) -> None:
    """Fails its first attempt; its second runs until released."""
    if task.attempt == 1:
        raise ValueError(f"first try of {task.id} fails")
    slow(task, ctx)


@registry.handler("dash.approve", ceiling=timedelta(seconds=30))
def approve(task: slotd.Task, ctx: slotd.Context) -> None:
    """Charges, reserves, then waits (an hour at most) for its approval event."""
    ctx.step("charge", lambda: {"charged": task.payload["amount"], "note": "x" * 300})
    ctx.step("reserve", lambda: ["shelf", 7])
    ctx.wait_event(f"approved:{task.payload['order']}", timeout=timedelta(hours=1))


@registry.handler("dash.nap", ceiling=timedelta(seconds=30))
def nap(task: slotd.Task, ctx: slotd.Context) -> None:
    """Takes a step, then sleeps durably for a day."""
    ctx.step("remind", lambda: True)
    ctx.sleep(timedelta(days=1))


# Its first fire is a week after the fleet first sees it: on the page, never in the way.
registry.schedule("weekly-digest", task_type="dash.digest", every=timedelta(days=7))
