"""The "Workflows as code" example (examples/order_flow) through a real `slotd run` and its
own command lines: charged once, waits for the approval, ships, sleeps, reminds."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import psycopg

from tests.daemon import ROOT, Daemon, wait_for

APP = "examples.order_flow.workflow:registry"


def _run(db_url: str, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "examples.order_flow.workflow", *args],
        env={**env, "USER": "ann"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _log(conn: psycopg.Connection[Any]) -> list[str]:
    if conn.execute("SELECT to_regclass('order_log')").fetchone()[0] is None:  # type: ignore[index]
        return []
    return [r[0] for r in conn.execute("SELECT what FROM order_log ORDER BY at").fetchall()]


def test_the_order_flow_charges_waits_ships_sleeps_and_reminds(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = Daemon(db_url, slots=1, app=APP, env={"ORDER_REMIND_AFTER": "2"})
    daemons.append(daemon.start())
    task_id = int(_run(db_url, "start", "7"))
    wait_for(lambda: _log(conn) == ["charged"], what="the charge")
    daemon.wait_line(rf"order\.flow#{task_id} attempt 1: suspended")
    assert _run(db_url, "approve", "7") == "1"  # woke the waiting order
    wait_for(lambda: len(_log(conn)) == 3, what="shipped, then the sleep, then the reminder")
    assert _log(conn) == ["charged", "shipped (approved by ann)", "reminded"]
    daemon.wait_line(rf"order\.flow#{task_id} attempt 1: success")
