"""Fair turns (#39): @registry.handler(..., fair=True) makes a type's groups take turns for
its slots, the group that started least recently first, so one group's backlog delays
another group's task by about one claim per slot. Statement-level and through real
`slotd run` replicas."""

from __future__ import annotations

from typing import Any

import psycopg

import slotd
from slotd.registry import Registry
from slotd.repository import Repository
from tests.apps.order import RUNS
from tests.daemon import Daemon, wait_for

APP = "tests.apps.order:registry"


def _registry() -> Registry:
    from tests.apps.order import registry

    return registry


def _discover(repo: Repository, types: list[str]) -> list[int]:
    reg = _registry()
    return repo.discover(types, 20, reg.concurrency_limits, rates=reg.rates, fair=reg.fair_types)


def test_groups_take_turns_the_least_recently_started_first(conn: psycopg.Connection[Any]) -> None:
    repo = Repository(conn)
    a = [slotd.enqueue(conn, "ord.fair", {}, group="a") for _ in range(5)]
    b = slotd.enqueue(conn, "ord.fair", {}, group="b")
    plain = slotd.enqueue(conn, "ord.step", {})
    found = _discover(repo, ["ord.fair", "ord.step"])
    # Each group's first task before any group's second; the other type merged in by time.
    assert found[:3] == [a[0], b, a[1]] and set(found) == {*a, b, plain}
    first = repo.claim(found, _registry())
    assert first is not None and first.id == a[0]
    turn = conn.execute("SELECT task_group FROM slotd_turns WHERE task_type = 'ord.fair'")
    assert turn.fetchall() == [("a",)]
    # a started last: b (never started) comes first now, before a's second.
    assert _discover(repo, ["ord.fair"])[:2] == [b, a[1]]
    second = repo.claim(_discover(repo, ["ord.fair"]), _registry())
    assert second is not None and second.id == b
    # Now b started after a: a's second goes first.
    c = slotd.enqueue(conn, "ord.fair", {}, group="c")
    assert _discover(repo, ["ord.fair"])[:3] == [c, a[1], a[2]]


def test_a_one_task_group_starts_within_a_few_claims_after_200_of_another(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    conn.execute(RUNS)
    for _ in range(2):
        daemons.append(Daemon(db_url, slots=3, app=APP).start())
    slotd.enqueue_many(
        conn, [slotd.NewTask("ord.fair", {"sleep": 0.05}, group="big") for _ in range(200)]
    )
    wait_for(
        lambda: conn.execute("SELECT count(*) FROM order_runs").fetchone()[0] >= 12,  # type: ignore[index]
        what="the big group to be running",
    )
    small = slotd.enqueue(conn, "ord.fair", {"sleep": 0.05}, group="small")
    enqueued = conn.execute("SELECT created_at FROM slotd_tasks WHERE id = %s", (small,))
    at = enqueued.fetchone()[0]  # type: ignore[index]
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM order_runs WHERE task_id = %s", (small,)).fetchone()[
                0
            ]
            == 1
        ),
        what="the small group's task",
    )  # type: ignore[index]
    row = conn.execute(
        "SELECT count(*) FROM order_runs WHERE started_at > %s AND started_at <"
        " (SELECT started_at FROM order_runs WHERE task_id = %s)",
        (at, small),
    ).fetchone()
    assert row is not None
    # Six slots: at most about one claim each went to the big group before it.
    assert row[0] <= 7, f"{row[0]} of the big group's tasks started first"
    remaining = conn.execute("SELECT count(*) FROM slotd_tasks WHERE task_type = 'ord.fair'")
    assert remaining.fetchone()[0] > 50  # type: ignore[index]  # long before the backlog drained
