"""Limits the worker owns: the claim stamps the claiming worker's threshold, a handler's
own options win over the worker's settings, a producer's explicit max_attempts wins over
both, and every reader of a numeric setting refuses a bad value the same way."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.repository import Repository
from tests.daemon import ROOT, Daemon, wait_for
from tests.test_runtime import start, starts, task_row

FAST_RETRY = {"SLOTD_BACKOFF_BASE": "10ms", "SLOTD_BACKOFF_CAP": "20ms"}


def dead_after(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any]:
    return wait_for(
        lambda: (
            (row := task_row(conn, task_id))
            and row["lease_token"] is None
            and row["attempt_count"] >= row["max_attempts"]
            and row
        ),
        what="the dead letter",
    )


@pytest.mark.parametrize(
    ("task_type", "enqueue_attempts", "expected"),
    [
        ("rt.fail", None, 4),  # the daemon's SLOTD_MAX_ATTEMPTS, not the producer's 20
        ("rt.fail_limited", None, 2),  # the handler's own max_attempts (and backoff)
        ("rt.fail", 3, 3),  # the producer asked explicitly
    ],
)
def test_the_claiming_worker_owns_the_dead_letter_threshold(
    qconn: psycopg.Connection[Any],
    db_url: str,
    daemons: list[Daemon],
    monkeypatch: pytest.MonkeyPatch,
    task_type: str,
    enqueue_attempts: int | None,
    expected: int,
) -> None:
    monkeypatch.delenv("SLOTD_MAX_ATTEMPTS", raising=False)  # the producer has none
    env = {"SLOTD_MAX_ATTEMPTS": "4"}
    if task_type == "rt.fail":
        env.update(FAST_RETRY)  # rt.fail_limited's own backoff must do without it
    start(daemons, db_url, slots=1, env=env)
    task_id = slotd.enqueue(qconn, task_type, max_attempts=enqueue_attempts)
    row = dead_after(qconn, task_id)
    assert (row["attempt_count"], row["max_attempts"]) == (expected, expected)
    assert len(starts(qconn, task_id)) == expected
    assert f"attempt {expected} failed" in row["last_error"]
    # The fleet view agrees with the worker that ran it.
    assert Repository(qconn).gauges()["dead"] == {task_type: 1}


def test_handler_options_are_validated_at_registration() -> None:
    reg = slotd.Registry()
    minute = timedelta(minutes=1)

    def fn(task: slotd.Task, ctx: slotd.Context) -> None: ...

    for bad in (0, -1, True, "3", 2.5):
        with pytest.raises(ValueError, match="max_attempts"):
            reg.register("t", fn, ceiling=minute, max_attempts=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backoff_base"):
        reg.register("t", fn, ceiling=minute, backoff_base=timedelta(0))
    with pytest.raises(ValueError, match="backoff_cap"):
        reg.register("t", fn, ceiling=minute, backoff_cap=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shorter"):
        reg.register("t", fn, ceiling=minute, backoff_base=minute, backoff_cap=timedelta(seconds=1))
    reg.register("t", fn, ceiling=minute, max_attempts=3, backoff_base=timedelta(seconds=1))
    assert reg.max_attempts(20) == [3]


@pytest.mark.parametrize("raw", ["abc", "0", "-3", "1_0", "5x", ""])
def test_a_bad_max_attempts_is_refused_alike_by_producer_and_cli(
    conn: psycopg.Connection[Any], db_url: str, monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    if raw == "":
        raw = "\u0665"  # an Arabic-Indic digit: isdigit() says yes, the setting says no
    monkeypatch.setenv("SLOTD_MAX_ATTEMPTS", raw)
    with pytest.raises(ValueError, match=f"bad SLOTD_MAX_ATTEMPTS {raw!r}"):
        slotd.enqueue(conn, "rt.noop")
    cli = subprocess.run(
        [sys.executable, "-m", "slotd", "enqueue", "rt.noop"],
        env={"PATH": "/usr/bin:/bin", "SLOTD_DATABASE_URL": db_url, "SLOTD_MAX_ATTEMPTS": raw},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 2
    (line,) = cli.stderr.strip().splitlines()
    assert line.startswith(f"slotd: bad SLOTD_MAX_ATTEMPTS {raw!r}: ")
    assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,)


def test_producer_stamp_is_provisional_unless_explicit(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTD_MAX_ATTEMPTS", " 5 ")  # blanks around digits are fine everywhere
    plain = slotd.enqueue(conn, "rt.noop")
    pinned = slotd.enqueue(conn, "rt.noop", max_attempts=7)
    rows = conn.execute(
        "SELECT id, max_attempts, max_attempts_explicit FROM slotd_tasks ORDER BY id"
    ).fetchall()
    assert rows == [(plain, 5, False), (pinned, 7, True)]
    for bad in (0, True, "3"):
        with pytest.raises(ValueError, match="max_attempts"):
            slotd.enqueue(conn, "rt.noop", max_attempts=bad)  # type: ignore[arg-type]


def test_upgrade_keeps_live_non_default_stamps_and_lets_the_worker_restamp_the_rest(
    scratch_pg: Any,
) -> None:
    from slotd.repository import create_database, migrations

    with psycopg.connect(scratch_pg.server.url(), autocommit=True) as admin:
        create_database(admin, "slotd_upgrade_004")
    with psycopg.connect(scratch_pg.server.url("slotd_upgrade_004"), autocommit=True) as conn:
        for version, _name, body in migrations():
            if version < 4:  # the schema as a deployment of the previous version has it
                conn.execute(body)  # type: ignore[arg-type]
        conn.execute(
            "INSERT INTO slotd_tasks (task_type, max_attempts, attempt_count) VALUES"
            " ('audit', 20, 0), ('audit', 3, 1), ('audit', 3, 3)"
        )
        conn.execute(next(b for v, _, b in migrations() if v == 4))  # type: ignore[arg-type]
        rows = conn.execute(
            "SELECT max_attempts, attempt_count, max_attempts_explicit FROM slotd_tasks ORDER BY id"
        ).fetchall()
        # The default stamp is the worker's to replace; a live non-default one was asked for.
        assert rows == [(20, 0, False), (3, 1, True), (3, 3, False)]
        for version, _name, body in migrations():
            if version > 4:  # the rest of this version's schema, for its claim statement
                conn.execute(body)  # type: ignore[arg-type]
        reg = slotd.Registry()
        reg.register("audit", lambda task, ctx: None, ceiling=timedelta(minutes=1))
        repo = Repository(conn, max_attempts=4)
        claimed = [repo.claim(repo.discover(reg.types), reg) for _ in range(2)]
        assert sorted((c.attempt, c.max_attempts) for c in claimed if c) == [(1, 4), (2, 3)]


def test_a_dead_slots_failed_attempt_backs_off_by_its_types_own_backoff(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    """The slot dies between its handler's failure and the settlement (every time, here):
    the supervisor settles the attempt by the outcome the slot left, and backs it off by
    the type's own backoff (10-20 ms for rt.fail_limited), as the slot itself would have,
    not by the worker's 30 s default."""
    env = {"SLOTD_ALLOW_FAULTS": "1", "SLOTD_FAULT_SLOT_CRASH": "1.0"}
    start(daemons, db_url, slots=1, env=env)
    task_id = slotd.enqueue(qconn, "rt.fail_limited")
    row = wait_for(
        lambda: (
            (row := task_row(qconn, task_id))
            and row["lease_token"] is None
            and row["attempt_count"] >= 1
            and row
        ),
        what="the first attempt settled by the supervisor",
    )
    assert "attempt 1 failed" in (row["last_error"] or "")
    gap = (row["run_at"] - row["last_attempted_at"]).total_seconds()
    assert gap < 1.0, gap  # the worker's default would be >= 27 s (30 s less jitter)
    row = dead_after(qconn, task_id)
    assert (row["attempt_count"], row["max_attempts"]) == (2, 2)
