"""Handlers traced with the OpenTelemetry SDK, for tests/test_tracing.py. The tracer provider
is made in each runner after its fork (Registry.on_runner_start), as the README says to:
each process exports its finished spans as JSON lines to its own file under
$SLOTD_TEST_SPANS (one file per process, so lines of two processes never interleave).
SLOTD_TEST_SPANS_BATCH=1: a BatchSpanProcessor that would sit on its spans for a minute,
so only slotd's flush at the runner's exit gets them out."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from typing import Any

from opentelemetry import trace

import slotd
from tests.apps.runtime import _record

registry = slotd.Registry()


def span_file_exporter() -> Any:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    path = os.path.join(os.environ["SLOTD_TEST_SPANS"], f"spans-{os.getpid()}.jsonl")
    out = open(path, "a", buffering=1)  # noqa: SIM115 - the process's life
    return ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")


def install_provider(batch: bool = False) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider()
    exporter = span_file_exporter()
    if batch:
        processor: Any = BatchSpanProcessor(exporter, schedule_delay_millis=60_000)
    else:
        processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)


@registry.on_runner_start
def tracing() -> None:
    install_provider(batch=os.environ.get("SLOTD_TEST_SPANS_BATCH") == "1")


def _current() -> str:
    found = trace.get_current_span().get_span_context()
    return json.dumps({"trace_id": f"{found.trace_id:032x}", "span_id": f"{found.span_id:016x}"})


@registry.handler("tr.current", ceiling=timedelta(seconds=30))
def current(task: slotd.Task, ctx: slotd.Context) -> None:
    ctx.log.info("handler says hello")
    _record(task, "span", note=_current())


@registry.handler(
    "tr.flaky",
    ceiling=timedelta(seconds=30),
    backoff_base=timedelta(milliseconds=50),
    backoff_cap=timedelta(milliseconds=100),
)
def flaky(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "span", note=_current())
    if task.attempt == 1:
        raise RuntimeError("first attempt fails")


@registry.handler("tr.async_current", ceiling=timedelta(seconds=30))
async def async_current(task: slotd.Task, ctx: slotd.Context) -> None:
    await asyncio.sleep(0)
    _record(task, "span", note=_current())
