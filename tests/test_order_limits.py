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
from tests.daemon import Daemon, wait_for
from tests.order_fleet import runs_ended, two_replicas
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


def _burst_claim(repo: Repository) -> Any:
    reg = _registry()
    ids = repo.discover(["ord.burst"], 20, reg.concurrency_limits, bursts=reg.group_bursts)
    return repo.claim(ids, reg) if ids else None


def test_a_group_bursts_above_its_cap_only_while_no_other_group_waits(
    conn: psycopg.Connection[Any],
) -> None:
    """max_running_per_group=1, group_burst=2: a group alone runs up to three; once another
    group has a due task, the cap holds again for every new start (the ones running go
    on), and that group's task is discovered and claimed first."""
    repo = Repository(conn)
    a = [slotd.enqueue(conn, "ord.burst", {}, group="a") for _ in range(4)]
    got = [_burst_claim(repo) for _ in range(4)]
    assert [c.id if c else None for c in got] == [a[0], a[1], a[2], None]  # 1 + a burst of 2
    b = slotd.enqueue(conn, "ord.burst", {}, group="b")
    first, *_ = got
    assert first is not None
    repo.dequeue(first.id, first.token)  # a runs 2 now: above its cap, b waits
    assert repo.discover(["ord.burst"], 20, _registry().concurrency_limits,
                         bursts=_registry().group_bursts) == [b]  # fmt: skip
    assert repo.claim([a[3]], _registry()) is None  # named directly: refused at the claim
    taken = _burst_claim(repo)
    assert taken is not None and taken.id == b
    # b is running, so nobody waits: a's fourth may burst again (a runs 2 of its 3).
    fourth = _burst_claim(repo)
    assert fourth is not None and fourth.id == a[3]
    # Without a burst the cap is the cap (another registry's view of the same rows).
    strict = slotd.Registry()
    strict.register("ord.burst", lambda t, c: None, ceiling=timedelta(seconds=10),
                    max_running_per_group=1)  # fmt: skip
    more = slotd.enqueue(conn, "ord.burst", {}, group="b")
    assert repo.claim([more], strict) is None


def test_a_registry_whose_only_rare_limit_is_a_burst_bursts(
    conn: psycopg.Connection[Any],
) -> None:
    """The burst rides the statements' `_shared` twins (SHARED_PARTS): a registry with a
    burst and no shared limit must run them too (the plain ones say closed)."""
    reg = slotd.Registry()
    reg.register("solo.burst", lambda t, c: None, ceiling=timedelta(seconds=10),
                 max_running_per_group=1, group_burst=1)  # fmt: skip
    repo = Repository(conn)
    ids = [slotd.enqueue(conn, "solo.burst", {}, group="a") for _ in range(3)]

    def claim() -> Any:
        found = repo.discover(["solo.burst"], 20, reg.concurrency_limits, bursts=reg.group_bursts)
        return repo.claim(found, reg) if found else None

    got = [claim() for _ in range(3)]
    assert [c.id if c else None for c in got] == [ids[0], ids[1], None]


def test_a_burst_needs_a_per_group_cap() -> None:
    reg = slotd.Registry()
    with pytest.raises(ValueError, match="group_burst needs max_running_per_group"):
        reg.register("x.y", lambda t, c: None, ceiling=timedelta(seconds=1), group_burst=1)
    with pytest.raises(ValueError, match="group_burst must be a whole number"):
        reg.register("x.z", lambda t, c: None, ceiling=timedelta(seconds=1),
                     max_running_per_group=1, group_burst=-1)  # fmt: skip


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
    two_replicas(conn, db_url, daemons)
    # Six slots ready, then the work: 30 tasks of the two types, their wakes at once.
    items = [("ord.model_a" if i % 2 else "ord.model_b", {"sleep": 0.05}) for i in range(30)]
    slotd.enqueue_many(conn, items)

    wait_for(lambda: runs_ended(conn) == 30, timeout=60, what="30 runs")
    runs = conn.execute(
        "SELECT started_at, ended_at, task_type, pid FROM order_runs ORDER BY started_at"
    ).fetchall()
    assert max_overlap([(r[0], r[1]) for r in runs]) == 1
    assert {r[2] for r in runs} == {"ord.model_a", "ord.model_b"}


def test_a_group_alone_bursts_to_its_cap_plus_burst_across_two_replicas_never_more(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    two_replicas(conn, db_url, daemons)
    # Six slots for one group's 12 tasks: its cap (1) plus its burst (2), never more.
    slotd.enqueue_many(conn, [slotd.NewTask("ord.burst", {"sleep": 0.3}, group="a")] * 12)

    wait_for(lambda: runs_ended(conn) == 12, timeout=60, what="12 runs")
    runs = conn.execute("SELECT started_at, ended_at FROM order_runs").fetchall()
    assert max_overlap([(r[0], r[1]) for r in runs]) == 3
