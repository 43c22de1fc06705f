"""A small application to watch slotd work: `slotd run --app slotd.examples:registry` in one
terminal, `slotd examples produce` in another.

Each handler shows one case of the design:

- ``example.plain``: a plain task that succeeds in a few tens of milliseconds.
- ``example.flaky``: fails on its first attempt(s), then succeeds: watch the backoff (15 s
  by default, SLOTD_BACKOFF_BASE) between the failure and the retry in the log.
- ``example.sliced``: works through pages one slice at a time, committing its cursor with
  ``ctx.advance_cursor`` and returning False until the last page: long work in bounded,
  resumable steps.
- ``example.stubborn``: ignores its context and sleeps far past its 5 s ceiling, so the
  watchdog has to kill it (outcome ``timeout``); produced with two attempts so it becomes
  a dead letter soon (`slotd dead list`).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import slotd

registry = slotd.Registry()

STUBBORN_CEILING = timedelta(seconds=5)
STUBBORN_ATTEMPTS = 2  # each attempt holds a slot for the ceiling plus the kill grace


@registry.handler("example.plain", ceiling=timedelta(seconds=30))
def plain(task: slotd.Task, ctx: slotd.Context) -> None:
    time.sleep(task.payload.get("work_ms", 20) / 1000)


@registry.handler("example.flaky", ceiling=timedelta(seconds=30))
def flaky(task: slotd.Task, ctx: slotd.Context) -> None:
    time.sleep(task.payload.get("work_ms", 20) / 1000)
    failing = task.payload.get("fail_attempts", 1)
    if task.attempt <= failing:
        raise ConnectionError(
            f"example.flaky: attempt {task.attempt} of {failing + 1} fails on purpose"
        )


@registry.handler("example.sliced", ceiling=timedelta(seconds=30))
def sliced(task: slotd.Task, ctx: slotd.Context) -> bool:
    page, pages = task.payload.get("page", 0), task.payload.get("pages", 5)
    time.sleep(task.payload.get("pause_ms", 150) / 1000)  # "processing" the page, visibly
    ctx.check()  # a cooperative handler stops at shutdown or its deadline
    if page + 1 >= pages:
        return True
    ctx.log.info("example.sliced: page %s of %s done", page + 1, pages)
    ctx.advance_cursor({**task.payload, "page": page + 1})
    return False


@registry.handler("example.stubborn", ceiling=STUBBORN_CEILING)
def stubborn(task: slotd.Task, ctx: slotd.Context) -> None:
    # Deliberately never looks at ctx: neither cancellation nor the deadline stops it.
    time.sleep(task.payload.get("seconds", 60))


def sample(n: int) -> tuple[str, dict[str, Any], int | None]:
    """The n-th task of the producer's steady mix: (type, payload, max_attempts or None).

    Mostly plain work, some flaky and sliced tasks, and one stubborn task in 60 (the first
    early, so it shows within seconds): stubborn tasks each hold a slot for over ten
    seconds, and more of them would starve the rest."""
    if n % 60 == 10:
        return "example.stubborn", {"n": n, "seconds": 60}, STUBBORN_ATTEMPTS
    step = n % 10
    if step in (3, 7):
        return "example.flaky", {"n": n, "fail_attempts": 1, "work_ms": 20}, None
    if step == 5:
        return "example.sliced", {"n": n, "page": 0, "pages": 5, "pause_ms": 150}, None
    return "example.plain", {"n": n, "work_ms": 20}, None
