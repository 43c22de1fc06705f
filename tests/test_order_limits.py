"""Shared limits (#39): registry.limit(name, max_running=, max_running_per_group=, rate=)
and @registry.handler(..., limits=[name]): fleet-wide across types, as exact as a type's
own limit (checked at the claim under the limit's lock). Statement-level and through real
`slotd run` replicas."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.registry import Registry
from slotd.repository import Repository
from tests.apps.order import RUNS
from tests.daemon import Daemon, wait_for
from tests.test_priority_limits import max_overlap

APP = "tests.apps.order:registry"


def _registry() -> Registry:
    from tests.apps.order import registry

    return registry


def _claim(repo: Repository, types: list[str]) -> Any:
    reg = _registry()
    ids = repo.discover(types, 20, reg.concurrency_limits, rates=reg.rates, shared=reg.shared_rows)
    return repo.claim(ids, reg) if ids else None


def test_a_shared_limit_holds_across_its_types_at_the_claim(
    conn: psycopg.Connection[Any],
) -> None:
    repo = Repository(conn)
    a = slotd.enqueue(conn, "ord.model_a", {})
    b = slotd.enqueue(conn, "ord.model_b", {})
    first = _claim(repo, ["ord.model_a", "ord.model_b"])
    assert first is not None and first.id == a
    # The discovery passes the other type over, and a claim naming it directly is refused.
    assert _claim(repo, ["ord.model_a", "ord.model_b"]) is None
    assert repo.claim([b], _registry()) is None
    repo.dequeue_linked(a, first.token, None, None) if first.linked else repo.dequeue(
        a, first.token
    )
    second = _claim(repo, ["ord.model_b"])
    assert second is not None and second.id == b


def test_a_shared_rate_counts_the_starts_of_every_type_under_it(
    conn: psycopg.Connection[Any],
) -> None:
    repo = Repository(conn)
    ids = [slotd.enqueue(conn, t, {}) for t in ("ord.rated_a", "ord.rated_b", "ord.rated_a")]
    got = [_claim(repo, ["ord.rated_a", "ord.rated_b"]) for _ in range(3)]
    assert [c.id if c else None for c in got] == [ids[0], ids[1], None]
    row = conn.execute(
        "SELECT last_seq, allowed FROM slotd_rate_windows WHERE task_type = '@burst'"
    ).fetchone()
    assert row == (2, 2)
    # The discovery says when the shared window has room again (no notification will).
    assert repo.wake_in_s is not None and 50 < repo.wake_in_s <= 60


def test_a_shared_limit_per_group(conn: psycopg.Connection[Any]) -> None:
    repo = Repository(conn)
    types = ["ord.grouped_a", "ord.grouped_b"]
    a = slotd.enqueue(conn, "ord.grouped_a", {}, group="t1")
    slotd.enqueue(conn, "ord.grouped_b", {}, group="t1")
    c = slotd.enqueue(conn, "ord.grouped_b", {}, group="t2")
    got = [_claim(repo, types) for _ in range(3)]
    assert [x.id if x else None for x in got] == [a, c, None]


def test_limits_must_be_declared_first() -> None:
    reg = slotd.Registry()
    with pytest.raises(ValueError, match="not declared"):
        reg.register("x", lambda t, c: None, ceiling=timedelta(seconds=1), limits=["nope"])
    with pytest.raises(ValueError, match="give max_running"):
        reg.limit("empty")
    reg.limit("one", max_running=1)
    with pytest.raises(ValueError, match="already declared"):
        reg.limit("one", max_running=2)


def test_a_shared_limit_of_one_across_two_types_is_never_exceeded_by_two_replicas(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    conn.execute(RUNS)
    for _ in range(2):
        daemons.append(Daemon(db_url, slots=3, app=APP).start())
    # Six slots ready, then the work: 30 tasks of the two types, their wakes at once.
    items = [("ord.model_a" if i % 2 else "ord.model_b", {"sleep": 0.05}) for i in range(30)]
    slotd.enqueue_many(conn, items)

    def done() -> bool:
        row = conn.execute("SELECT count(*) FROM order_runs WHERE ended_at IS NOT NULL").fetchone()
        return row is not None and row[0] == 30

    wait_for(done, timeout=60, what="30 runs")
    runs = conn.execute(
        "SELECT started_at, ended_at, task_type, pid FROM order_runs ORDER BY started_at"
    ).fetchall()
    assert max_overlap([(r[0], r[1]) for r in runs]) == 1
    assert {r[2] for r in runs} == {"ord.model_a", "ord.model_b"}
