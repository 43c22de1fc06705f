"""The pytest plugin's manual mode fires schedules deterministically: advance_time, then
fire_schedules, on an autocommit connection and inside a test transaction."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.outcome import Outcome
from slotd.testing import ManualQueue

registry = slotd.Registry()
runs: list[str] = []


@registry.handler("audit", ceiling=timedelta(minutes=1))
def audit(task: slotd.Task, ctx: slotd.Context) -> None:
    runs.append(task.payload["scope"])


registry.schedule("sweep", task_type="audit", every=timedelta(minutes=5), payload={"scope": "all"})
registry.schedule(
    "nightly", task_type="audit", cron="0 3 * * *", timezone="Europe/Berlin",
    payload={"scope": "night"}, overlap="allow",
)  # fmt: skip


@pytest.fixture(params=["autocommit", "transaction"])
def slotd_conn(request: pytest.FixtureRequest, db_url: str) -> Iterator[psycopg.Connection[Any]]:
    runs.clear()
    if request.param == "autocommit":
        with psycopg.connect(db_url, autocommit=True) as conn:
            yield conn
    else:
        with psycopg.connect(db_url) as conn, conn.transaction(force_rollback=True):
            yield conn


@pytest.fixture
def slotd_registry() -> slotd.Registry:
    return registry


def test_nothing_fires_until_time_is_advanced(task_queue: ManualQueue) -> None:
    assert task_queue.fire_schedules() == []
    assert task_queue.fire_schedules() == []


def test_advance_time_then_fire_schedules_enqueues_each_fire_time_once(
    task_queue: ManualQueue,
) -> None:
    task_queue.advance_time(timedelta(minutes=5))
    (task,) = task_queue.fire_schedules()
    assert task.type == "audit" and task.payload == {"scope": "all"}
    assert task.key is not None and task.key.startswith("schedule:sweep:")
    assert task_queue.fire_schedules() == []  # that fire time is done
    assert [s.outcome for s in task_queue.deliver_all()] == [Outcome.SUCCESS]
    assert runs == ["all"]


def test_a_day_of_schedules_follows_each_ones_rules(task_queue: ManualQueue) -> None:
    task_queue.fire_schedules()
    task_queue.advance_time(timedelta(days=1))
    fired = task_queue.fire_schedules()
    # The sweep's missed fire times: the latest one only (catch_up="latest"), plus the one
    # that fell due in the last LATE_GRACE if the wall clock is just past a 5-minute mark
    # (late, not missed: always enqueued); the nightly one fired once at 03:00 Berlin.
    sweeps = sorted(t.key for t in fired if t.payload["scope"] == "all" and t.key)
    assert sorted({t.payload["scope"] for t in fired}) == ["all", "night"]
    assert len([t for t in fired if t.payload["scope"] == "night"]) == 1
    times = [datetime.fromisoformat(k.split(":", 2)[2]) for k in sweeps]  # schedule:NAME:T
    assert len(times) in (1, 2), sweeps
    assert len(times) == 1 or times[1] - times[0] == timedelta(minutes=5), sweeps
    night = next(t for t in fired if t.payload["scope"] == "night")
    assert night.key is not None and night.key.endswith(("T02:00:00.000000Z", "T01:00:00.000000Z"))


def test_a_live_previous_task_folds_the_next_fire(task_queue: ManualQueue) -> None:
    # The sweep's tasks only: run between 02:45 and 03:00 Berlin, these 15 minutes also
    # cross the nightly schedule's fire time (it failed CI so, at 01:50 UTC).
    def sweeps() -> list[Any]:
        return [t for t in task_queue.fire_schedules() if t.payload["scope"] == "all"]

    task_queue.advance_time(timedelta(minutes=5))
    assert len(sweeps()) == 1
    task_queue.advance_time(timedelta(minutes=5))
    assert sweeps() == []  # the sweep's first task has not run yet
    task_queue.deliver_all()
    task_queue.advance_time(timedelta(minutes=5))
    assert len(sweeps()) == 1
