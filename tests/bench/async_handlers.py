"""async def handlers beside sync ones: drain rate of no-op tasks, and how long after its
deadline an interrupted handler's attempt is settled.

    python tests/bench/async_handlers.py [--n 3000] [--slots 4] [--rounds 3]

Starts its own PostgreSQL (fsync on), runs `slotd run --app tests.bench.app:registry` as
users run it, prints one line per figure. Short on purpose: a minute or two on 2 cores."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd.dev.localpg import scratch  # noqa: E402
from slotd.repository import NewTask, enqueue_many, migrate  # noqa: E402
from tests.daemon import Daemon, wait_for  # noqa: E402

BASE_S = 10  # backoff base with no jitter: the settlement time is run_at minus this


def drain(conn: psycopg.Connection, url: str, task_type: str, n: int, slots: int) -> float:
    """Tasks per second: n no-op tasks bulk-enqueued into an idle daemon, to an empty queue."""
    daemon = Daemon(url, slots=slots, app="tests.bench.app:registry").start()
    try:
        began = time.perf_counter()
        with conn.transaction():
            enqueue_many(conn, [NewTask(task_type) for _ in range(n)])
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
            timeout=600,
            what="the drain",
        )
        return n / (time.perf_counter() - began)
    finally:
        daemon.close()


def interrupt_to_settle(conn: psycopg.Connection, url: str, task_type: str) -> float:
    """Seconds from the handler's deadline to its attempt settled as a timeout."""
    env = {"SLOTD_BACKOFF_BASE": f"{BASE_S}s", "SLOTD_BACKOFF_JITTER": "0"}
    daemon = Daemon(url, slots=1, app="tests.bench.app:registry", env=env).start()
    try:
        (task_id,) = enqueue_many(conn, [NewTask(task_type)])
        row = wait_for(
            lambda: conn.execute(
                "SELECT extract(epoch FROM run_at)::float8 - %s,"
                " extract(epoch FROM lease_expires_at)::float8 FROM slotd_tasks"
                " WHERE id = %s AND last_error IS NOT NULL",
                (BASE_S, task_id),
            ).fetchone(),
            what="the timeout settlement",
        )
        settled_at = row[0]
        line = daemon.wait_line(rf"deadline {task_id} ")
        deadline = float(line.rsplit(" ", 1)[1])
        conn.execute("DELETE FROM slotd_tasks")
        return settled_at - deadline
    finally:
        daemon.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with scratch(prefix="slotd-async-bench-", port=5436, fast=False) as server:
        url = server.url()
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            # Interleaved rounds: on a shared machine the load drifts, and both kinds see it.
            kinds = ("bench.noop", "bench.async_noop")
            rates: dict[str, list[float]] = {kind: [] for kind in kinds}
            for _ in range(args.rounds):
                for kind in kinds:
                    rates[kind].append(drain(conn, url, kind, args.n, args.slots))
            for kind in kinds:
                print(
                    f"drain {kind:17} {args.n} tasks, {args.slots} slots: median "
                    f"{statistics.median(rates[kind]):,.0f} tasks/s "
                    f"(runs: {', '.join(f'{r:,.0f}' for r in rates[kind])})"
                )
            for task_type in ("bench.sleep", "bench.async_sleep"):
                took = [interrupt_to_settle(conn, url, task_type) for _ in range(args.rounds)]
                print(
                    f"deadline to settled timeout {task_type:17}: median "
                    f"{statistics.median(took) * 1000:.0f} ms "
                    f"(runs: {', '.join(f'{t * 1000:.0f}' for t in took)} ms)"
                )


if __name__ == "__main__":
    main()
