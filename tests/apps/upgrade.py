"""The upgrade test's application (tests/test_upgrade.py), run by replicas of the previous
release and of this checkout alike: so it uses only the API of the oldest release the test
runs. Each handler records its start and end in `executions`, on a connection of its own
kept for the runner's life, with the side (old or new release) that ran it."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import psycopg

import slotd

registry = slotd.Registry()
SIDE = os.environ.get("UPGRADE_SIDE", "?")
_conn: list[psycopg.Connection[Any]] = []


def _record(task: slotd.Task, phase: str) -> None:
    if not _conn or _conn[0].closed:
        _conn[:] = [psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True)]
    _conn[0].execute(
        "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (%s, %s, %s, %s, %s)",
        (task.id, task.attempt, phase, os.getpid(), SIDE),
    )


@registry.handler("up.work", ceiling=timedelta(seconds=30))
def work(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    until = time.monotonic() + task.payload.get("ms", 10) / 1000
    while time.monotonic() < until:
        ctx.check()  # a rollout's SIGTERM stops it here: another replica runs it again
        time.sleep(0.002)
    _record(task, "end")


@registry.handler("up.flaky", ceiling=timedelta(seconds=30))
def flaky(task: slotd.Task, ctx: slotd.Context) -> None:
    """Fails its first attempt: the failure path (backoff, attempt count) of either release
    writes the row the other may claim next."""
    _record(task, "start")
    if task.attempt == 1:
        raise RuntimeError("first attempts of up.flaky fail on purpose")
    _record(task, "end")


@registry.handler("up.tick", ceiling=timedelta(seconds=30))
def tick(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    _record(task, "end")


# Both releases' schedulers fire it, across the migration: once per fire time.
registry.schedule("up-tick", task_type="up.tick", every=timedelta(seconds=1))
