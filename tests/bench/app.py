"""The benchmark's application: what `slotd run --app tests.bench.app:registry` serves.

Handlers write their observations to files under $SLOTD_BENCH_OUT (one per runner process,
line-buffered), never to the database: the queue's own traffic is what is being counted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from datetime import timedelta
from typing import IO

import slotd

registry = slotd.Registry()
_files: dict[str, IO[str]] = {}


def _note(kind: str, line: str) -> None:
    out = os.environ.get("SLOTD_BENCH_OUT")
    if not out:
        return
    f = _files.get(kind)
    if f is None:
        # Kept open for the runner's life: one open() per task would be the cost measured.
        path = os.path.join(out, f"{kind}-{os.getpid()}.txt")
        f = _files[kind] = open(path, "a", buffering=1)  # noqa: SIM115
    f.write(line + "\n")


@registry.handler("bench.noop", ceiling=timedelta(seconds=30))
def noop(task: slotd.Task, ctx: slotd.Context) -> None:
    sent = task.payload.get("t")
    if sent is not None:  # latency probe: handler start minus the producer's clock
        _note("lat", f"{time.time() - sent:.6f}")


@registry.handler("bench.stuck", ceiling=timedelta(seconds=1))
def stuck(task: slotd.Task, ctx: slotd.Context) -> None:
    # Dodges the deadline interrupt, so only the watchdog's kill can end it.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    _note("stuck", json.dumps({"pid": os.getpid(), "deadline": ctx.deadline.timestamp()}))
    time.sleep(3600)


@registry.handler("bench.mark", ceiling=timedelta(seconds=30))
def mark(task: slotd.Task, ctx: slotd.Context) -> None:
    _note("mark", f"{time.time():.6f} {os.getpid()}")


@registry.handler("bench.async_noop", ceiling=timedelta(seconds=30))
async def async_noop(task: slotd.Task, ctx: slotd.Context) -> None:
    """bench.noop as an async def: the cost of the runner's event loop per task."""


def _deadline_line(task: slotd.Task, ctx: slotd.Context) -> None:
    # On the daemon's stderr, which tests.daemon.Daemon reads line by line.
    print(f"deadline {task.id} {ctx.deadline.timestamp():.6f}", file=sys.stderr, flush=True)


@registry.handler("bench.sleep", ceiling=timedelta(seconds=1))
def sleep(task: slotd.Task, ctx: slotd.Context) -> None:
    _deadline_line(task, ctx)
    time.sleep(3600)  # interrupted in its frame at the deadline


@registry.handler("bench.async_sleep", ceiling=timedelta(seconds=1))
async def async_sleep(task: slotd.Task, ctx: slotd.Context) -> None:
    _deadline_line(task, ctx)
    await asyncio.sleep(3600)  # its task cancelled at the deadline


if os.environ.get("SLOTD_BENCH_TRACING") == "1":
    # Imported here, in the supervisor, so the runners forked from it have the SDK already
    # (the README's advice: import at module level, set up after the fork).
    from opentelemetry.sdk.trace.export import SpanExporter


@registry.on_runner_start
def _tracing() -> None:
    """SLOTD_BENCH_TRACING=1 (cpu_per_task.py's "+otel" kinds): the SDK in every runner, a
    BatchSpanProcessor to an exporter that drops the spans, so what is measured is slotd's
    tracing and the SDK's span handling, not a network."""
    if os.environ.get("SLOTD_BENCH_TRACING") != "1":
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


@registry.handler("bench.keep", ceiling=timedelta(seconds=30), keep_result=timedelta(hours=1))
def keep(task: slotd.Task, ctx: slotd.Context) -> dict[str, int]:
    """bench.noop with a stored result (keep_result): the cost of the result store."""
    return {"id": task.id}


@registry.handler("bench.link", ceiling=timedelta(seconds=30))
def link(task: slotd.Task, ctx: slotd.Context) -> None:
    """A link of a chain of dependants: its run_at is the moment its parent's settlement
    made it due (the database's now() in that statement); the handler's start, minus that,
    is the chain's hand-over latency."""
    _note("link", f"{time.time() - task.run_at.timestamp():.6f}")
