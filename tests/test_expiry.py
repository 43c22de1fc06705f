"""Expiry (#25, slotd/lifecycle/ "expired"): a task not started by its expires_in never
starts; the sweep makes it a dead letter with reason "expired", out of the discovery index."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd import lifecycle
from slotd.registry import Registry
from slotd.repository import Repository, limit_params, statements
from tests.daemon import Daemon, wait_for
from tests.test_control_runtime import cli

MINUTE = timedelta(minutes=1)


def registry() -> Registry:
    reg = Registry()
    reg.register("mail", lambda task, ctx: None, ceiling=MINUTE)
    return reg


def expire_now(conn: psycopg.Connection[Any], *ids: int) -> None:
    """The database's clock cannot be moved; the expiry can."""
    conn.execute(
        "UPDATE slotd_tasks SET expires_at = now() - interval '1 second' WHERE id = ANY(%s)",
        (list(ids),),
    )


def test_an_expired_task_never_starts_and_the_sweep_makes_it_an_expired_dead_letter(
    conn: psycopg.Connection[Any], repo: Repository, db_url: str
) -> None:
    reg = registry()
    stale, fresh = slotd.enqueue_many(
        conn, [("mail", {"n": 1}), ("mail", {"n": 2})], expires_in=timedelta(hours=1)
    )
    forever = slotd.enqueue(conn, "mail", {"n": 3})
    expire_now(conn, stale)
    # Refused from the instant of expiry, sweep or no sweep: discovery and the claim.
    assert repo.discover(reg.types) == [fresh, forever]
    assert repo.claim([stale], reg) is None
    assert slotd.result(conn, stale).state == "expired"  # type: ignore[union-attr]  # never to start
    assert lifecycle.expire(repo) == {"mail": 1}
    assert lifecycle.expire(repo) == {}  # nothing twice
    r = slotd.result(conn, stale)
    assert r is not None and r.state == "expired" and r.error is not None
    assert r.error.endswith("before it started")
    [row] = json.loads(cli(db_url, "dead", "list", "--id", str(stale), "--json").stdout)
    assert row["dead_reason"] == "expired" and row["attempt_count"] == 0
    # Out of the discovery index, and the others untouched.
    assert repo.discover(reg.types) == [fresh, forever]
    assert slotd.result(conn, fresh).state == "pending"  # type: ignore[union-attr]


def test_a_running_task_is_left_to_end_and_its_retry_after_expiry_expires(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry()
    task_id = slotd.enqueue(conn, "mail", {}, expires_in=timedelta(hours=1))
    claimed = repo.claim([task_id], reg)
    assert claimed is not None
    expire_now(conn, task_id)
    assert lifecycle.expire(repo) == {}  # it has started: its attempt runs to its end
    repo.record_failure(task_id, claimed.token, "smtp timeout")
    due_now = "UPDATE slotd_tasks SET run_at = now(), order_at = now() WHERE id = %s"
    conn.execute(due_now, (task_id,))
    assert repo.discover(reg.types) == []  # its retry would start after expires_at
    assert lifecycle.expire(repo) == {"mail": 1}
    r = slotd.result(conn, task_id)
    assert r is not None and r.state == "expired"
    assert r.error is not None and "after 1 attempt(s); last error: smtp timeout" in r.error


def test_dead_retry_of_an_expired_task_runs_it_anyway(
    conn: psycopg.Connection[Any], repo: Repository, db_url: str
) -> None:
    reg = registry()
    task_id = slotd.enqueue(conn, "mail", {}, expires_in=timedelta(hours=1))
    expire_now(conn, task_id)
    lifecycle.expire(repo)
    done = cli(db_url, "dead", "retry", "--id", str(task_id))
    assert done.returncode == 0, done.stderr
    assert repo.claim([task_id], reg) is not None


def test_retention_measures_an_expired_task_from_its_expiry(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    task_id = slotd.enqueue(conn, "mail", {}, expires_in=timedelta(hours=1))
    conn.execute(
        "UPDATE slotd_tasks SET expires_at = now() - interval '8 days' WHERE id = %s", (task_id,)
    )
    lifecycle.expire(repo)
    assert repo.prune_dead(timedelta(days=7)) == 1


def test_bad_expiry_is_refused_before_anything_is_written(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    for bad, error in [
        (timedelta(0), ValueError),
        (-5, ValueError),
        ("1h", TypeError),
        (True, TypeError),
    ]:
        with pytest.raises(error, match="expires_in"):
            slotd.enqueue(conn, "mail", {}, expires_in=bad)
    with pytest.raises(ValueError, match="longer than the delay"):
        slotd.enqueue(conn, "mail", {}, delay=timedelta(hours=1), expires_in=timedelta(minutes=5))
    # A NewTask's own expiry wins over the call's.
    ids = slotd.enqueue_many(
        conn,
        [slotd.NewTask("mail", expires_in=30), slotd.NewTask("mail")],
        expires_in=timedelta(hours=2),
    )
    got = conn.execute(
        "SELECT round(extract(epoch FROM expires_at - created_at)) FROM slotd_tasks"
        " WHERE id = ANY(%s) ORDER BY id",
        (ids,),
    ).fetchall()
    assert got == [(30,), (7200,)]
    assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (2,)
    bad = cli(db_url, "enqueue", "mail", "--expires-in", "soon")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    short = cli(db_url, "enqueue", "mail", "--delay", "1h", "--expires-in", "5m")
    assert short.returncode == 2 and "longer than --delay" in short.stderr, short.stderr
    ok = cli(db_url, "enqueue", "mail", "--expires-in", "90s")
    assert ok.returncode == 0, ok.stderr
    row = conn.execute(
        "SELECT round(extract(epoch FROM expires_at - created_at)) FROM slotd_tasks WHERE id = %s",
        (int(ok.stdout),),
    ).fetchone()
    assert row == (90,)


def test_the_async_enqueue_takes_expires_in(db_url: str) -> None:
    async def main() -> list[Any]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            task_id = await slotd.enqueue_async(aconn, "mail", {}, expires_in=MINUTE)
            [other] = await slotd.enqueue_many_async(aconn, [("mail", {})], expires_in=120)
            cur = await aconn.execute(
                "SELECT round(extract(epoch FROM expires_at - created_at)) FROM slotd_tasks"
                " WHERE id = ANY(%s) ORDER BY id",
                ([task_id, other],),
            )
            return await cur.fetchall()

    assert asyncio.run(main()) == [(60,), (120,)]


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def test_swept_expired_rows_cost_the_discovery_nothing(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, run_at, order_at, expires_at) SELECT 'mail',"
        " now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 minute'"
        " FROM generate_series(1, 20000)"
    )
    swept = 0
    while found := lifecycle.expire(repo):
        swept += found["mail"]
    assert swept == 20000
    conn.execute("VACUUM ANALYZE slotd_tasks")
    mine = slotd.enqueue(conn, "mail", {})
    params = {"types": ["mail"], "limit": 80, "lead_s": 100.0, **limit_params({})}
    cur = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statements()["discover"], params)
    plan = cur.fetchone()[0][0]["Plan"]  # type: ignore[index]
    reads = [n for n in _nodes(plan) if n.get("Alias") == "t"]
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in reads) == 1, plan
    assert sum(n.get("Rows Removed by Filter", 0) for n in reads) == 0, plan
    assert repo.discover(["mail"]) == [mine]


def test_tasks_expire_while_their_type_is_paused_through_slotd_run(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """A real `slotd run` (poll 1 s: its sweep runs each tick) with the type paused: the two
    tasks given 1 s expire unstarted, wait_result hears it, the metrics count them `expired`,
    and after the resume only the task without an expiry runs."""
    from tests.daemon import EXECUTIONS

    conn.execute(EXECUTIONS)
    slotd.pause(conn, "rt.noop")
    daemon = Daemon(db_url, env={"SLOTD_METRICS_ADDR": "127.0.0.1:0"})
    daemons.append(daemon)
    daemon.start()
    url = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()
    stale = slotd.enqueue_many(
        conn, [("rt.noop", {"n": n}) for n in range(2)], expires_in=timedelta(seconds=1)
    )
    keep = slotd.enqueue(conn, "rt.noop", {"n": 9})
    for task_id in stale:
        r = slotd.wait_result(conn, task_id, timeout=30)
        assert r.state == "expired" and r.error is not None, r
    daemon.wait_line(r"2 rt\.noop task\(s\) expired unstarted")

    def expired_count() -> float:
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        found = re.search(
            r'slotd_task_outcomes_total\{outcome="expired",task_type="rt\.noop"\} (\S+)', body
        ) or re.search(
            r'slotd_task_outcomes_total\{task_type="rt\.noop",outcome="expired"\} (\S+)', body
        )
        return float(found.group(1)) if found else 0.0

    assert wait_for(lambda: expired_count() == 2, what="the expired outcomes counted")
    slotd.resume(conn, "rt.noop")
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM slotd_tasks WHERE id = %s", (keep,)).fetchone()
            == (0,)
        ),
        what="the unexpired task to run",
    )
    started = conn.execute("SELECT DISTINCT task_id FROM executions").fetchall()
    assert started == [(keep,)]


def test_an_expired_parent_cancels_its_dependants_and_counts_in_its_batch(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    """Expiry is a terminal state like any other (CONTRACT, turn 3): the task's dependants
    are cancelled naming it, and its batch counts it `expired` (and them `cancelled`) and
    enqueues its callback once every task has ended, all in the sweep's statement."""
    with slotd.batch(conn, on_complete=("mail", {"report": 1})) as b:
        [parent] = b.enqueue_many([slotd.NewTask("mail", expires_in=timedelta(hours=1))])
        child = b.enqueue("mail", {}, after=[parent])
    grandchild = slotd.enqueue(conn, "mail", {}, after=[child])
    expire_now(conn, parent)
    assert lifecycle.expire(repo) == {"mail": 1}
    for task_id in (child, grandchild):
        r = slotd.result(conn, task_id)
        assert r is not None and r.state == "cancelled", r
        assert r.error == f"cancelled: task {parent}, which it waits on, expired", r.error
    report = conn.execute(
        "SELECT payload FROM slotd_tasks WHERE task_type = 'mail' AND payload ? 'batch'"
    ).fetchone()
    assert report is not None
    assert report[0]["batch"] == {
        "id": b.id,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 1,
        "expired": 1,
    }
