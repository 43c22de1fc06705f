"""The application the adapter's `slotd run` serves: one handler, `bench.job`.

It runs in slotd's runner processes (grandchildren of the adapter). It measures pickup
latency (handler start minus the producer's wall clock at enqueue, as the harness's other
adapters do) and appends one line per finished run to a per-runner ledger file:

    <task id> <attempt> <pickup latency in microseconds>

A write(2) on an O_APPEND descriptor reaches the page cache before the handler returns, so a
SIGKILL of any process in the replica never loses a line; the adapter's sampler tails these
files for the JSONL samples and ../audit.py reads them to check that nothing was lost and
nothing ran twice. Files, not the database: the handler never adds a statement to the
traffic being measured, and a database outage never turns into a handler failure."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import slotd

registry = slotd.Registry()

_WORK_S = int(os.environ.get("JOB_WORK_MS", "1")) / 1000.0
_ledger: dict[int, int] = {}  # pid -> descriptor; a runner forked from a runner opens its own


def ledger_dir() -> str:
    return os.environ["SLOTD_BENCH_LEDGER"]


def _ledger_fd() -> int:
    pid = os.getpid()
    fd = _ledger.get(pid)
    if fd is None:
        instance = os.environ.get("BENCH_INSTANCE_ID", "0")
        path = os.path.join(ledger_dir(), f"done-{instance}-{pid}.txt")
        fd = _ledger[pid] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return fd


@registry.handler("bench.job", ceiling=timedelta(seconds=30))
def bench_job(task: slotd.Task, ctx: slotd.Context) -> None:
    sent = task.payload.get("t")
    latency_us = max(0, round((time.time() - sent) * 1e6)) if sent is not None else 0
    if _WORK_S:
        time.sleep(_WORK_S)
    os.write(_ledger_fd(), f"{task.id} {task.attempt} {latency_us}\n".encode())
