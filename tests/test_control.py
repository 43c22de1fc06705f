"""Operator control on a real PostgreSQL: cancel (pending, running, racing a claim), pause and
resume, and how a cancelled task lives on as a dead letter."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.ops.metrics import Metrics, db_gauge_source
from slotd.registry import Registry
from slotd.repository import Repository, limit_params, statements
from tests.test_ops_cli import one_error_line, run_cli

MINUTE = timedelta(minutes=1)


def registry_of(*names: str) -> Registry:
    reg = Registry()
    for name in names:
        reg.register(name, lambda task, ctx: None, ceiling=MINUTE)
    return reg


def row(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM slotd_tasks WHERE id = %s", (task_id,))
    found = cur.fetchone()
    assert found is not None
    return dict(zip([c.name for c in cur.description], found, strict=True))


def claim(repo: Repository, reg: Registry) -> slotd.repository.Claimed | None:
    return repo.claim(repo.discover(reg.types), reg)


# --- cancel ----------------------------------------------------------------------------------


def test_cancelled_pending_task_is_never_claimed_and_is_a_dead_letter_with_its_reason(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("report")
    task_id = slotd.enqueue(conn, "report", {"n": 1})
    assert slotd.cancel(conn, task_id, by="alice@ops") is True
    assert repo.discover(reg.types) == []
    assert repo.claim([task_id], reg) is None
    [dead] = repo.dead_list()
    assert dead["id"] == task_id
    assert dead["cancelled_at"] is not None
    assert dead["last_error"].startswith("cancelled by alice@ops at ")
    assert dead["last_error"].endswith("after 0 attempt(s)")
    assert repo.gauges()["dead"] == {"report": 1}
    assert repo.gauges()["pending"] == {}
    # A second cancel finds nothing live to cancel.
    assert slotd.cancel(conn, task_id) is False


def test_cancel_in_a_rolled_back_transaction_changes_nothing(
    conn: psycopg.Connection[Any], db_url: str, repo: Repository
) -> None:
    task_id = slotd.enqueue(conn, "report")
    with psycopg.connect(db_url) as other:
        assert slotd.cancel(other, task_id) is True
        other.rollback()
    assert repo.discover(["report"]) == [task_id]


def test_cancelled_running_task_keeps_its_lease_until_its_slot_settles_it(
    conn: psycopg.Connection[Any], db_url: str, repo: Repository
) -> None:
    reg = registry_of("report")
    task_id = slotd.enqueue(conn, "report")
    held = claim(repo, reg)
    assert held is not None
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN slotd_control")
        assert slotd.cancel(conn, task_id, by="bob@ops") is True
        [note] = list(listener.notifies(timeout=5, stop_after=1))
    assert note.channel == "slotd_control"
    assert json.loads(note.payload) == {
        "op": "cancel",
        "id": task_id,
        "token": str(held.token),
        "by": "bob@ops",
    }
    # Still leased, so neither dead (nothing may retry it under its runner) nor claimable.
    assert repo.gauges()["running"] == {"report": 1}
    assert repo.dead_list() == []
    assert repo.cancel_reason(task_id, held.token) is not None
    assert "while attempt 1 was running" in row(conn, task_id)["last_error"]
    # Its slot's settlement ends the lease; the row is then the dead letter.
    assert repo.settle_cancelled(task_id, held.token) is True
    [dead] = repo.dead_list()
    assert dead["id"] == task_id and dead["attempt_count"] >= 1
    assert repo.discover(reg.types) == []


def test_a_cancelled_attempt_cannot_revive_its_task(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    # Whatever the attempt does next (its slot never heard of the cancel), the task stays
    # cancelled and keeps its reason: no cursor reset, no retry, no overwritten reason.
    reg = registry_of("a", "b", "c")
    ids = slotd.enqueue_many(conn, [("a", {}), ("b", {}), ("c", {})])
    held = {c.task_type: c for c in (claim(repo, reg) for _ in ids) if c is not None}
    for task_id in ids:
        slotd.cancel(conn, task_id, by="ops")
    assert repo.advance_cursor(held["a"].id, held["a"].token, {"cursor": 9}) is False
    repo.record_failure(held["b"].id, held["b"].token, "boom")
    repo.release(held["c"].id, held["c"].token, "released at shutdown on its final attempt")
    for task_id in ids[1:]:
        found = row(conn, task_id)
        assert found["last_error"].startswith("cancelled by ops")
        assert found["attempt_count"] >= found["max_attempts"]
    assert {d["id"] for d in repo.dead_list()} == set(ids[1:])
    assert repo.discover(reg.types) == []


def test_cancelled_running_keyed_task_does_not_swallow_a_fresh_enqueue(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("rebuild")
    first = slotd.enqueue(conn, "rebuild", key="org:1")
    assert claim(repo, reg) is not None
    slotd.cancel(conn, first)
    second = slotd.enqueue(conn, "rebuild", key="org:1")
    assert second != first
    assert repo.discover(reg.types) == [second]


def test_dead_retry_brings_a_cancelled_task_back(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("report")
    task_id = slotd.enqueue(conn, "report")
    slotd.cancel(conn, task_id)
    assert repo.dead_retry_batch(ids=[task_id]) == [task_id]
    assert row(conn, task_id)["cancelled_at"] is None
    held = claim(repo, reg)
    assert held is not None and held.id == task_id
    assert repo.advance_cursor(task_id, held.token, {"cursor": 1}) is True


def test_retention_prunes_a_never_run_cancelled_task_from_its_cancel(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    old, fresh = slotd.enqueue_many(conn, [("report", {}), ("report", {})])
    slotd.cancel(conn, old)
    slotd.cancel(conn, fresh)
    conn.execute(
        "UPDATE slotd_tasks SET cancelled_at = now() - interval '8 days' WHERE id = %s", (old,)
    )
    assert repo.prune_dead(timedelta(days=7)) == 1
    assert [d["id"] for d in repo.dead_list()] == [fresh]


def test_cancel_by_type_and_key_takes_only_matching_live_tasks(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    ids = slotd.enqueue_many(
        conn, [("report", {}, None, "a"), ("report", {}, None, "b"), ("audit", {}, None, "a")]
    )
    done = slotd.repository.cancel_tasks(conn, task_type="report", key="a", by="ops")
    assert [c.id for c in done] == [ids[0]]
    done = slotd.repository.cancel_tasks(conn, task_type="report", by="ops")
    assert [c.id for c in done] == [ids[1]]
    assert repo.discover(["report", "audit"]) == [ids[2]]


def race(*calls: Any) -> list[Any]:
    """Run the calls in threads released at the same instant; their results, in order."""
    gate = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def one(n: int) -> None:
        gate.wait()
        results[n] = calls[n]()

    threads = [threading.Thread(target=one, args=(n,)) for n in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_claim_racing_cancel_never_starts_an_attempt_after_the_cancel_commits(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """A claim and a cancel of the same row, released together, 200 times. Whichever commits
    first wins; a claim never succeeds after a cancel reported the task as pending, and a
    cancel that met a claimed row reports it running (so its replica is told)."""
    reg = registry_of("race")
    rounds = 200
    outcomes = {"claim_first": 0, "cancel_first": 0}
    with (
        psycopg.connect(db_url, autocommit=True) as claimer,
        psycopg.connect(db_url, autocommit=True) as canceller,
    ):
        claims = Repository(claimer)
        for _ in range(rounds):
            task_id = slotd.enqueue(conn, "race")
            got = race(
                lambda task_id=task_id: claims.claim([task_id], reg),
                lambda task_id=task_id: slotd.repository.cancel_tasks(
                    canceller, ids=[task_id], by="r"
                ),
            )
            [cancelled] = got[1]  # a live task is always cancellable
            if got[0] is None:
                assert not cancelled.running
                outcomes["cancel_first"] += 1
            else:
                assert cancelled.running, "a claim committed after the cancel"
                outcomes["claim_first"] += 1
            # And no later claim ever takes it.
            assert claims.claim([task_id], reg) is None
    assert sum(outcomes.values()) == rounds, outcomes


# --- pause and resume ------------------------------------------------------------------------


def test_paused_type_is_neither_discovered_nor_claimed_while_others_flow(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = registry_of("report", "audit")
    report, audit = slotd.enqueue_many(conn, [("report", {}), ("audit", {})])
    slotd.pause(conn, "report", by="carol@ops")
    assert repo.discover(reg.types) == [audit]
    assert repo.claim([report], reg) is None
    assert repo.claim([report, audit], reg).id == audit  # type: ignore[union-attr]
    [paused] = slotd.repository.paused_types(conn)
    assert paused["task_type"] == "report" and paused["paused_by"] == "carol@ops"
    assert paused["until"] is None
    assert repo.gauges()["paused"] == {"report": 1}
    assert slotd.resume(conn, "report") is True
    assert repo.discover(reg.types) == [report]
    assert repo.gauges()["paused"] == {}
    assert slotd.resume(conn, "report") is False


def test_pause_until_ends_by_itself(conn: psycopg.Connection[Any], repo: Repository) -> None:
    task_id = slotd.enqueue(conn, "report")
    slotd.pause(conn, "report", until=datetime.now(UTC) + timedelta(hours=1))
    assert repo.discover(["report"]) == []
    # The pause's end moved into the past, as time passing would.
    conn.execute("UPDATE slotd_paused_types SET until = now() - interval '1 second'")
    assert repo.discover(["report"]) == [task_id]
    assert slotd.repository.paused_types(conn) == []
    assert slotd.resume(conn, "report") is False


def test_paused_work_is_left_out_of_oldest_due_so_starvation_does_not_fire(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, run_at) VALUES ('report', now() - interval '1 hour')"
    )
    assert repo.gauges()["oldest_due_seconds"] > 3000
    slotd.pause(conn, "report")
    assert repo.gauges()["oldest_due_seconds"] == 0
    assert repo.oldest_due_by_type() == {}
    # Still pending: the work is there, it is just not being claimed on purpose.
    assert repo.gauges()["pending"] == {"report": 1}


def test_paused_gauge_is_one_for_paused_types_and_zero_for_this_replicas_others(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    slotd.pause(conn, "report")
    slotd.pause(conn, "elsewhere", until=timedelta(minutes=5))
    source = db_gauge_source(db_url)
    try:
        metrics = Metrics(slots=1, task_types=["report", "audit"], gauge_source=source, ttl=0)
        sample = metrics.registry.get_sample_value
        assert sample("slotd_task_type_paused", {"task_type": "report"}) == 1
        assert sample("slotd_task_type_paused", {"task_type": "elsewhere"}) == 1
        assert sample("slotd_task_type_paused", {"task_type": "audit"}) == 0
        slotd.resume(conn, "report")
        assert sample("slotd_task_type_paused", {"task_type": "report"}) == 0
    finally:
        source.close()


def test_resume_wakes_the_replicas(db_url: str, conn: psycopg.Connection[Any]) -> None:
    slotd.pause(conn, "report")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN slotd_wake")
        slotd.resume(conn, "report")
        [note] = list(listener.notifies(timeout=5, stop_after=1))
    assert note.channel == "slotd_wake"


@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize("name", ["claim.plain", "discover", "gauges"])
def test_pause_check_is_built_once_per_statement_and_keeps_the_due_index_walk(
    conn: psycopg.Connection[Any], name: str, paused: bool
) -> None:
    # What makes a pause free on the claim path: slotd_paused_types is read once per
    # statement (a hashed SubPlan, one probe per row), and discovery and the oldest-due gauge
    # still walk the due index to their LIMIT instead of sorting every due row.
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, run_at) "
        "SELECT 'report', now() - interval '1 hour' FROM generate_series(1, 20000)"
    )
    if paused:
        slotd.pause(conn, "audit")
    conn.execute("ANALYZE slotd_tasks")
    ids = [r[0] for r in conn.execute("SELECT id FROM slotd_tasks ORDER BY id LIMIT 40")]
    params = {
        "ids": ids,
        "types": ["report"],
        "ceilings_s": [60.0],
        "max_attempts": [20],
        "margin_s": 30.0,
        "lease_token": None,
        "token": "00000000-0000-0000-0000-000000000001",
        "limit": 20,
        "lead_s": 100.0,
        **limit_params({}),  # an unlimited registry
    }
    with conn.transaction(force_rollback=True):  # EXPLAIN ANALYZE really claims
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statements()[name],  # type: ignore[operator]
            params,
        ).fetchone()[0]  # type: ignore[index]
    nodes = list(_nodes(plan[0]["Plan"]))
    pause_looks = [n for n in nodes if n.get("Relation Name") == "slotd_paused_types"]
    assert pause_looks and all(n["Actual Loops"] == 1 for n in pause_looks), pause_looks
    if name in ("discover", "gauges"):
        # A sort only merges the per-type heads (sql/011), never every due row.
        sorted_in = [
            sum(c.get("Actual Rows", 0) * c.get("Actual Loops", 1) for c in n.get("Plans", []))
            for n in nodes
            if n["Node Type"] == "Sort"
        ]
        assert all(rows <= 20 for rows in sorted_in), sorted_in
        walked = sum(
            n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
            for n in nodes
            if n.get("Relation Name") == "slotd_tasks"
            and n.get("Index Name") == "slotd_tasks_order_by_type"
        )
        assert 0 < walked <= 20, walked  # the LIMIT's worth of the index, not 20,000 rows


def _nodes(node: dict[str, Any]) -> Any:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def test_bad_input_is_refused_before_any_write(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValueError):
        slotd.pause(conn, "Not A Type")
    with pytest.raises(ValueError):
        slotd.pause(conn, "report", until=datetime(2030, 1, 1))  # naive
    with pytest.raises(ValueError):
        slotd.pause(conn, "report", until=timedelta(0))
    with pytest.raises(TypeError):
        slotd.cancel(conn, "12")  # type: ignore[arg-type]
    assert slotd.repository.paused_types(conn) == []


# --- the command line ------------------------------------------------------------------------


@pytest.fixture
def cli(db_url: str) -> Any:
    return lambda *args: run_cli(db_url, *args)


def test_cli_cancel_by_id_lists_what_it_cancelled_and_dead_list_shows_why(
    cli: Any, conn: psycopg.Connection[Any]
) -> None:
    first, second = slotd.enqueue_many(conn, [("report", {}), ("report", {})])
    result = cli("cancel", "--id", str(first), "--id", str(second))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "cancelled 2 tasks",
        f"  {first} report pending",
        f"  {second} report pending",
    ]
    listed = cli("dead", "list")
    assert listed.exit_code == 0
    assert listed.stdout.count("cancelled by ") == 2
    assert "@" in json.loads(cli("dead", "list", "--json").stdout)[0]["last_error"]


def test_cli_cancel_of_an_unknown_id_cancels_the_rest_and_exits_1(
    cli: Any, conn: psycopg.Connection[Any]
) -> None:
    task_id = slotd.enqueue(conn, "report")
    result = cli("cancel", "--id", str(task_id), "--id", "999999")
    line = one_error_line(result, 1)
    assert "999999" in line
    assert f"  {task_id} report pending" in result.stdout
    assert Repository(conn).discover(["report"]) == []


def test_cli_cancel_by_type_and_key(cli: Any, conn: psycopg.Connection[Any]) -> None:
    ids = slotd.enqueue_many(conn, [("report", {}, None, "a"), ("report", {}, None, "b")])
    result = cli("cancel", "--type", "report", "--key", "b")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1:] == [f"  {ids[1]} report pending"]
    assert cli("cancel", "--type", "report").stdout.startswith("cancelled 1 task\n")


@pytest.mark.parametrize(
    "args",
    [
        ("cancel",),
        ("cancel", "--id", "1", "--type", "report"),
        ("cancel", "--key", "a"),
        ("cancel", "--type", "Bad Type"),
        ("pause", "Bad Type"),
        ("pause", "report", "--until", "soon"),
        ("pause", "report", "--until", "0s"),
        ("resume", "Bad Type"),
    ],
)
def test_cli_bad_usage_exits_2_with_one_line(cli: Any, args: tuple[str, ...]) -> None:
    one_error_line(cli(*args), 2)


def test_cli_pause_status_resume(cli: Any, conn: psycopg.Connection[Any]) -> None:
    slotd.enqueue(conn, "report")
    result = cli("pause", "report", "--until", "30m")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("paused report for 30m (until ")
    assert cli("pause", "audit").stdout == "paused audit\n"
    status = cli("status")
    assert status.exit_code == 0, status.output
    assert "paused: 2 types" in status.stdout
    lines = [ln.split() for ln in status.stdout.splitlines()]
    report = next(ln for ln in lines if ln[:1] == ["report"] and len(ln) >= 4 and "@" in ln[1])
    assert report[-1] == "left" and report[-2] in {"30m", "29m59s", "29m58s"}
    # Open-ended: it lasts until a `slotd resume` (once "resumed", read as "already resumed").
    assert next(ln for ln in lines if ln[:1] == ["audit"])[-2:] == ["slotd", "resume"]
    report_json = json.loads(cli("status", "--json").stdout)
    assert set(report_json["paused"]) == {"report", "audit"}
    assert report_json["paused"]["audit"]["until"] is None
    assert report_json["oldest_due_seconds"] == 0  # paused work waits on purpose
    assert cli("resume", "report").stdout == "resumed report\n"
    assert cli("resume", "report").stdout == "report was not paused\n"
    assert set(json.loads(cli("status", "--json").stdout)["paused"]) == {"audit"}
