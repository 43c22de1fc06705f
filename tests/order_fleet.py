"""The order tests' fleet (#39): two `slotd run` replicas of 3 slots serving
tests/apps/order.py's registry, with the table its handlers record their runs in."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.apps.order import RUNS
from tests.daemon import Daemon

APP = "tests.apps.order:registry"


def two_replicas(conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]) -> None:
    """order_runs created, then 2 replicas x 3 slots started (the caller's fixture stops
    them)."""
    conn.execute(RUNS)
    for _ in range(2):
        daemons.append(Daemon(db_url, slots=3, app=APP).start())


def runs_ended(conn: psycopg.Connection[Any]) -> int:
    """How many runs the handlers recorded as ended."""
    row = conn.execute("SELECT count(*) FROM order_runs WHERE ended_at IS NOT NULL").fetchone()
    return int(row[0]) if row else 0
