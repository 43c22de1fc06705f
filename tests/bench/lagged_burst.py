"""A burst drained with discovery on a streaming replica, with and without replica lag.

    python tests/bench/lagged_burst.py [--tasks 1000] [--lag 3s] [--runs 2]

A primary and its streaming replica (`pg_basebackup -R`, `recovery_min_apply_delay`), a
`slotd run` with 4 slots and SLOTD_DATABASE_URL_READ on the replica, default 5 s tick. The
burst is enqueued in one transaction; the figure is from its commit to the queue being empty
on the primary, and the read-lane misses the daemon counted."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import slotd  # noqa: E402
from slotd.dev.localpg import scratch  # noqa: E402
from slotd.repository import migrate  # noqa: E402
from tests.daemon import Daemon, wait_for  # noqa: E402
from tests.replica import streaming_replica  # noqa: E402


def left(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()[0])  # type: ignore[index]


def run_once(tasks: int, lag: str | None) -> tuple[float, float]:
    with scratch(prefix="slotd-lag-bench-", port=5437) as primary:
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            migrate(conn)
        with streaming_replica(primary, apply_delay=lag) as replica:
            env = {
                "SLOTD_DATABASE_URL_READ": replica.url(),
                "SLOTD_POLL_INTERVAL": "5s",
                "SLOTD_METRICS_ADDR": "127.0.0.1:0",
            }
            daemon = Daemon(primary.url(), slots=4, env=env)
            try:
                daemon.start()
                metrics = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()
                with psycopg.connect(primary.url()) as conn:
                    slotd.enqueue_many(conn, [("rt.quick", {})] * tasks)
                began = time.monotonic()
                wait_for(lambda: left(primary.url()) == 0, 600, "the burst drained")
                took = time.monotonic() - began
                body = urllib.request.urlopen(metrics, timeout=5).read().decode()
                misses = sum(
                    float(line.split()[-1])
                    for line in body.splitlines()
                    if line.startswith("slotd_read_lane_misses_total")
                )
                return took, misses
            finally:
                daemon.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--lag", default="3s")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for lag in (None, args.lag):
        for n in range(args.runs):
            took, misses = run_once(args.tasks, lag)
            print(
                f"lag {lag or 'none'} run {n + 1}: {args.tasks} tasks drained in {took:.2f}s "
                f"({args.tasks / took:.0f}/s); read-lane misses {misses:g}",
                flush=True,
            )


if __name__ == "__main__":
    main()
