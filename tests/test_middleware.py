"""Middleware around every attempt (registry.middleware), through a real `slotd run` and the
test modes: order, values, exceptions passing through, async middleware, registration."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.testing import eager
from tests.daemon import Daemon, wait_for
from tests.test_runtime import settled, start, task_row

# The deadline and cancel cases write their notes after the handler stopped: a kill grace
# long enough for that connection, under any load (the margin must exceed it).
ROOMY = {"SLOTD_LEASE_MARGIN": "15s", "SLOTD_KILL_GRACE": "10s"}
APP = "tests.apps.middleware:registry"


def chain(conn: psycopg.Connection[Any], task_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT note FROM executions WHERE task_id = %s AND phase = 'chain' ORDER BY at",
        (task_id,),
    ).fetchall()
    return [json.loads(note) for (note,) in rows]


def notes_of(conn: psycopg.Connection[Any], task_id: int) -> list[str]:
    found = wait_for(lambda: chain(conn, task_id), timeout=90, what=f"task {task_id}'s chain")
    return found[0]["notes"]


@pytest.fixture
def daemon(qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]) -> Daemon:
    return start(daemons, db_url, slots=1, app=APP, env=ROOMY)


def test_middleware_wraps_every_attempt_outermost_first_and_passes_the_value_back(
    qconn: psycopg.Connection[Any], daemon: Daemon
) -> None:
    task_id = slotd.enqueue(qconn, "mw.value", {"value": 42})
    notes = notes_of(qconn, task_id)
    handler = next(n for n in notes if n.startswith("handler"))
    # Registration order, outermost first; the async middleware leave a sync handler alone.
    assert notes == ["outer>", "inner>", handler, "inner<42", "outer<42"]
    wait_for(lambda: task_row(qconn, task_id) is None, what="the success")


def test_the_value_the_outermost_middleware_returns_is_the_attempts(
    qconn: psycopg.Connection[Any], daemon: Daemon
) -> None:
    task_id = slotd.enqueue(qconn, "mw.swallow")
    assert notes_of(qconn, task_id) == [
        "outer>",
        "inner>",
        "handler",
        "inner swallowed handler broke",
        "outer<None",
    ]
    daemon.wait_line(rf"mw.swallow#{task_id} attempt 1: success")
    assert task_row(qconn, task_id) is None


def test_a_raising_middleware_is_the_attempts_failure_never_the_slots(
    qconn: psycopg.Connection[Any], daemon: Daemon
) -> None:
    (runner,) = wait_for(lambda: daemon.titled("runner"), what="the runner")
    bad = slotd.enqueue(qconn, "mw.bad_mw")
    assert notes_of(qconn, bad) == ["outer>", "inner>", "outer!RuntimeError"]  # no handler
    row = wait_for(lambda: settled(qconn, bad), what="the failure")
    assert "RuntimeError: middleware broke" in row["last_error"]
    assert row["attempt_count"] == 1 and row["lease_token"] is None
    daemon.wait_line(rf"mw.bad_mw#{bad} attempt 1: failure")
    # The same runner takes the next task: no crash, no restart.
    after = slotd.enqueue(qconn, "mw.value")
    assert f"handler pid={runner.pid}" in notes_of(qconn, after)


def test_the_deadline_passes_through_every_middleware(
    qconn: psycopg.Connection[Any], daemon: Daemon
) -> None:
    task_id = slotd.enqueue(qconn, "mw.deadline", max_attempts=1)
    assert notes_of(qconn, task_id) == [
        "outer>",
        "inner>",
        "handler",
        "outer!DeadlineExceeded",
    ]
    daemon.wait_line(rf"mw.deadline#{task_id} attempt 1: timeout")


def test_a_cancel_passes_through_every_middleware(
    qconn: psycopg.Connection[Any], daemon: Daemon
) -> None:
    task_id = slotd.enqueue(qconn, "mw.cancel")
    wait_for(
        lambda: qconn.execute(
            "SELECT 1 FROM executions WHERE task_id = %s AND phase = 'start'", (task_id,)
        ).fetchone(),
        what="the handler to start",
    )
    slotd.cancel(qconn, task_id)
    assert notes_of(qconn, task_id) == ["outer>", "inner>", "handler", "outer!Cancelled"]
    daemon.wait_line(rf"mw.cancel#{task_id} attempt 1: cancelled")


def test_async_middleware_wraps_async_handlers_inside_the_plain_ones(
    qconn: psycopg.Connection[Any], daemon: Daemon
) -> None:
    task_id = slotd.enqueue(qconn, "mw.async_value", {"tenant": "acme"})
    assert notes_of(qconn, task_id) == [
        "outer>",
        "inner>",
        "async_outer>",
        "async_inner>",
        # A contextvar a plain middleware set outside the loop reaches the async handler.
        "handler tenant=acme",
        "async_inner<7",
        "async_outer<7",
        "inner<7",
        "outer<7",
    ]
    wait_for(lambda: task_row(qconn, task_id) is None, what="the success")


def test_the_test_modes_run_the_same_chain(
    qconn: psycopg.Connection[Any], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.apps import middleware as app

    monkeypatch.setenv("SLOTD_DATABASE_URL", db_url)  # where the app's notes go

    seen: list[list[str]] = []
    with qconn.transaction(), eager(app.registry, qconn) as runner:
        slotd.enqueue(qconn, "mw.swallow")
        seen.append(list(app.NOTES))
        slotd.enqueue(qconn, "mw.async_value", {"tenant": "t1"})
        seen.append(list(app.NOTES))
    assert seen[0][-2:] == ["inner swallowed handler broke", "outer<None"]
    assert "handler tenant=t1" in seen[1] and seen[1][-1] == "outer<7"
    assert [str(s.outcome) for _, s in runner.settlements] == ["success", "success"]


def noop(task: slotd.Task, ctx: slotd.Context, call_next: Any) -> Any:
    return call_next()


async def anoop(task: slotd.Task, ctx: slotd.Context, call_next: Any) -> Any:
    return await call_next()


def test_a_plain_middleware_after_an_async_one_is_refused_at_registration() -> None:
    registry = slotd.Registry()
    registry.middleware(noop)
    registry.middleware(anoop)
    with pytest.raises(ValueError, match="register plain def middleware before async def"):
        registry.middleware(noop)


@pytest.mark.parametrize("bad", [lambda task, ctx: None, "not callable"])
def test_a_middleware_that_cannot_take_task_ctx_call_next_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="middleware"):
        slotd.Registry().middleware(bad)


def test_middleware_added_after_a_handler_still_wraps_it(qconn: psycopg.Connection[Any]) -> None:
    registry = slotd.Registry()
    calls: list[str] = []
    registry.register("late", lambda task, ctx: calls.append("handler"), ceiling=timedelta(1))

    @registry.middleware
    def late(task: slotd.Task, ctx: slotd.Context, call_next: Any) -> Any:
        calls.append("middleware")
        return call_next()

    with qconn.transaction(), eager(registry, qconn):
        slotd.enqueue(qconn, "late")
    assert calls == ["middleware", "handler"]
