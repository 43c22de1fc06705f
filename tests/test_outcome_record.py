"""What replicas record for the dashboard: every attempt a replica saw reaches the outcome
record (slotd_outcomes) within seconds while it runs and the last ones at its shutdown,
whatever the heartbeat interval, and so do its lease holders; lost and crashed attempts are
flagged; the fleet samples its backlog once a minute, bounded and pruned."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from typing import Any

import psycopg

import slotd
from tests.daemon import ROOT, Daemon, wait_for


def recorded(conn: psycopg.Connection[Any], task_type: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT outcome, sum(count) FROM slotd_outcomes WHERE task_type = %s GROUP BY 1",
        (task_type,),
    )
    return {outcome: int(n) for outcome, n in rows}


def counted(metrics_url: str, task_type: str) -> dict[str, int]:
    with urllib.request.urlopen(metrics_url, timeout=5) as reply:
        text = reply.read().decode()
    series = rf'slotd_task_outcomes_total\{{outcome="(\w+)",task_type="{re.escape(task_type)}"\}}'
    pattern = series + r" ([\d.e+]+)"
    return {o: int(float(n)) for o, n in re.findall(pattern, text) if float(n)}


def test_outcomes_reach_the_record_within_seconds_and_at_shutdown(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = Daemon(
        db_url,
        slots=2,
        env={
            "SLOTD_HEARTBEAT_INTERVAL": "50s",  # far beyond the waits below
            "SLOTD_METRICS_ADDR": "127.0.0.1:0",
            "SLOTD_ALLOW_FAULTS": "1",
            "SLOTD_FAULT_CRASH": "0.3",  # runners die under their handlers: `crashed`
            "SLOTD_BACKOFF_BASE": "10ms",
            "SLOTD_BACKOFF_CAP": "50ms",
        },
    )
    daemons.append(daemon)
    daemon.start()
    metrics = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()
    slotd.enqueue_many(qconn, [("rt.quick", {}) for _ in range(20)])
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
        timeout=120,
        what="20 tasks through crashing runners",
    )
    # The supervisor hears of the last settlements at the slots' next bell.
    wait_for(
        lambda: counted(metrics, "rt.quick").get("success") == 20,
        what="the replica to count every success",
    )
    # Within seconds (2 s, and a loaded machine's slack), long before the next heartbeat
    # at 50 s: every outcome the replica counted, compared with its counters as they are
    # now. A crash on one slot can reach the supervisor after the retry's success on
    # another (each slot's records come at its own next bell), so the counters at the
    # moment success reached 20 may still be one crash short of what follows.
    both: dict[str, Any] = {}

    def agreed() -> dict[str, int] | None:
        both["record"], both["counters"] = recorded(qconn, "rt.quick"), counted(metrics, "rt.quick")
        return both["counters"] if both["record"] == both["counters"] else None

    try:
        seen = wait_for(agreed, timeout=25, what="the record")
    except AssertionError:
        raise AssertionError(both) from None
    assert seen.get("crashed") and seen["success"] == 20, seen

    def status(*args: str) -> str:
        command = [sys.executable, "-m", "slotd", "status", *args]
        done = subprocess.run(command, env=daemon.env, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert f"! {seen['crashed']} crashed: runners died" in status()
    report = json.loads(status("--json"))
    assert report["outcomes"]["by_outcome"]["crashed"] == seen["crashed"]

    # An attempt that ends in the shutdown itself, moments before the replica exits.
    polite = slotd.enqueue(qconn, "rt.polite", {}, max_attempts=50)
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM executions").fetchone()[0],
        what="the polite handler to start",
    )
    # Its holder is on record within seconds too, not at the next heartbeat.
    wait_for(
        lambda: qconn.execute(
            "SELECT count(*) FROM slotd_replicas WHERE leases ? %s", (str(polite),)
        ).fetchone()[0],
        timeout=25,
        what="the lease's slot in slotd_replicas",
    )
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(60) == 0
    assert recorded(qconn, "rt.polite").get("cancelled") == 1  # (a crash before it may count too)


def test_the_backlog_is_sampled_once_a_minute_for_the_fleet_and_pruned(
    conn: psycopg.Connection[Any],
) -> None:
    from slotd.repository import Repository
    from slotd.repository import history as record

    slotd.enqueue_many(conn, [("report", {}) for _ in range(3)] + [("audit", {})])
    conn.execute("UPDATE slotd_tasks SET run_at = now() - interval '90 seconds'")
    conn.execute(
        "INSERT INTO slotd_queue_history VALUES (now() - interval '26 hours', 'old', 1, 0, 0), "
        "(now() - interval '23 hours', 'kept', 1, 0, 0)"  # the dashboard's last day
    )
    first, second = Repository(conn), Repository(conn)  # two replicas in the same minute
    assert record.sample_history(first) == 2
    assert record.sample_history(second) == 0  # the minute is taken: nothing counted again
    rows = conn.execute(
        "SELECT task_type, pending, running, oldest_due_s FROM slotd_queue_history "
        "WHERE task_type <> 'kept' ORDER BY task_type"
    ).fetchall()
    assert [(t, p, r) for t, p, r, _ in rows] == [("audit", 1, 0), ("report", 3, 0)]
    assert conn.execute(
        "SELECT count(*) FROM slotd_queue_history WHERE task_type = 'kept'"
    ).fetchone() == (1,)
    assert all(89 <= due < 200 for *_, due in rows)  # the old minute was pruned as well
