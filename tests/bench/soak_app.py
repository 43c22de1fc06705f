"""The soak's application (tests/bench/soak.py): no-ops, tasks that fail once, tasks that
dead-letter, and a schedule firing every second. First attempts write their start latency
(handler start minus the producer's clock, in seconds) to $SLOTD_BENCH_OUT/lat-PID.txt,
through the benchmark app's per-runner file (never the database: the queue's own traffic
is what is measured)."""

from __future__ import annotations

import time
from datetime import timedelta

import slotd
from tests.bench.app import _note

registry = slotd.Registry()
CEILING = timedelta(seconds=30)
QUICK = timedelta(seconds=1)


def _started(task: slotd.Task) -> None:
    sent = task.payload.get("t")
    if sent is not None and task.attempt == 1:
        _note("lat", f"{time.time() - sent:.6f}")


@registry.handler("soak.work", ceiling=CEILING)
def work(task: slotd.Task, ctx: slotd.Context) -> None:
    _started(task)


@registry.handler("soak.flaky", ceiling=CEILING, backoff_base=QUICK, backoff_cap=QUICK)
def flaky(task: slotd.Task, ctx: slotd.Context) -> None:
    _started(task)
    if task.attempt == 1:
        raise RuntimeError("the soak's first attempts of soak.flaky fail")


@registry.handler(
    "soak.doomed", ceiling=CEILING, max_attempts=2, backoff_base=QUICK, backoff_cap=QUICK
)
def doomed(task: slotd.Task, ctx: slotd.Context) -> None:
    _started(task)
    raise RuntimeError("soak.doomed always fails: a dead letter after two attempts")


@registry.handler("soak.tick", ceiling=CEILING)
def tick(task: slotd.Task, ctx: slotd.Context) -> None:
    pass


registry.schedule("soak-tick", task_type="soak.tick", every=timedelta(seconds=1))
