"""Sequences (#39): enqueue(..., sequence=NAME) runs a sequence's tasks one at a time,
across the fleet, in the order their enqueues committed. At the statement level (a waiting
member is not due, each end moves the sequence on) and through real `slotd run` replicas."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd import lifecycle
from slotd.registry import Registry
from slotd.repository import Repository, waiting_for
from tests.apps.order import RUNS
from tests.daemon import ROOT, Daemon, wait_for

APP = "tests.apps.order:registry"
TYPES = ["ord.step", "ord.once", "ord.onward"]


def _registry() -> Registry:
    from tests.apps.order import registry

    return registry


def _state(conn: psycopg.Connection[Any], task_id: int) -> str | None:
    got = slotd.result(conn, task_id)
    return None if got is None else got.state


def _claim_one(repo: Repository) -> Any:
    claimed = repo.claim(repo.discover(TYPES, limit=10), _registry())
    assert claimed is not None
    return claimed


def test_followers_wait_out_of_discovery_and_each_end_releases_the_next(
    conn: psycopg.Connection[Any],
) -> None:
    repo = Repository(conn)
    a = slotd.enqueue(conn, "ord.step", {"n": 1}, sequence="s")
    b = slotd.enqueue(conn, "ord.step", {"n": 2}, sequence="s", priority=100)
    c = slotd.enqueue(conn, "ord.step", {"n": 3}, sequence="s")
    other = slotd.enqueue(conn, "ord.step", {"n": 0}, sequence="t")
    # Only the heads are due; the followers are waiting, whatever their priority.
    assert set(repo.discover(TYPES, limit=10)) == {a, other}
    assert [_state(conn, t) for t in (a, b, c)] == ["pending", "waiting", "waiting"]
    head = repo.claim([a], _registry())
    assert head is not None and head.id == a and head.linked
    repo.dequeue_linked(a, head.token, None, None)  # its success makes b due
    assert set(repo.discover(TYPES, limit=10)) == {b, other}
    # b is cancelled before it runs: c is due (a cancel is an end, not a failure).
    slotd.cancel(conn, b)
    assert set(repo.discover(TYPES, limit=10)) == {c, other}
    assert _state(conn, c) == "pending"


def test_a_failed_head_halts_its_sequence_until_resumed(conn: psycopg.Connection[Any]) -> None:
    repo = Repository(conn)
    a = slotd.enqueue(conn, "ord.once", {}, sequence="h")
    b = slotd.enqueue(conn, "ord.once", {}, sequence="h")
    head = repo.claim([a], _registry())
    assert head is not None
    failure = repo.record_failure(a, head.token, "boom", linked=True)
    assert failure.dead
    assert _state(conn, a) == "failed" and _state(conn, b) == "waiting"
    assert repo.discover(TYPES, limit=10) == []
    # A member enqueued while halted waits as well.
    c = slotd.enqueue(conn, "ord.once", {}, sequence="h")
    assert _state(conn, c) == "waiting"
    (info,) = slotd.producer.sequences.sequences(conn, halted=True)
    assert (info.name, info.halted_by, info.holding, info.head) == ("h", a, 2, b)
    assert slotd.resume_sequence(conn, "h") is True
    assert repo.discover(TYPES, limit=10) == [b]
    assert slotd.resume_sequence(conn, "h") is False  # not halted any more


def test_a_failed_head_whose_handler_goes_on_releases_the_next(
    conn: psycopg.Connection[Any],
) -> None:
    repo = Repository(conn)
    a = slotd.enqueue(conn, "ord.onward", {}, sequence="g")
    b = slotd.enqueue(conn, "ord.onward", {}, sequence="g")
    head = repo.claim([a], _registry())
    assert head is not None
    repo.record_failure(a, head.token, "boom", linked=True, sequence_go_on=True)
    assert repo.discover(TYPES, limit=10) == [b]


def test_a_lapsed_final_attempt_halts_its_sequence_unless_its_handler_goes_on(
    conn: psycopg.Connection[Any],
) -> None:
    """The lapse sweep ends a member nobody settles as its handler would: a type with
    sequence_on_failure="continue" lets the next run, any other halts (the sweeping
    replica's registry says which, Registry.sequences_go_on)."""
    repo, reg = Repository(conn), _registry()
    assert reg.sequences_go_on == ["ord.onward"]
    onward = [slotd.enqueue(conn, "ord.onward", {}, sequence="go") for _ in range(2)]
    halting = [slotd.enqueue(conn, "ord.step", {}, sequence="stop", max_attempts=1) for _ in "ab"]
    for head in (onward[0], halting[0]):
        assert repo.claim([head], reg) is not None
    conn.execute(
        "UPDATE slotd_tasks SET lease_expires_at = now() - interval '1s' WHERE id = ANY(%s)",
        ([onward[0], halting[0]],),
    )
    swept = lifecycle.lapse(repo, reg.sequences_go_on)
    assert swept == {("ord.onward", "exhausted"): 1, ("ord.step", "exhausted"): 1}
    assert (_state(conn, onward[1]), _state(conn, halting[1])) == ("pending", "waiting")
    halted = conn.execute("SELECT name FROM slotd_sequences WHERE halted_by IS NOT NULL")
    assert halted.fetchall() == [("stop",)]


def test_purging_the_member_that_halted_a_sequence_lets_it_go_on(
    conn: psycopg.Connection[Any],
) -> None:
    repo = Repository(conn)
    a = slotd.enqueue(conn, "ord.once", {}, sequence="p")
    b = slotd.enqueue(conn, "ord.once", {}, sequence="p")
    head = repo.claim([a], _registry())
    assert head is not None
    repo.record_failure(a, head.token, "boom", linked=True)
    assert repo.dead_purge_batch(ids=[a]) == 1
    assert repo.discover(TYPES, limit=10) == [b]


def test_a_dead_retry_of_the_halting_member_runs_it_and_then_the_rest(
    conn: psycopg.Connection[Any],
) -> None:
    repo = Repository(conn)
    a = slotd.enqueue(conn, "ord.once", {}, sequence="d")
    b = slotd.enqueue(conn, "ord.once", {}, sequence="d")
    head = repo.claim([a], _registry())
    assert head is not None
    repo.record_failure(a, head.token, "boom", linked=True)
    assert repo.dead_retry_batch(ids=[a]) == [a]
    assert repo.discover(TYPES, limit=10) == [a]  # the failed one again, before the rest
    again = repo.claim([a], _registry())
    assert again is not None
    repo.dequeue_linked(a, again.token, None, None)  # its success ends the halt
    assert repo.discover(TYPES, limit=10) == [b]
    assert slotd.producer.sequences.sequences(conn, halted=True) == []


def test_a_retried_member_waits_while_its_sequence_has_an_active_head(
    conn: psycopg.Connection[Any],
) -> None:
    repo = Repository(conn)
    a = slotd.enqueue(conn, "ord.onward", {}, sequence="r")
    b = slotd.enqueue(conn, "ord.onward", {}, sequence="r")
    head = repo.claim([a], _registry())
    assert head is not None
    repo.record_failure(a, head.token, "boom", linked=True, sequence_go_on=True)
    running = repo.claim([b], _registry())  # the sequence went on: b runs
    assert running is not None
    assert repo.dead_retry_batch(ids=[a]) == [a]
    assert _state(conn, a) == "waiting"  # not beside b
    assert repo.discover(TYPES, limit=10) == []
    repo.dequeue_linked(b, running.token, None, None)  # b's end: a's turn
    assert repo.discover(TYPES, limit=10) == [a]


def test_an_expired_head_lets_the_next_run(conn: psycopg.Connection[Any]) -> None:
    repo = Repository(conn)
    a = slotd.enqueue(conn, "ord.step", {}, sequence="x", expires_in=timedelta(seconds=30))
    b = slotd.enqueue(conn, "ord.step", {}, sequence="x")
    conn.execute("UPDATE slotd_tasks SET expires_at = now() - interval '1s' WHERE id = %s", (a,))
    assert repo.expire_batch() == {"ord.step": 1}
    assert _state(conn, a) == "expired"
    assert repo.discover(TYPES, limit=10) == [b]


def test_an_enqueue_ending_an_expired_head_by_its_key_sees_a_member_enqueued_meanwhile(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    a = slotd.enqueue(conn, "ord.step", {}, key="k", sequence="y", expires_in=timedelta(seconds=30))
    joining = psycopg.connect(db_url)  # its enqueue holds sequence y's lock to its commit
    ended: list[int] = []
    try:
        b = slotd.enqueue(joining, "ord.step", {}, sequence="y")  # behind a, uncommitted
        # a's expiry passes (the clock cannot be moved; its stamp can).
        conn.execute(
            "UPDATE slotd_tasks SET expires_at = now() - interval '1s' WHERE id = %s", (a,)
        )

        def enqueue_the_key() -> None:
            with psycopg.connect(db_url, autocommit=True) as other:
                ended.append(slotd.enqueue(other, "ord.step", {}, key="k"))

        thread = threading.Thread(target=enqueue_the_key)
        thread.start()
        # Ending a (its expiry, by the key's enqueue) waits for the sequence's lock...
        wait_for(
            lambda: waiting_for(conn, joining.info.backend_pid),
            what="the key's enqueue to wait for the sequence's lock",
        )
        joining.commit()
        thread.join(30)
    finally:
        joining.close()
    # ...so its end saw b, and moved the sequence on to it.
    assert len(ended) == 1 and ended[0] != a
    assert _state(conn, a) == "expired"
    assert _state(conn, b) == "pending"


def test_sequence_refuses_bad_names_and_after(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValueError, match="sequence"):
        slotd.enqueue(conn, "ord.step", {}, sequence="")
    with pytest.raises(TypeError, match="sequence"):
        slotd.enqueue(conn, "ord.step", {}, sequence=7)  # type: ignore[arg-type]
    a = slotd.enqueue(conn, "ord.step", {})
    with pytest.raises(ValueError, match="after="):
        slotd.enqueue(conn, "ord.step", {}, sequence="s", after=[a])
    row = conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()
    assert row is not None and row[0] == 1  # nothing else was written


COMMITS = """
CREATE TABLE order_commits (
    seq text, producer int, i int, at timestamptz NOT NULL DEFAULT clock_timestamp()
)"""


def _produce(db_url: str, producer: int, plan: list[tuple[str, dict[str, Any]]]) -> None:
    """One producer: each task in its own transaction, its commit order recorded in the
    same transaction while the sequence's row is held (so `at` orders a sequence's commits)."""
    rng = random.Random(producer)
    with psycopg.connect(db_url) as conn:
        for i, (seq, extra) in enumerate(plan):
            with conn.transaction():
                payload = {"seq": seq, "producer": producer, "i": i, "sleep": 0.03, **extra}
                slotd.enqueue(
                    conn, "ord.step", payload, sequence=seq, priority=rng.choice([-50, 0, 50])
                )
                conn.execute("SELECT pg_sleep(%s)", (rng.random() * 0.02,))
                conn.execute(
                    "INSERT INTO order_commits (seq, producer, i) VALUES (%s, %s, %s)",
                    (seq, producer, i),
                )


def _runs(conn: psycopg.Connection[Any], seq: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT (payload->>'producer')::int, (payload->>'i')::int, attempt, started_at,"
        " ended_at FROM order_runs WHERE payload->>'seq' = %s ORDER BY started_at",
        (seq,),
    ).fetchall()


def test_two_interleaved_sequences_run_in_commit_order_across_two_replicas(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    conn.execute(RUNS)
    conn.execute(COMMITS)
    for _ in range(2):
        daemons.append(Daemon(db_url, slots=3, app=APP).start())
    # Three producers at once, each task into "a" or "b"; one of a's tasks fails its first
    # attempt (its retry holds the rest of "a").
    plans = []
    for producer in range(3):
        rng = random.Random(100 + producer)
        plans.append([(rng.choice("ab"), {}) for _ in range(10)])
    plans[1][2] = ("a", {"fail_until": 2})
    threads = [
        threading.Thread(target=_produce, args=(db_url, p, plan)) for p, plan in enumerate(plans)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = sum(len(p) for p in plans)

    def drained() -> bool:
        row = conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()
        return row is not None and row[0] == 0

    wait_for(drained, timeout=60, what="every task to succeed")
    row = conn.execute(
        "SELECT count(DISTINCT (payload->>'producer', payload->>'i'))"
        " FROM order_runs WHERE ended_at IS NOT NULL"
    ).fetchone()
    assert row is not None and row[0] == total
    overlapping = False
    for seq in "ab":
        committed = conn.execute(
            "SELECT producer, i FROM order_commits WHERE seq = %s ORDER BY at", (seq,)
        ).fetchall()
        runs = _runs(conn, seq)
        started: list[tuple[int, int]] = []
        for producer, i, _attempt, _start, _end in runs:
            if (producer, i) not in started:
                started.append((producer, i))
        assert started == [tuple(c) for c in committed], f"sequence {seq}: not commit order"
        for before, after in zip(runs, runs[1:], strict=False):
            assert before[4] <= after[3], f"sequence {seq}: {before} overlaps {after}"
        other = _runs(conn, "b" if seq == "a" else "a")
        overlapping |= any(r[3] < o[4] and o[3] < r[4] for r in runs for o in other)
    # The failing task's retry ran before the task committed after it.
    attempts = [(p, i, a) for p, i, a, _, _ in _runs(conn, "a") if (p, i) == (1, 2)]
    assert [a for _, _, a in attempts] == [1, 2]
    assert overlapping, "the two sequences never ran at the same time"


def _slotd(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "slotd", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_a_halted_sequence_is_shown_and_resumed_from_the_command_line(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    conn.execute(RUNS)
    bad = slotd.enqueue(conn, "ord.once", {"seq": "h", "fail": True}, sequence="h")
    nxt = slotd.enqueue(conn, "ord.once", {"seq": "h"}, sequence="h")
    daemons.append(Daemon(db_url, slots=3, app=APP).start())
    wait_for(lambda: _state(conn, bad) == "failed", what="the head to fail")
    assert _state(conn, nxt) == "waiting"
    shown = _slotd(db_url, "status")
    assert shown.returncode == 0, shown.stderr
    assert f"sequences halted: 1: h (task {bad} failed)" in shown.stdout
    listed = _slotd(db_url, "sequences", "--json")
    assert f'"halted_by": {bad}' in listed.stdout
    resumed = _slotd(db_url, "sequences", "resume", "h")
    assert resumed.returncode == 0, resumed.stderr
    wait_for(lambda: _state(conn, nxt) is None, what="the next task to run")  # succeeded
    again = _slotd(db_url, "sequences", "resume", "h")
    assert again.returncode == 1 and "is not halted" in again.stderr


def test_the_dashboard_shows_a_halted_sequence_and_resumes_it(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    from tests.test_dashboard import csrf_of, make_client

    repo = Repository(conn)
    a = slotd.enqueue(conn, "ord.once", {}, sequence="customer:7")
    b = slotd.enqueue(conn, "ord.once", {}, sequence="customer:7")
    head = repo.claim([a], _registry())
    assert head is not None and repo.record_failure(a, head.token, "boom", linked=True).dead
    with make_client(db_url, actions=True) as client:
        overview = client.get("/").text
        assert '<li data-sequence="customer:7">' in overview
        assert f'halted by task <a href="/tasks/{a}">{a}</a> (ord.once)' in overview
        page = client.get(f"/tasks/{b}").text
        assert 'id="resume-sequence"' in page
        form = {"csrf": csrf_of(page), "sequence": "customer:7", "back": f"/tasks/{b}"}
        done = client.post("/sequences/resume", data=form)
        assert done.status_code == 200 and "resumed the sequence" in done.text
        assert _state(conn, b) == "pending" and _state(conn, a) == "failed"
        assert 'data-sequence="customer:7"' not in client.get("/").text
        again = client.post("/sequences/resume", data=form)
        assert "the sequence was not halted" in again.text
        bad = client.post("/sequences/resume", data={**form, "sequence": ""})
        assert bad.status_code == 400 and "bad sequence" in bad.text
        client.app.state.dashboard.close()  # type: ignore[attr-defined]
    with make_client(db_url) as read_only:  # actions off: shown, no button, refused
        page = read_only.get(f"/tasks/{b}").text
        assert 'id="resume-sequence"' not in page
        refused = read_only.post("/sequences/resume", data={"sequence": "customer:7"})
        assert refused.status_code == 403
        read_only.app.state.dashboard.close()  # type: ignore[attr-defined]
