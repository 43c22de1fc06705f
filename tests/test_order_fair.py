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
from tests.daemon import Daemon, wait_for
from tests.order_fleet import two_replicas

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


class _Recording(Repository):
    """The repository, naming each statement it runs (the database runs them as ever)."""

    ran: list[str]

    def _write(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.ran.append(name)
        return super()._write(name, *args, **kwargs)


def test_a_fair_claim_rides_on_the_settlement_and_stamps_the_turn_in_it(
    conn: psycopg.Connection[Any],
) -> None:
    repo = _Recording(conn)
    repo.ran = []
    a = [slotd.enqueue(conn, "ord.fair", {}, group="a") for _ in range(2)]
    b = slotd.enqueue(conn, "ord.fair", {}, group="b")
    first = repo.claim(_discover(repo, ["ord.fair"]), _registry())
    assert first is not None and first.id == a[0]
    repo.ran.clear()
    # The settlement and the next claim in one statement (before: settle, then claim, two
    # transactions): b (never started) before a's second, its turn stamped by it.
    nxt = repo.dequeue_and_claim(first.id, first.token, _discover(repo, ["ord.fair"]), _registry())
    assert nxt is not None and nxt.id == b
    # (the _shared twin: this app declares a shared limit)
    assert [n.removesuffix("_shared") for n in repo.ran] == ["succeeded.plain+claim.fair"]
    turns = conn.execute(
        "SELECT task_group FROM slotd_turns WHERE task_type = 'ord.fair' ORDER BY started_at"
    ).fetchall()
    assert turns == [("a",), ("b",)]
    gone = conn.execute("SELECT count(*) FROM slotd_tasks WHERE id = %s", (a[0],)).fetchone()
    assert gone == (0,)


def test_a_one_task_group_starts_within_a_few_claims_after_200_of_another(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    two_replicas(conn, db_url, daemons)
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
