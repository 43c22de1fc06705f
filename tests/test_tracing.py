"""OpenTelemetry across the queue, through a real `slotd run` whose runners set up the SDK
after their fork (tests/apps/traced.py) and a producer process of its own
(tests/apps/traced_producer.py): each exports finished spans as JSON lines to a directory
the test reads. Skipped without opentelemetry-sdk; tests/test_without_otel.py covers the
other side."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("opentelemetry.sdk.trace")

import slotd  # noqa: E402
from tests.daemon import ROOT, Daemon, wait_for  # noqa: E402
from tests.test_runtime import start, task_row  # noqa: E402

APP = "tests.apps.traced:registry"


@pytest.fixture
def spans_dir(tmp_path: Path) -> Path:
    found = tmp_path / "spans"
    found.mkdir()
    return found


def produce(db_url: str, spans_dir: Path, task_type: str, n: int = 1) -> dict[str, Any]:
    """Enqueue from a producer process inside its "request" span."""
    env = {"PYTHONPATH": str(ROOT), "SLOTD_TEST_SPANS": str(spans_dir), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.apps.traced_producer", db_url, task_type, str(n)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def spans(spans_dir: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(spans_dir.glob("spans-*.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def named(spans_dir: Path, name: str, count: int = 1) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        found = [s for s in spans(spans_dir) if s["name"] == name]
        return found if len(found) >= count else None

    found = wait_for(ready, what=f"{count} exported {name!r} spans")
    return sorted(found, key=lambda s: s["attributes"].get("slotd.task.attempt", 0))


def hex_id(value: str) -> str:
    return value.removeprefix("0x")


def handler_span(conn: psycopg.Connection[Any], task_id: int) -> list[dict[str, str]]:
    def found() -> list[dict[str, str]] | None:
        rows = conn.execute(
            "SELECT note FROM executions WHERE task_id = %s AND phase = 'span' ORDER BY at",
            (task_id,),
        ).fetchall()
        return [json.loads(note) for (note,) in rows] or None

    return wait_for(found, what=f"task {task_id}'s handler")


def json_lines(daemon: Daemon, fragment: str) -> list[dict[str, Any]]:
    out = []
    for line in daemon.lines:
        if fragment in line and line.startswith("{"):
            out.append(json.loads(line))
    return out


def traced(daemons: list[Daemon], db_url: str, spans_dir: Path, **env: str) -> Daemon:
    settings = {"SLOTD_TEST_SPANS": str(spans_dir), "SLOTD_LOG_FORMAT": "json", **env}
    return start(daemons, db_url, slots=1, app=APP, env=settings)


def test_the_handlers_span_continues_the_producers_trace(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], spans_dir: Path
) -> None:
    daemon = traced(daemons, db_url, spans_dir)
    request = produce(db_url, spans_dir, "tr.current")
    (task_id,) = request["ids"]
    (seen,) = handler_span(qconn, task_id)
    assert seen["trace_id"] == request["trace_id"]

    (send,) = named(spans_dir, "send tr.current")
    (attempt,) = named(spans_dir, "process tr.current")
    assert send["kind"] == "SpanKind.PRODUCER" and attempt["kind"] == "SpanKind.CONSUMER"
    assert hex_id(send["context"]["trace_id"]) == request["trace_id"]
    assert hex_id(send["parent_id"]) == request["span_id"]  # the request's child
    assert hex_id(send["attributes"]["messaging.message.id"]) == str(task_id)
    # The attempt is the send's child, in the producer's trace, and is the handler's span.
    assert hex_id(attempt["context"]["trace_id"]) == request["trace_id"]
    assert hex_id(attempt["parent_id"]) == hex_id(send["context"]["span_id"])
    assert hex_id(attempt["context"]["span_id"]) == seen["span_id"]
    assert attempt["attributes"] == {
        "messaging.system": "slotd",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "tr.current",
        "messaging.message.id": str(task_id),
        "slotd.task.attempt": 1,
        "slotd.task.outcome": "success",
    }
    # slotd's own settlement line and the handler's ctx.log line join the trace.
    ids = {"trace_id": request["trace_id"], "span_id": seen["span_id"]}
    daemon.wait_line(rf"tr.current#{task_id} attempt 1: success")
    (settled,) = json_lines(daemon, f"tr.current#{task_id} attempt 1: success")
    (said,) = json_lines(daemon, "handler says hello")
    for line in (settled, said):
        assert {k: line.get(k) for k in ids} == ids, line


def test_a_retried_task_is_two_consumer_spans_in_the_producers_trace(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], spans_dir: Path
) -> None:
    traced(daemons, db_url, spans_dir)
    request = produce(db_url, spans_dir, "tr.flaky")
    (task_id,) = request["ids"]
    first, second = named(spans_dir, "process tr.flaky", count=2)
    wait_for(lambda: task_row(qconn, task_id) is None, what="the retry's success")
    for span in (first, second):
        assert span["kind"] == "SpanKind.CONSUMER"
        assert hex_id(span["context"]["trace_id"]) == request["trace_id"]
    assert first["attributes"]["slotd.task.attempt"] == 1
    assert first["attributes"]["slotd.task.outcome"] == "failure"
    assert first["attributes"]["error.type"] == "RuntimeError"
    assert first["status"]["status_code"] == "ERROR"
    (event,) = first["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.message"] == "first attempt fails"
    assert second["attributes"]["slotd.task.attempt"] == 2
    assert second["attributes"]["slotd.task.outcome"] == "success"
    assert second["status"]["status_code"] == "UNSET" and not second["events"]


def test_an_async_handler_runs_in_its_attempts_span(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], spans_dir: Path
) -> None:
    traced(daemons, db_url, spans_dir)
    request = produce(db_url, spans_dir, "tr.async_current")
    (task_id,) = request["ids"]
    (seen,) = handler_span(qconn, task_id)
    (attempt,) = named(spans_dir, "process tr.async_current")
    assert seen["trace_id"] == request["trace_id"]
    assert seen["span_id"] == hex_id(attempt["context"]["span_id"])


def test_a_runner_stopped_between_tasks_flushes_its_batched_spans(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], spans_dir: Path
) -> None:
    daemon = traced(daemons, db_url, spans_dir, SLOTD_TEST_SPANS_BATCH="1")
    request = produce(db_url, spans_dir, "tr.current")
    (task_id,) = request["ids"]
    daemon.wait_line(rf"tr.current#{task_id} attempt 1: success")
    # The processor holds the span for a minute; SIGTERM stops the idle runner politely.
    assert not [s for s in spans(spans_dir) if s["name"] == "process tr.current"]
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    (attempt,) = [s for s in spans(spans_dir) if s["name"] == "process tr.current"]
    assert hex_id(attempt["context"]["trace_id"]) == request["trace_id"]


def test_enqueue_stores_a_trace_context_only_under_an_active_span(
    qconn: psycopg.Connection[Any],
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    untraced = slotd.enqueue(qconn, "tr.current")
    # A tracer of a provider of its own: the global one stays unset in the test process.
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("request") as span:
        traced_id, other = slotd.enqueue_many(qconn, [("tr.current", {}), ("tr.flaky", {})])
    rows = dict(
        qconn.execute(
            "SELECT id, trace_context FROM slotd_tasks WHERE id = ANY(%s)",
            ([untraced, traced_id, other],),
        ).fetchall()
    )
    assert rows[untraced] is None
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert rows[traced_id] == rows[other]
    assert rows[traced_id]["traceparent"].split("-")[1] == trace_id


def test_enqueue_async_stores_the_trace_context_too(
    qconn: psycopg.Connection[Any], db_url: str
) -> None:
    import asyncio

    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")

    async def produce() -> tuple[int, str]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            with tracer.start_as_current_span("request") as span:
                task_id = await slotd.enqueue_async(aconn, "tr.current")
        return task_id, f"{span.get_span_context().trace_id:032x}"

    task_id, trace_id = asyncio.run(produce())
    (carrier,) = qconn.execute(
        "SELECT trace_context FROM slotd_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    assert carrier["traceparent"].split("-")[1] == trace_id
