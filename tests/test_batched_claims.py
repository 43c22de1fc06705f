"""Batches at depth, leases per task (#43), through a real `slotd run`: a deep backlog of
short tasks is claimed several per statement, each task under its own token, lease and
deadline, and run once; a kill -9 of a slot holding a batch and a SIGTERM with a batch in
hand give the batch back at once (the rule book's "batched", slotd/lifecycle/__init__.py)."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from typing import Any

import psycopg

import slotd
from slotd.repository import Repository, lease_tokens
from tests.daemon import FAST, ROOT, Daemon, wait_for


def start(daemons: list[Daemon], db_url: str, **kw: Any) -> Daemon:
    daemon = Daemon(db_url, **kw)
    daemons.append(daemon)
    return daemon.start()


def runs(conn: psycopg.Connection[Any]) -> list[tuple[int, int, str]]:
    """(task id, attempt, note) of every start: note is the claim's stamp, the lease's token
    and the lease's length in seconds, as the handler read its own row."""
    return conn.execute(
        "SELECT task_id, attempt, note FROM executions WHERE phase = 'start' ORDER BY at"
    ).fetchall()


def drained(conn: psycopg.Connection[Any]) -> bool:
    return conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,)


def test_a_deep_backlog_is_claimed_in_batches_each_task_under_its_own_lease(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    start(daemons, db_url, slots=1)
    ids = slotd.enqueue_many(qconn, [("rt.tally", {"n": n}) for n in range(300)])
    wait_for(lambda: drained(qconn), timeout=60, what="the backlog to drain")
    seen = runs(qconn)
    assert sorted(task_id for task_id, _, _ in seen) == sorted(ids)  # each once
    stamps = collections.Counter(note.split("|")[0] for _, _, note in seen)
    tokens = {note.split("|")[1] for _, _, note in seen}
    # Several tasks claimed by one statement (one transaction's now()), each its own token,
    # each lease the type's ceiling + the margin from its claim's stamp.
    assert max(stamps.values()) >= 2, stamps
    assert len(tokens) == len(ids)
    margin = 3.0  # the tests' SLOTD_LEASE_MARGIN (tests.daemon.FAST)
    assert {float(note.split("|")[2]) for _, _, note in seen} == {30.0 + margin}


def test_claim_batch_one_claims_a_deep_backlog_one_task_per_statement(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """SLOTD_CLAIM_BATCH=1 turns batching off: the same backlog as above, each task claimed
    by a statement of its own (a transaction's own now()); 2 claims as many as it can."""
    start(daemons, db_url, slots=1, env={"SLOTD_CLAIM_BATCH": "1"})
    slotd.enqueue_many(qconn, [("rt.tally", {"n": n}) for n in range(300)])
    wait_for(lambda: drained(qconn), timeout=60, what="the backlog to drain")
    stamps = collections.Counter(note.split("|")[0] for _, _, note in runs(qconn))
    assert len(stamps) == 300 and set(stamps.values()) == {1}


def test_a_claim_batch_out_of_range_is_one_line_exit_2(db_url: str) -> None:
    env = {**os.environ, "SLOTD_DATABASE_URL": db_url, "SLOTD_CLAIM_BATCH": "21"}
    run = subprocess.run(
        [sys.executable, "-m", "slotd", "run", "--app", "tests.apps.runtime:registry"],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        "slotd: SLOTD_CLAIM_BATCH must be between 1 and 20"
    ], run.stderr


def test_at_low_load_a_wake_claims_one_task(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    start(daemons, db_url, slots=2, env=FAST)
    for n in range(6):
        slotd.enqueue(qconn, "rt.tally", {"n": n})
        wait_for(lambda: drained(qconn), what="the task to run")
    stamps = collections.Counter(note.split("|")[0] for _, _, note in runs(qconn))
    assert len(stamps) == 6 and set(stamps.values()) == {1}


def _stopped_in_batch(
    qconn: psycopg.Connection[Any], stop: str
) -> tuple[int, list[int], list[int]]:
    """A backlog of short tasks, each ready to stop its slot ("kill") or its replica
    ("term") on its first attempt: the first that runs while its slot holds a prefetched
    batch does, and hangs. (that task, every task, the prefetched ones it saw)."""
    ids = slotd.enqueue_many(qconn, [("rt.tally", {"stop_in_batch": stop})] * 200)
    blocked, note = wait_for(
        lambda: qconn.execute(
            "SELECT task_id, note FROM executions WHERE phase = 'blocked'"
        ).fetchone(),
        what="a task to stop its slot with a batch in hand",
    )
    return blocked, ids, [int(i) for i in note.split(",")]


def _leases(conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT id, attempt_count, lease_token FROM slotd_tasks WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


def test_kill_9_of_a_slot_holding_a_batch_gives_it_back_at_once(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # Ceiling 30 s + margin 60 s: a lease left to lapse would take 90 s.
    env = {"SLOTD_LEASE_MARGIN": "60s", "SLOTD_BACKOFF_BASE": "1s", "SLOTD_BACKOFF_CAP": "2s"}
    daemon = start(daemons, db_url, slots=1, env=env)
    blocked, ids, prefetched = _stopped_in_batch(qconn, "kill")
    daemon.wait_line(r"slot 0 killed by SIGKILL; restarting it")
    # Settled by the supervisor from the dead slot's ledger, not left to lapse: the
    # prefetched tasks released with their attempt given back, the successes it held
    # dequeued (never run again), the one that killed it settled as crashed and retried.
    wait_for(lambda: drained(qconn), timeout=40, what="every task, the batch given back")
    seen = collections.Counter(task_id for task_id, _, _ in runs(qconn))
    assert set(seen) == set(ids)
    assert seen[blocked] == 2
    assert {n for task_id, n in seen.items() if task_id != blocked} == {1}  # nothing twice
    attempt = {task_id: n for task_id, n, _ in runs(qconn)}
    assert prefetched and all(attempt[task_id] == 1 for task_id in prefetched)


def test_sigterm_releases_a_prefetched_batch_at_once(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    env = {"SLOTD_SHUTDOWN_GRACE": "20s", "SLOTD_METRICS_ADDR": "off"}
    daemon = start(daemons, db_url, slots=1, env=env)
    blocked, _, prefetched = _stopped_in_batch(qconn, "term")
    # At the SIGTERM, not after the running attempt's shutdown grace: the prefetched tasks
    # are free again, no lease, their claims' attempts given back, due for any replica.
    daemon.wait_line(r"released unstarted: the replica is stopping", timeout=10)
    leases = _leases(qconn, prefetched)
    assert leases and all(lease is None and n == 0 for n, lease in leases.values()), leases
    assert _leases(qconn, [blocked])[blocked][1] is not None  # still running, still leased


def test_a_batched_claim_takes_only_types_without_limits_rates_or_turns(
    conn: psycopg.Connection[Any],
) -> None:
    """Shared limits, rates and fair turns (#39) are decided one claim at a time: a batched
    claim passes those types over and takes the rest, each under its own token."""
    from tests.apps.order import registry

    kinds = ["ord.model_a", "ord.rated_a", "ord.grouped_a", "ord.fair", "ord.step"]
    ids = slotd.enqueue_many(conn, [(kind, {}) for kind in kinds for _ in range(3)])
    repo = Repository(conn)
    claims = repo.claim_many(ids, registry, lease_tokens(20))
    assert {c.task_type for c in claims} == {"ord.step"}
    assert len(claims) == 3 and len({c.token for c in claims}) == 3
