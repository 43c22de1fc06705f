"""Handlers for the rate tests (tests/test_rates_daemon.py): each records its run in `runs`
like tests/apps/limits.py."""

from __future__ import annotations

from datetime import timedelta

import slotd
from tests.apps.limits import _run

registry = slotd.Registry()


@registry.handler("rate.four", ceiling=timedelta(seconds=2), rate=(4, timedelta(seconds=2)))
def four(task: slotd.Task, ctx: slotd.Context) -> None:
    _run(task, ctx, float(task.payload.get("sleep", 0.01)))


@registry.handler(
    "rate.group", ceiling=timedelta(seconds=2), rate_per_group=(1, timedelta(seconds=1))
)
def per_group(task: slotd.Task, ctx: slotd.Context) -> None:
    _run(task, ctx, float(task.payload.get("sleep", 0.01)))
