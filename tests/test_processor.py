"""The processor step in one process: done / continue / error and what each writes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.outcome import Outcome
from slotd.registry import Registry
from slotd.repository import Claimed, Repository
from slotd.runner.processor import process

MINUTE = timedelta(minutes=1)


def run_one(repo: Repository, reg: Registry, **kw: Any) -> tuple[Claimed, Any]:
    claimed = repo.claim(repo.discover(reg.types), reg)
    assert claimed is not None
    return claimed, process(repo, reg, claimed, **kw)


def fetch(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any] | None:
    cur = conn.execute("SELECT * FROM slotd_tasks WHERE id = %s", (task_id,))
    found = cur.fetchone()
    return dict(zip([c.name for c in cur.description], found, strict=True)) if found else None


def test_done_deletes_the_row(conn: psycopg.Connection[Any], repo: Repository) -> None:
    reg = Registry()
    seen: list[Any] = []
    reg.register("plain", lambda task, ctx: seen.append(task.payload), ceiling=MINUTE)
    task_id = slotd.enqueue(conn, "plain", {"a": 1})
    _, settled = run_one(repo, reg)
    assert settled.outcome is Outcome.SUCCESS
    assert seen == [{"a": 1}]
    assert fetch(conn, task_id) is None


def test_error_records_failure_with_backoff(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = Registry()

    def boom(task: slotd.Task, ctx: slotd.Context) -> None:
        raise RuntimeError("storage unavailable")

    reg.register("boom", boom, ceiling=MINUTE)
    task_id = slotd.enqueue(conn, "boom")
    _, settled = run_one(repo, reg)
    assert settled.outcome is Outcome.FAILURE
    row = fetch(conn, task_id)
    assert "RuntimeError: storage unavailable" in row["last_error"]
    # The stored traceback starts at the handler, not at five of slotd's own frames.
    first_frame = row["last_error"].splitlines()[1]
    assert first_frame.startswith(f'  File "{__file__}", line '), row["last_error"]
    assert first_frame.endswith(", in boom")
    assert row["lease_token"] is None
    assert repo.discover(reg.types) == []  # backed off, not due


def test_sliced_handler_advances_then_continues(
    conn: psycopg.Connection[Any], repo: Repository, caplog: pytest.LogCaptureFixture
) -> None:
    reg = Registry()

    def sliced(task: slotd.Task, ctx: slotd.Context) -> bool:
        cursor = task.payload["cursor"]
        if cursor >= 3:
            return True
        ctx.advance_cursor({"cursor": cursor + 1})
        return False

    reg.register("sliced", sliced, ceiling=MINUTE)
    task_id = slotd.enqueue(conn, "sliced", {"cursor": 0})
    outcomes = [run_one(repo, reg)[1].outcome for _ in range(4)]
    assert outcomes == [Outcome.CONTINUED] * 3 + [Outcome.SUCCESS]
    assert fetch(conn, task_id) is None
    assert "advanced nothing" not in caplog.text


def test_continue_without_advancing_is_backed_off_and_warned(
    conn: psycopg.Connection[Any], repo: Repository, caplog: pytest.LogCaptureFixture
) -> None:
    reg = Registry()
    reg.register("stuck", lambda task, ctx: False, ceiling=MINUTE)
    task_id = slotd.enqueue(conn, "stuck")
    _, settled = run_one(repo, reg)
    assert settled.outcome is Outcome.CONTINUED
    assert "advanced nothing; backed off" in caplog.text
    row = fetch(conn, task_id)
    assert row["lease_token"] is None and row["attempt_count"] == 1
    assert repo.discover(reg.types) == []  # not due again at once: it cannot spin


def test_refused_cursor_must_end_as_lost(conn: psycopg.Connection[Any], repo: Repository) -> None:
    reg = Registry()

    def taken_over(task: slotd.Task, ctx: slotd.Context) -> bool:
        conn.execute("UPDATE slotd_tasks SET lease_token = gen_random_uuid()")
        ctx.advance_cursor({"cursor": 1})  # raises LeaseLost
        return False

    reg.register("sliced", taken_over, ceiling=MINUTE)
    task_id = slotd.enqueue(conn, "sliced", {"cursor": 0})
    _, settled = run_one(repo, reg)
    assert settled.outcome is Outcome.LOST
    assert fetch(conn, task_id)["payload"] == {"cursor": 0}


def test_deadline_past_at_claim_is_a_timeout_without_running(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    reg = Registry()
    ran: list[int] = []
    reg.register("slow_claim", lambda task, ctx: ran.append(1), ceiling=timedelta(seconds=1))
    task_id = slotd.enqueue(conn, "slow_claim")
    # A margin longer than the lease puts the deadline before the claim returned.
    repo = Repository(conn, lease_margin=timedelta(seconds=2))
    claimed = repo.claim(repo.discover(reg.types), reg)
    repo = Repository(conn, lease_margin=timedelta(seconds=10))
    settled = process(repo, reg, claimed)
    assert settled.outcome is Outcome.TIMEOUT and settled.duration is None
    assert ran == []
    assert fetch(conn, task_id)["lease_token"] is None


def test_error_at_the_deadline_is_a_timeout(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = Registry()

    def late(task: slotd.Task, ctx: slotd.Context) -> None:
        conn.execute("UPDATE slotd_tasks SET lease_expires_at = now() + interval '29 seconds'")
        ctx.deadline = ctx.deadline - timedelta(minutes=2)
        ctx.check()

    reg.register("late", late, ceiling=MINUTE)
    slotd.enqueue(conn, "late")
    _, settled = run_one(repo, reg)
    assert settled.outcome is Outcome.TIMEOUT


def test_shutdown_cancel_releases_without_refund(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = Registry()

    def polite(task: slotd.Task, ctx: slotd.Context) -> None:
        ctx.check()

    reg.register("polite", polite, ceiling=MINUTE)
    task_id = slotd.enqueue(conn, "polite")
    _, settled = run_one(repo, reg, is_cancelled=lambda: True)
    assert settled.outcome is Outcome.CANCELLED
    row = fetch(conn, task_id)
    assert row["lease_token"] is None and row["attempt_count"] == 1
    assert repo.discover(reg.types) == [task_id]  # picked up again at once, not backed off


def test_async_handler_is_awaited_in_process(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    import asyncio

    reg = Registry()
    seen: list[Any] = []

    async def fetch_it(task: slotd.Task, ctx: slotd.Context) -> bool:
        await asyncio.sleep(0)
        seen.append(task.payload)
        cursor = task.payload.get("page", 0)
        if cursor < 1:
            await ctx.advance_cursor_async({"page": cursor + 1})
            return False
        return True

    reg.register("afetch", fetch_it, ceiling=MINUTE)
    task_id = slotd.enqueue(conn, "afetch", {"page": 0})
    _, first = run_one(repo, reg)
    assert first.outcome is Outcome.CONTINUED

    async def inside_a_loop() -> tuple[Claimed, Any]:
        return run_one(repo, reg)

    # Called from code that already runs a loop (an async test): still awaited.
    _, second = asyncio.run(inside_a_loop())
    assert second.outcome is Outcome.SUCCESS
    assert seen == [{"page": 0}, {"page": 1}]
    assert fetch(conn, task_id) is None


def test_sync_handler_returning_a_coroutine_fails(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = Registry()

    async def real(task: slotd.Task, ctx: slotd.Context) -> None:
        raise AssertionError("never awaited")

    reg.register("wrapped", lambda task, ctx: real(task, ctx), ceiling=MINUTE)
    task_id = slotd.enqueue(conn, "wrapped")
    _, settled = run_one(repo, reg)
    assert settled.outcome is Outcome.FAILURE
    error = fetch(conn, task_id)["last_error"]
    assert "handler returned a coroutine: declare it async def" in error
