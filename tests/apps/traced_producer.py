"""A producer process with the OpenTelemetry SDK: `python -m tests.apps.traced_producer URL
TYPE [N]` enqueues N tasks (one enqueue_many) inside a "request" span and prints
{"trace_id", "span_id", "ids"} of that span. Its own process, as an application's would be:
a tracer provider is global and set once per process, so not in the test's."""

from __future__ import annotations

import json
import sys

import psycopg
from opentelemetry import trace

import slotd
from tests.apps.traced import install_provider


def main() -> None:
    url, task_type, *rest = sys.argv[1:]
    install_provider()
    tracer = trace.get_tracer("tests.producer")
    with (
        tracer.start_as_current_span("request") as span,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        ids = slotd.enqueue_many(
            conn, [(task_type, {}) for _ in range(int(rest[0]) if rest else 1)]
        )
    found = span.get_span_context()
    print(
        json.dumps(
            {"trace_id": f"{found.trace_id:032x}", "span_id": f"{found.span_id:016x}", "ids": ids}
        )
    )


if __name__ == "__main__":
    main()
