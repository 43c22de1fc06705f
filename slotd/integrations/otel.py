"""OpenTelemetry across the queue (`pip install 'slotd[otel]'`: the API only; the SDK and
the exporter are the application's choice). Imported only when opentelemetry-api is
importable (slotd.integrations), so nothing here costs anything without it.

- Producer: an enqueue under an active span runs in a PRODUCER span "send <task type>" and
  stores that span's context with the rows, through the globally configured propagator
  (W3C trace context by default). No active span: no span, nothing stored.
- Consumer: each attempt runs in a CONSUMER span "process <task type>" whose parent is the
  stored context, so retries and slices of one task stay in the producer's trace, with the
  messaging conventions' attributes, the attempt and its outcome, the error recorded on a
  failure. It is slotd's own middleware (slotd.middleware), outermost of the chain. With no
  tracer provider configured in the process it steps aside at once (call_next, no span)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    SpanKind,
    Status,
    StatusCode,
)

from slotd.errors import Cancelled, DeadlineExceeded

if TYPE_CHECKING:
    from slotd.repository import NewTask
    from slotd.task import Context, Task

SYSTEM = "slotd"
# No provider set (only the API's proxy) or an explicit no-op: nobody records a span.
_NOBODY = (ProxyTracerProvider, NoOpTracerProvider)
_tracers: dict[int, tuple[trace.TracerProvider, trace.Tracer]] = {}
# The API names its provider at run time from this variable, on the first public look-up.
_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_real: trace.TracerProvider | None = None


def _provider() -> trace.TracerProvider | None:
    """The process's tracer provider, None while nobody set one: on every attempt, so
    cheap. trace.get_tracer_provider() reads os.environ on each call while none is set
    (a third of the runner's cost per task with the API installed and no SDK, the usual
    case where a web framework brings the API in), so the API's own global is read
    first, and the public call made only once it is set (or the environment names one);
    a provider once set is set for good (the API refuses to replace it), so it is kept."""
    global _real
    if _real is not None:
        return _real
    if getattr(trace, "_TRACER_PROVIDER", True) is None and not _FROM_ENV:
        return None
    found = trace.get_tracer_provider()
    if isinstance(found, _NOBODY):
        return None
    _real = found
    return found


def _tracer(provider: trace.TracerProvider) -> trace.Tracer:
    # An SDK provider makes a new Tracer per get_tracer call: one per provider is enough.
    found = _tracers.get(id(provider))
    if found is None or found[0] is not provider:
        from slotd import __version__

        found = _tracers[id(provider)] = (provider, provider.get_tracer("slotd", __version__))
    return found[1]


class Send:
    """The PRODUCER span of one enqueue call, and the context the rows carry."""

    def __init__(self, span: trace.Span, carrier: str | None) -> None:
        self.span = span
        self.context = carrier  # JSON for the trace_context column; None: nothing to carry

    def sent(self, ids: Sequence[int]) -> None:
        if len(ids) == 1:
            self.span.set_attribute("messaging.message.id", str(ids[0]))


@contextmanager
def sending(rows: Sequence[NewTask]) -> Iterator[Send | None]:
    """None when no span is active: the enqueue then stores no context and makes no span."""
    if not trace.get_current_span().get_span_context().is_valid:
        yield None
        return
    types = {row.task_type for row in rows}
    one = next(iter(types)) if len(types) == 1 else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    if isinstance(one, str):
        attributes["messaging.destination.name"] = one
    if len(rows) > 1:
        attributes["messaging.batch.message_count"] = len(rows)
    name = f"send {one}" if isinstance(one, str) else "send"
    tracer = _tracer(trace.get_tracer_provider())
    with tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield Send(span, json.dumps(carrier, separators=(",", ":")) if carrier else None)


def middleware() -> tuple[Callable[..., Any], ...]:
    """slotd.integrations asks before every attempt: without a provider there is nobody to
    record a span, and the attempt runs with no tracing in its chain at all."""
    return () if _provider() is None else (attempt,)


def attempt(task: Task, ctx: Context, call_next: Callable[[], Any]) -> Any:
    """slotd's middleware: the attempt's CONSUMER span, continuing the stored context."""
    provider = _provider()
    if provider is None:
        return call_next()
    # Without a stored context the attempt starts a trace of its own: the ambient context
    # (a test's span around task_queue.deliver_next) is not the producer's.
    parent = propagate.extract(task.trace_context) if task.trace_context else otel_context.Context()
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": task.type,
        "messaging.message.id": str(task.id),
        "slotd.task.attempt": task.attempt,
    }
    if task.key is not None:
        attributes["slotd.task.key"] = task.key
    span = _tracer(provider).start_span(
        f"process {task.type}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    )
    token = otel_context.attach(trace.set_span_in_context(span))
    found = span.get_span_context()
    if found.is_valid:
        ctx.add_log_fields(
            trace_id=format(found.trace_id, "032x"), span_id=format(found.span_id, "016x")
        )
    outcome = "failure"
    try:
        returned = call_next()
    except Cancelled as exc:
        outcome = "cancelled"  # shutdown or an operator's cancel: not the task's error
        span.record_exception(exc)
        raise
    except BaseException as exc:
        shutdown = isinstance(exc, KeyboardInterrupt) and ctx.shutting_down
        late = isinstance(exc, DeadlineExceeded) or ctx.remaining() <= 0
        outcome = "cancelled" if shutdown else "timeout" if late else "failure"
        _failed(span, exc)
        raise
    else:
        if returned is False:  # a continue at the deadline is settled as a timeout
            outcome = "timeout" if ctx.remaining() <= 0 else "continued"
        else:
            outcome = "success"
        return returned
    finally:
        span.set_attribute("slotd.task.outcome", outcome)
        otel_context.detach(token)
        span.end()


def _failed(span: trace.Span, exc: BaseException) -> None:
    kind = type(exc)
    span.record_exception(exc)
    span.set_attribute(
        "error.type",
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}",
    )
    span.set_status(Status(StatusCode.ERROR, f"{kind.__name__}: {exc}"[:1000]))


def flush(timeout: float) -> None:
    """Export what the provider still buffers (a BatchSpanProcessor's queue) before the
    runner ends: it ends with os._exit, which runs no atexit handler."""
    force = getattr(_provider(), "force_flush", None)
    if force is not None:
        try:
            force(int(timeout * 1000))
        except Exception:  # noqa: BLE001 - an exporter's failure must not keep the runner
            pass
