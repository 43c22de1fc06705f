"""How late a delayed task and a backoff start on an idle fleet (#41 item 6).

    python tests/bench/timers.py [--rounds 6] [--delay 2] [--checkout DIR]

A private PostgreSQL, one idle `slotd run --slots 4` with production timing (5 s poll),
then, one at a time and each at a random moment of the poll's cycle: a task enqueued with
`delay`, and a task whose first attempt fails with a `delay` backoff (SLOTD_BACKOFF_BASE =
CAP = delay, no jitter beyond slotd's own). The lag is the handler's start minus the row's
run_at, both by the database's clock. `--checkout DIR` runs another checkout's slotd (a git
worktree of an older commit) for a before/after."""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=6)
parser.add_argument("--delay", type=float, default=2.0)
parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[2])
args = parser.parse_args()
sys.path.insert(0, str(args.checkout))

import slotd  # noqa: E402
from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.repository import migrate  # noqa: E402
from tests.daemon import EXECUTIONS, Daemon, wait_for  # noqa: E402


def started(conn: psycopg.Connection[Any], task_id: int, attempt: int) -> Any:
    row = conn.execute(
        "SELECT at FROM executions WHERE task_id = %s AND attempt = %s AND phase = 'start'",
        (task_id, attempt),
    ).fetchone()
    return row[0] if row else None


def backed_off(conn: psycopg.Connection[Any], task_id: int) -> Any:
    return conn.execute(
        "SELECT run_at FROM slotd_tasks WHERE id = %s AND attempt_count = 1"
        " AND lease_token IS NULL",
        (task_id,),
    ).fetchone()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="slotd-timers-"))
    tmp.chmod(0o711)
    server = LocalPostgres(tmp / "pg", tmp / "sock", port=5453)
    server.start()
    lags: dict[str, list[float]] = {"delay": [], "backoff": []}
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            migrate(conn)
            conn.execute(EXECUTIONS)
            env = {
                "SLOTD_POLL_INTERVAL": "5s",
                "SLOTD_BACKOFF_BASE": f"{args.delay}s",
                "SLOTD_BACKOFF_CAP": f"{args.delay}s",
            }
            daemon = Daemon(server.url(), slots=4, env=env).start()
            try:
                for _ in range(args.rounds):
                    time.sleep(random.uniform(0, 5))  # anywhere in the poll's cycle
                    task_id = slotd.enqueue(conn, "rt.noop", delay=args.delay)
                    (due,) = conn.execute(
                        "SELECT run_at FROM slotd_tasks WHERE id = %s", (task_id,)
                    ).fetchone()  # type: ignore[misc]
                    at = wait_for(lambda t=task_id: started(conn, t, 1), timeout=30)
                    lags["delay"].append((at - due).total_seconds())

                    time.sleep(random.uniform(0, 5))
                    task_id = slotd.enqueue(conn, "rt.flaky", {"fail_until": 1})
                    (due,) = wait_for(lambda t=task_id: backed_off(conn, t), timeout=30)
                    at = wait_for(lambda t=task_id: started(conn, t, 2), timeout=30)
                    lags["backoff"].append((at - due).total_seconds())
            finally:
                daemon.close()
    finally:
        server.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.checkout}: start minus due, {args.delay:g} s timers, idle 4 slots, poll 5 s")
    for kind, xs in lags.items():
        ms = sorted(x * 1000 for x in xs)
        print(
            f"  {kind}: n={len(ms)} median {statistics.median(ms):.0f} ms, max {ms[-1]:.0f} ms"
            f" ({', '.join(f'{x:.0f}' for x in ms)})"
        )


if __name__ == "__main__":
    main()
