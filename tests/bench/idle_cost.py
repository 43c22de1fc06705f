"""Statements per second an idle `slotd run --slots 4` sends to its database.

    python tests/bench/idle_cost.py [--seconds 60] [--checkout DIR]

A private PostgreSQL with pg_stat_statements (track=top), slotd's schema, one idle daemon
with production timing (5 s poll, 30 s heartbeat); after a warm-up the statistics are reset
and counted over the window. `--checkout DIR` runs another checkout's slotd (a git
worktree of an older commit) for a before/after."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psycopg

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=60.0)
# Past the first retention chore (60 s after start, then every 10 min): by default the
# window is the steady state; --warmup 12 puts that chore's election and prune in it.
parser.add_argument("--warmup", type=float, default=65.0)
parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[2])
args = parser.parse_args()
sys.path.insert(0, str(args.checkout))

from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.repository import migrate  # noqa: E402
from tests.daemon import Daemon  # noqa: E402


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="slotd-idle-"))
    tmp.chmod(0o711)
    preload = ["-c shared_preload_libraries=pg_stat_statements", "-c pg_stat_statements.track=top"]
    server = LocalPostgres(tmp / "pg", tmp / "sock", port=5452, extra_options=preload)
    server.start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            migrate(conn)
        env = {"SLOTD_POLL_INTERVAL": "5s"}  # tests.daemon's FAST settings poll every second
        daemon = Daemon(server.url(), slots=4, app="tests.bench.app:registry", env=env).start()
        try:
            time.sleep(args.warmup)  # start-up statements stay out of the window
            with psycopg.connect(server.url(), autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
                time.sleep(args.seconds)  # the measurement window itself
                rows = conn.execute(
                    "SELECT calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 70)"
                    " FROM pg_stat_statements WHERE query NOT ILIKE '%pg_stat_statements%'"
                    " ORDER BY calls DESC"
                ).fetchall()
        finally:
            daemon.close()
    finally:
        server.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(calls for calls, _ in rows)
    print(
        f"{args.checkout}: {total / args.seconds:.3f} statements/s over {args.seconds:g} s"
        f" (after {args.warmup:g} s)"
    )
    for calls, query in rows[:8]:
        print(f"  {calls:4d} x {query}")


if __name__ == "__main__":
    main()
