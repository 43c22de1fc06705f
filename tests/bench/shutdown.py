"""SIGTERM-to-exit of `slotd run` with 4 busy slots, cooperative and stubborn handlers.

    python tests/bench/shutdown.py

Starts its own PostgreSQL; prints one line per case (median of 3 runs)."""

from __future__ import annotations

import signal
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import slotd  # noqa: E402
from slotd.dev.localpg import scratch  # noqa: E402
from slotd.repository import migrate  # noqa: E402
from tests.daemon import EXECUTIONS, Daemon, wait_for  # noqa: E402


def one(url: str, task_type: str, grace: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM slotd_tasks")
        conn.execute("DELETE FROM executions")
        daemon = Daemon(url, slots=4, env={"SLOTD_SHUTDOWN_GRACE": grace}).start()
        try:
            slotd.enqueue_many(conn, [(task_type, {}) for _ in range(4)])
            wait_for(
                lambda: conn.execute("SELECT count(*) FROM executions").fetchone() == (4,),
                what="4 busy slots",
            )
            began = time.perf_counter()
            daemon.signal(signal.SIGTERM)
            assert daemon.wait(60) == 0
            took = time.perf_counter() - began
            leased = conn.execute(
                "SELECT count(*) FROM slotd_tasks WHERE lease_token IS NOT NULL"
            ).fetchone()
            assert leased == (0,), "a lease was left behind"
            return took
        finally:
            daemon.close()


def main() -> None:
    with scratch(prefix="slotd-shutdown-", port=5434, fast=False) as server:
        url = server.url()
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            conn.execute(EXECUTIONS)
        for task_type, grace in (("rt.polite", "25s"), ("rt.stubborn_long", "2s")):
            runs = [one(url, task_type, grace) for _ in range(3)]
            print(
                f"{task_type:18} grace {grace:>4}: SIGTERM to exit "
                f"median {statistics.median(runs) * 1000:.0f} ms "
                f"(runs: {', '.join(f'{r * 1000:.0f}' for r in runs)} ms), every lease released"
            )


if __name__ == "__main__":
    main()
