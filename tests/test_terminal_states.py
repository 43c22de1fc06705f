"""Terminal states are explicit (sql/021, slotd/lifecycle/ "dead letters"): a dead letter says
why it stopped (exhausted, cancelled) and how many attempts it really ran. For this release a
cancel still raises attempt_count to the threshold (0.1.0 replicas tell dead from live by it),
so every reader shows dead_attempts instead: a task cancelled during its first attempt reads
"attempts 1", never "attempts 20" beside "while attempt 1 was running"."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.registry import Registry
from slotd.repository import Repository, migrations
from tests.daemon import Daemon, wait_for
from tests.test_control_runtime import cli


def dead_letter(db_url: str, task_id: int) -> dict[str, Any]:
    done = cli(db_url, "dead", "list", "--id", str(task_id), "--json")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    return dict(row)


def started(conn: psycopg.Connection[Any], task_id: int) -> int:
    row = conn.execute(
        "SELECT count(*) FROM executions WHERE phase = 'start' AND task_id = %s", (task_id,)
    ).fetchone()
    return int(row[0]) if row else 0


def settled(conn: psycopg.Connection[Any], task_id: int) -> bool:
    row = conn.execute(
        "SELECT lease_token IS NULL AND attempt_count >= max_attempts FROM slotd_tasks "
        "WHERE id = %s",
        (task_id,),
    ).fetchone()
    return bool(row and row[0])


def test_a_task_cancelled_while_running_is_a_dead_letter_cancelled_after_the_attempts_it_ran(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemons.append(daemon := Daemon(db_url, slots=1))
    daemon.start()
    task_id = slotd.enqueue(qconn, "rt.polite")
    wait_for(lambda: started(qconn, task_id) == 1, what="the handler to start")
    assert cli(db_url, "cancel", "--id", str(task_id)).returncode == 0
    wait_for(lambda: settled(qconn, task_id), what="the cancel's settlement")
    dead = dead_letter(db_url, task_id)
    assert (dead["dead_reason"], dead["attempt_count"]) == ("cancelled", 1)
    assert "while attempt 1 was running" in dead["last_error"]
    table = cli(db_url, "dead", "list").stdout.splitlines()
    assert table[0].split()[:4] == ["ID", "TYPE", "REASON", "ATTEMPTS"]
    assert table[1].split()[:4] == [str(task_id), "rt.polite", "cancelled", "1"]
    answer = cli(db_url, "result", str(task_id), "--json")
    assert json.loads(answer.stdout)["state"] == "cancelled"


def test_a_task_out_of_attempts_is_a_dead_letter_exhausted_after_all_of_them(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemons.append(daemon := Daemon(db_url, slots=1))
    daemon.start()
    task_id = slotd.enqueue(qconn, "rt.fail_limited")  # max_attempts=2, 10 ms backoff
    wait_for(lambda: settled(qconn, task_id), what="both attempts to fail")
    dead = dead_letter(db_url, task_id)
    assert (dead["dead_reason"], dead["attempt_count"]) == ("exhausted", 2)
    assert json.loads(cli(db_url, "result", str(task_id), "--json").stdout)["state"] == "failed"


def test_a_pending_task_cancelled_shows_no_attempts_and_retry_clears_its_reason(
    conn: psycopg.Connection[Any], db_url: str, repo: Repository
) -> None:
    task_id = slotd.enqueue(conn, "report")
    assert slotd.cancel(conn, task_id, by="ops")
    raw = conn.execute(
        "SELECT attempt_count, max_attempts, dead_reason, dead_attempts FROM slotd_tasks "
        "WHERE id = %s",
        (task_id,),
    ).fetchone()
    assert raw is not None
    # The raise stays, for the 0.1.0 replicas' claim; the real count is beside it.
    assert raw[0] >= raw[1] and raw[2:] == ("cancelled", 0)
    [dead] = repo.dead_list()
    assert (dead["dead_reason"], dead["attempt_count"]) == ("cancelled", 0)
    assert repo.dead_retry_batch(ids=[task_id]) == [task_id]
    after = conn.execute(
        "SELECT attempt_count, dead_reason, dead_attempts, cancelled_at FROM slotd_tasks "
        "WHERE id = %s",
        (task_id,),
    ).fetchone()
    assert after == (0, None, None, None)


def test_a_claim_cancelled_before_its_handler_started_stays_dead_when_released_at_shutdown(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    # The shutdown gives an unstarted claim its attempt back; a cancel that came in between
    # raised the count to the threshold, and giving one back would have made it live again.
    reg = Registry()
    reg.register("report", lambda task, ctx: None, ceiling=timedelta(minutes=1), max_attempts=1)
    task_id = slotd.enqueue(conn, "report")
    claimed = repo.claim(repo.discover(reg.types), reg)
    assert claimed is not None and claimed.id == task_id
    assert slotd.cancel(conn, task_id, by="ops")
    assert repo.release(task_id, claimed.token, "shutdown", unstarted=True) is True
    assert repo.discover(reg.types) == []
    [dead] = repo.dead_list()
    assert (dead["id"], dead["dead_reason"], dead["attempt_count"]) == (task_id, "cancelled", 1)


def test_the_migration_gives_dead_letters_kept_before_it_their_reason_and_real_count(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    # Dead letters as a 0.1.0 replica left them: no reason, a cancel's count raised.
    cancelled, exhausted, running = slotd.enqueue_many(
        conn, [("report", {}), ("report", {}), ("report", {})]
    )
    conn.execute(
        "UPDATE slotd_tasks SET attempt_count = max_attempts, cancelled_at = now(), "
        "last_error = 'cancelled by ops at 2026-11-30T10:00:00Z after 2 attempt(s)' "
        "WHERE id = %s",
        (cancelled,),
    )
    conn.execute(
        "UPDATE slotd_tasks SET attempt_count = max_attempts, last_error = 'boom' WHERE id = %s",
        (exhausted,),
    )
    conn.execute(  # on its final attempt under a live lease: not dead, left alone
        "UPDATE slotd_tasks SET attempt_count = max_attempts, lease_token = %s, "
        "lease_expires_at = now() + interval '1 hour' WHERE id = %s",
        (uuid.uuid4(), running),
    )
    [body] = [b for version, _, b in migrations() if version == 21]
    conn.execute(body)
    found = dict(
        (r[0], r[1:])
        for r in conn.execute(
            "SELECT id, dead_reason, dead_attempts FROM slotd_tasks ORDER BY id"
        ).fetchall()
    )
    assert found[cancelled] == ("cancelled", 2)
    assert found[exhausted][0] == "exhausted"
    assert found[running] == (None, None)


def test_the_dashboard_shows_a_dead_letters_reason_and_the_attempts_it_ran(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    pytest.importorskip("starlette", reason="the dashboard needs the web extra")
    from tests.test_dashboard import make_client

    task_id = slotd.enqueue(conn, "report")
    assert slotd.cancel(conn, task_id, by="ops")
    with make_client(db_url) as client:
        page = client.get(f"/tasks/{task_id}").text
        listing = client.get("/dead").text
        client.app.state.dashboard.close()  # type: ignore[attr-defined]
    assert '<dd id="dead-reason">cancelled</dd>' in page
    assert "<dd>0 of 20</dd>" in page
    assert '<td class="reason">cancelled</td>' in listing
