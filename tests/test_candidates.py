"""A slot's candidates (slotd/slot/candidates.py): a discovery that is slow asks for more next time,
so that slots do not spend the server on rediscovering a dead-tuple-laden index head (a held
xmin); a claim is offered the head of what was found, a healthy discovery's size at most."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

import slotd
from slotd.repository import NewTask, Repository, enqueue_many
from slotd.slot.candidates import MAX_WIDEN, Candidates


def _registry() -> slotd.Registry:
    reg = slotd.Registry()
    reg.register("work", lambda task, ctx: None, ceiling=timedelta(minutes=1))
    return reg


def test_a_healthy_discovery_keeps_the_configured_size_and_a_slow_one_widens_it() -> None:
    c = Candidates(discovery_batch=20, slots=4)  # asks for 80
    assert c.widened(0.0004) == 80  # well under a millisecond: as configured
    assert c.widened(0.030) == 300  # 30 ms over 0.1 ms a candidate
    assert c.widened(0.150) == 1500
    assert c.widened(5.0) == 80 * MAX_WIDEN  # bounded


def test_a_discovery_behind_a_held_xmin_widens_the_next_one(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """The soak's failure, made small: a REPEATABLE READ transaction held open keeps every
    finished task's index entries at the head of the due index; the discovery walks them."""
    repo, reg = Repository(conn), _registry()
    with psycopg.connect(db_url) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM slotd_tasks").fetchone()  # the snapshot is taken
        with conn.transaction():
            enqueue_many(conn, [NewTask("work") for _ in range(20_000)])
        conn.execute("DELETE FROM slotd_tasks")  # 20k finished tasks vacuum may not remove
        enqueue_many(conn, [NewTask("work") for _ in range(10)])
        candidates = Candidates(discovery_batch=20, slots=1)
        assert candidates.limit == 20
        candidates.next_claim(repo, reg, lambda *m: None)
        assert candidates.limit > 20, "a discovery over 20k dead entries was not slow enough"
        holder.rollback()


def test_a_claim_is_offered_the_head_and_then_the_next_head_before_discovering_again(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    repo, reg = Repository(conn), _registry()
    with conn.transaction():
        ids = enqueue_many(conn, [NewTask("work") for _ in range(100)])
    candidates = Candidates(discovery_batch=10, slots=1, budget_s=1e-12)  # always widens
    first = candidates.next_claim(repo, reg, lambda *m: None)
    assert first is not None and first.id == ids[0]
    assert candidates.limit == 10 * MAX_WIDEN
    # The next discovery finds all 99; another worker holds the ten at their head.
    candidates.forget()
    with psycopg.connect(db_url) as other:
        other.execute("SELECT id FROM slotd_tasks WHERE id = ANY(%s) FOR UPDATE", (ids[1:11],))
        claimed = candidates.next_claim(repo, reg, lambda *m: None)
        assert claimed is not None and claimed.id == ids[11]  # the second head's first
        assert candidates.batch == ids[12:]  # kept: no rediscovery for the rest
        other.rollback()
