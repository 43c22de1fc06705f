"""Rates (#25): at most N starts of a type (of a type and one group) in any window, exact,
fleet-wide, by the database's clock. Statement paths on a real PostgreSQL here; real
`slotd run` replicas in tests/test_rates_daemon.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.registry import Registry
from slotd.repository import Repository, composed, limit_params, statements

MINUTE = timedelta(minutes=1)


def rated(**options: Any) -> Registry:
    reg = Registry()
    reg.register("sms", lambda task, ctx: None, ceiling=MINUTE, **options)
    reg.register("plain", lambda task, ctx: None, ceiling=MINUTE)
    return reg


def claim(repo: Repository, reg: Registry) -> slotd.repository.Claimed | None:
    ids = repo.discover(reg.types, 20, reg.concurrency_limits, rates=reg.rates)
    return repo.claim(ids, reg) if ids else None


def age_starts(conn: psycopg.Connection[Any], seconds: float) -> None:
    """Move every recorded start (and window end) into the past: the database's clock
    cannot be moved, the stamps can."""
    shift = {"s": seconds}
    conn.execute(
        "UPDATE slotd_rate_starts SET started_at = started_at - make_interval(secs => %(s)s)",
        shift,
    )
    conn.execute(
        "UPDATE slotd_rate_windows SET free_at = free_at - make_interval(secs => %(s)s),"
        " last_start_at = last_start_at - make_interval(secs => %(s)s)",
        shift,
    )


def test_a_rate_starts_n_per_window_and_the_next_once_the_oldest_leaves_it(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = rated(rate=(3, timedelta(seconds=60)))
    slotd.enqueue_many(conn, [("sms", {"n": n}) for n in range(6)])
    started = [claim(repo, reg) for _ in range(3)]
    assert all(started)
    assert claim(repo, reg) is None  # the window holds 3 starts
    # Discovery passes the type over and says when it has room: ~60 s after the first.
    assert repo.discover(reg.types, 20, reg.concurrency_limits, rates=reg.rates) == []
    assert repo.wake_in_s is not None and 55 < repo.wake_in_s <= 60
    # Work waiting on its own rate is not waiting on the fleet (the starvation alert).
    conn.execute("UPDATE slotd_tasks SET run_at = run_at - interval '1 hour',"
                 " order_at = order_at - interval '1 hour' WHERE lease_token IS NULL")  # fmt: skip
    assert repo.gauges()["oldest_due_seconds"] == 0
    age_starts(conn, 61)  # every start is now older than the window
    assert repo.gauges()["oldest_due_seconds"] >= 3600
    assert all(claim(repo, reg) for _ in range(3))
    # Only the ring of the last 3 starts is kept.
    kept = conn.execute("SELECT count(*) FROM slotd_rate_starts").fetchone()
    assert kept == (3,)


def test_the_window_slides_one_start_at_a_time(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    """Not a fixed window that resets: with 2 per 60 s, a start 40 s ago and one now, the
    next may come 20 s from now (when the older leaves the window), not 60 s."""
    reg = rated(rate=(2, timedelta(seconds=60)))
    slotd.enqueue_many(conn, [("sms", {}) for _ in range(4)])
    assert claim(repo, reg) is not None
    age_starts(conn, 40)
    assert claim(repo, reg) is not None
    assert claim(repo, reg) is None
    repo.discover(reg.types, 20, reg.concurrency_limits, rates=reg.rates)
    assert repo.wake_in_s is not None and 15 < repo.wake_in_s <= 20
    age_starts(conn, 21)
    assert claim(repo, reg) is not None
    assert claim(repo, reg) is None


def test_rate_per_group_holds_one_group_and_not_the_others(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = rated(rate_per_group=(1, timedelta(seconds=60)))
    items = [slotd.NewTask("sms", {}, group="a") for _ in range(3)]
    items += [slotd.NewTask("sms", {}, group="b"), slotd.NewTask("sms", {})]
    slotd.enqueue_many(conn, items)
    got = [claim(repo, reg) for _ in range(5)]
    groups = [
        conn.execute("SELECT task_group FROM slotd_tasks WHERE id = %s", (c.id,)).fetchone()[0]  # type: ignore[index]
        for c in got
        if c is not None
    ]
    # One of group a, the one of group b, the ungrouped one; then nothing.
    assert sorted(groups, key=str) == [None, "a", "b"]
    assert got[3] is None and got[4] is None


def test_unrated_work_is_never_held_by_a_full_rate(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = rated(rate=(1, timedelta(seconds=60)))
    slotd.enqueue_many(conn, [("sms", {})] * 3 + [("plain", {})] * 3)
    got = [claim(repo, reg) for _ in range(5)]
    assert [c.task_type for c in got if c] == ["sms", "plain", "plain", "plain"]


def test_a_bad_rate_is_refused_when_the_handler_is_registered() -> None:
    for bad in [(0, MINUTE), (1, timedelta(0)), (1.5, MINUTE), (1, 60), 5, (True, MINUTE)]:
        with pytest.raises(ValueError, match="rate must be \\(N, window\\)"):
            rated(rate=bad)
        with pytest.raises(ValueError, match="rate_per_group must be"):
            rated(rate_per_group=bad)


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize("closed_by", ["rate", "max_running", "pause"])
def test_a_closed_types_backlog_costs_the_discovery_nothing_per_row(
    conn: psycopg.Connection[Any], repo: Repository, closed_by: str
) -> None:
    """20k due rows of a type whose rate window is full (or at its max_running, or paused):
    discovery decides once per type and reads none of them; the open type's rows are found."""
    options = {"rate": {"rate": (1, MINUTE)}, "max_running": {"max_running": 1}}
    reg = rated(**options.get(closed_by, {}))
    slotd.enqueue(conn, "sms", {})
    assert claim(repo, reg) is not None  # the window (or the one place) is taken
    if closed_by == "pause":
        slotd.pause(conn, "sms")
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, run_at, order_at) SELECT 'sms',"
        " now() - interval '1 hour', now() - interval '1 hour' FROM generate_series(1, 20000)"
    )
    conn.execute("VACUUM ANALYZE slotd_tasks")
    mine = slotd.enqueue(conn, "plain", {})
    params = {
        "types": reg.types,
        "limit": 80,
        "lead_s": 100.0,
        **limit_params(reg.concurrency_limits, reg.rates),
    }
    cur = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statements()["discover"], params)
    plan = cur.fetchone()[0][0]["Plan"]  # type: ignore[index]
    reads = [n for n in _nodes(plan) if n.get("Alias") == "t"]
    assert reads, plan
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in reads)
    removed = sum(n.get("Rows Removed by Filter", 0) for n in reads)
    assert read == 1 and removed == 0, plan  # the open type's one row, nothing of sms
    assert repo.discover(reg.types, 80, reg.concurrency_limits, rates=reg.rates) == [mine]


def test_status_and_metrics_show_the_current_window(
    conn: psycopg.Connection[Any], repo: Repository, db_url: str
) -> None:
    import json

    from click.testing import CliRunner

    from slotd.cli import main
    from slotd.ops.metrics import _rate_families

    reg = rated(rate=(3, timedelta(seconds=60)), rate_per_group=(1, timedelta(seconds=30)))
    slotd.enqueue_many(conn, [slotd.NewTask("sms", {}, group=g) for g in "aab"])
    assert claim(repo, reg) is not None and claim(repo, reg) is not None
    assert claim(repo, reg) is None  # group a's second waits on its group's window
    rates = repo.gauges()["rates"]["sms"]
    assert rates["used"] == 2 and rates["allowed"] == 3 and rates["window_s"] == 60
    assert rates["free_s"] == 0  # a third start may come now (of another group)
    assert rates["groups_full"] == 2  # a and b each started once in the last 30 s
    env = {"SLOTD_DATABASE_URL": db_url, "SLOTD_DATABASE_URL_READ": None}
    shown = CliRunner().invoke(main, ["status"], env=env)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    line = next(ln for ln in lines[lines.index("rates:") :] if ln.strip().startswith("sms"))
    assert line.split()[1:] == ["2/3", "per", "1m", "now", "2"], line
    report = json.loads(CliRunner().invoke(main, ["status", "--json"], env=env).output)
    assert report["rates"]["sms"]["used"] == 2
    slotd.enqueue(conn, "sms", {})
    assert claim(repo, reg) is not None  # the ungrouped one: the type's third start
    rates = repo.gauges()["rates"]["sms"]
    assert rates["used"] == 3 and 55 < rates["free_s"] <= 60
    families = {f.name: f.samples for f in _rate_families({"sms": rates})}
    assert families["slotd_task_rate_starts"][0].value == 3
    assert families["slotd_task_rate_next_free_seconds"][0].value > 55


def test_the_dashboard_shows_each_rated_types_window(
    conn: psycopg.Connection[Any], repo: Repository, db_url: str
) -> None:
    pytest.importorskip("starlette", reason="the dashboard needs the web extra")
    from starlette.testclient import TestClient

    from slotd.web import create_app
    from slotd.web.settings import DashboardSettings

    reg = rated(rate=(2, timedelta(seconds=60)))
    slotd.enqueue_many(conn, [("sms", {})] * 3)
    assert claim(repo, reg) is not None and claim(repo, reg) is not None
    app = create_app(db_url, settings=DashboardSettings())
    with TestClient(app, base_url="http://127.0.0.1") as client:
        page = client.get("/").text
        app.state.dashboard.close()
    assert ">rate</th>" in page  # the column, hidden below 400 px (class wide-only)
    shown = re.search(r'<tr data-type="sms".*?(2/2 per 1m 00s, next start in [\d.]+s)', page, re.S)
    assert shown, page


def test_retention_prunes_windows_with_no_start_left_in_them(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    from slotd.supervisor.maintenance import prune

    reg = rated(rate_per_group=(1, timedelta(seconds=10)), rate=(5, timedelta(seconds=10)))
    slotd.enqueue_many(conn, [slotd.NewTask("sms", {}, group=g) for g in "abc"])
    assert all(claim(repo, reg) for _ in range(3))
    windows = "SELECT count(*) FROM slotd_rate_windows"
    assert conn.execute(windows).fetchone() == (4,)  # the type's, and a, b, c's
    assert prune(repo, timedelta(days=7)) == (0, None)
    assert conn.execute(windows).fetchone() == (4,)  # every window still has its start
    age_starts(conn, 71)  # past the window and the minute's slack
    prune(repo, timedelta(days=7))
    assert conn.execute(windows).fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM slotd_rate_starts").fetchone() == (0,)
    slotd.enqueue(conn, "sms", {}, group="a")
    assert claim(repo, reg) is not None  # and a window starts again from nothing
    assert conn.execute("SELECT max(last_seq) FROM slotd_rate_windows").fetchone() == (1,)


def test_only_a_claim_that_may_pick_a_rated_type_names_the_rate_tables(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    """Every table a statement names is locked and opened on each execution: unrated work's
    claims keep the statements they had, and the claim riding on a settlement counts a
    rated start like any claim."""
    for part in (None, "plain", "kept", "linked", "member"):
        unrated = composed.claimed("plain") if part is None else composed.succeeded(part, "plain")
        rated_ = composed.claimed("rated") if part is None else composed.succeeded(part, "rated")
        assert "slotd_rate" not in statements()[unrated]
        assert "slotd_rate_starts" in statements()[rated_]
    reg = rated(rate=(2, timedelta(seconds=60)))
    ids = slotd.enqueue_many(conn, [("sms", {})] * 3)
    first = claim(repo, reg)
    assert first is not None
    rest = [i for i in ids if i != first.id]
    second = repo.dequeue_and_claim(first.id, first.token, rest, reg)
    assert second is not None  # the window's second start, chained on the settlement
    assert repo.dequeue_and_claim(second.id, second.token, rest, reg) is None  # full
    assert conn.execute("SELECT last_seq FROM slotd_rate_windows").fetchone() == (2,)
