-- Trace context across the queue (#27): the W3C trace context (the propagator's carrier,
-- e.g. {"traceparent": "00-...", "tracestate": "..."}) of the span that was current at
-- enqueue, so each attempt's span continues the producer's trace. NULL when no span was
-- active (or opentelemetry-api is not installed): nothing is stored then. Nullable without a
-- default: a catalog-only change, instant on a big table; replicas of the previous release
-- neither write nor read it.
ALTER TABLE slotd_tasks ADD COLUMN trace_context jsonb;
