"""The example application: each handler reaches the outcome it is there to show, and the
producer writes committed rows the handlers accept."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import slotd
from slotd.examples import STUBBORN_CEILING, registry, sample
from slotd.outcome import Outcome
from slotd.testing import ManualQueue

BACKOFF_CAP = timedelta(minutes=10)


@pytest.fixture
def queue(conn: psycopg.Connection[Any]) -> ManualQueue:
    return ManualQueue(conn, registry)


def first_payload(task_type: str) -> tuple[dict[str, Any], int | None]:
    for n in range(100):
        found, payload, attempts = sample(n)
        if found == task_type:
            return payload, attempts
    raise AssertionError(f"the producer never makes {task_type}")


def test_plain_succeeds(queue: ManualQueue, conn: psycopg.Connection[Any]) -> None:
    payload, _ = first_payload("example.plain")
    slotd.enqueue(conn, "example.plain", payload)
    assert [s.outcome for s in queue.deliver_all()] == [Outcome.SUCCESS]
    assert queue.pending() == []


def test_flaky_fails_then_succeeds_after_its_backoff(
    queue: ManualQueue, conn: psycopg.Connection[Any]
) -> None:
    payload, _ = first_payload("example.flaky")
    slotd.enqueue(conn, "example.flaky", payload)
    assert [s.outcome for s in queue.deliver_all()] == [Outcome.FAILURE]
    [waiting] = queue.pending()
    assert waiting.run_at > datetime.now(UTC)  # backing off, not retried at once
    queue.advance_time(BACKOFF_CAP)
    assert [s.outcome for s in queue.deliver_all()] == [Outcome.SUCCESS]
    assert queue.dead() == []


def test_sliced_advances_its_cursor_page_by_page(
    queue: ManualQueue, conn: psycopg.Connection[Any]
) -> None:
    payload, _ = first_payload("example.sliced")
    slotd.enqueue(conn, "example.sliced", {**payload, "pause_ms": 0})
    first = queue.deliver_next()
    assert first is not None and first.outcome is Outcome.CONTINUED
    assert [t.payload["page"] for t in queue.pending()] == [1]
    rest = [s.outcome for s in queue.deliver_all()]
    assert rest == [Outcome.CONTINUED] * (payload["pages"] - 2) + [Outcome.SUCCESS]
    assert queue.pending() == []


def test_stubborn_has_a_short_ceiling_and_ignores_its_context() -> None:
    handler = registry.get("example.stubborn")
    assert handler is not None and handler.ceiling == STUBBORN_CEILING
    assert handler.ceiling <= timedelta(seconds=5)
    _, attempts = first_payload("example.stubborn")
    assert attempts == 2
    # Past its deadline and told to stop, it returns normally instead of raising.
    task = slotd.Task(1, "example.stubborn", {"seconds": 0}, 1, None, datetime.now(UTC))
    past = datetime.now(UTC) - timedelta(seconds=1)
    ctx = slotd.Context(task, past, lambda payload: True, lambda: True)
    assert ctx.cancelled
    assert handler.fn(task, ctx) is None


@pytest.fixture
def cli_env(db_url: str) -> Iterator[dict[str, str]]:
    yield {"SLOTD_DATABASE_URL": db_url, "DATABASE_URL": ""}


def test_produce_enqueues_count_committed_rows(
    cli_env: dict[str, str], conn: psycopg.Connection[Any]
) -> None:
    from slotd.cli import main

    result = CliRunner().invoke(
        main, ["examples", "produce", "--count", "25", "--rate", "1000/s"], env=cli_env
    )
    assert result.exit_code == 0, result.output
    rows = conn.execute("SELECT task_type, payload, max_attempts FROM slotd_tasks").fetchall()
    assert len(rows) == 25
    types = {row[0] for row in rows}
    assert types == {"example.plain", "example.flaky", "example.sliced", "example.stubborn"}
    assert all(t in registry for t in types)
    assert [r[2] for r in rows if r[0] == "example.stubborn"] == [2]
    assert result.output.count("enqueued example.") == 25


def test_produce_one_type_only(cli_env: dict[str, str], conn: psycopg.Connection[Any]) -> None:
    from slotd.cli import main

    args = ["examples", "produce", "--count", "3", "--rate", "1000/s", "--type", "example.sliced"]
    result = CliRunner().invoke(main, args, env=cli_env)
    assert result.exit_code == 0, result.output
    rows = conn.execute("SELECT DISTINCT task_type FROM slotd_tasks").fetchall()
    assert rows == [("example.sliced",)]


@pytest.mark.parametrize(
    "args",
    [["--rate", "fast"], ["--rate", "0/s"], ["--count", "0"], ["--type", "example.nope"]],
)
def test_produce_rejects_bad_usage(cli_env: dict[str, str], args: list[str]) -> None:
    from slotd.cli import main

    result = CliRunner().invoke(main, ["examples", "produce", *args], env=cli_env)
    assert result.exit_code == 2


def test_rates_are_written_per_second_minute_or_hour() -> None:
    from slotd.commands.examples import parse_rate

    assert parse_rate(None, None, "2/s") == 2
    assert parse_rate(None, None, "30/m") == 0.5
    assert parse_rate(None, None, "7200/h") == 2
    assert parse_rate(None, None, "0.5") == 0.5
