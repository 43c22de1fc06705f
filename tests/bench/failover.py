"""A failover under a running daemon, as an operator would play it: the primary stopped
with `-m immediate`, its streaming replica promoted, and the loopback TCP forwarder the
daemon connects through switched from one to the other.

    python tests/bench/failover.py [--outage 10] [--runs 3]

Per run, in seconds after the forwarder reached the promoted replica (the server's clock):
when each slot ran its first task of a burst enqueued at that moment, when the burst was
drained, and whether any task was lost or ran twice. The outage (primary down, nothing to
connect to) is long enough for every reconnect backoff to reach its cap."""

from __future__ import annotations

import argparse
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
from tests.forwarder import Forwarder  # noqa: E402
from tests.replica import promote, streaming_replica  # noqa: E402


def count(url: str, sql: str) -> int:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            return int(conn.execute(sql).fetchone()[0])  # type: ignore[arg-type,index]
    except psycopg.OperationalError:
        return -1


BURST = 400  # 50 ms each: 20 s for one slot, so every slot has time to come back to it


def run_once(outage: float) -> tuple[list[float], float, int, int]:
    with scratch(prefix="slotd-failover-", port=5436) as primary:
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            migrate(conn)
            conn.execute(EXECUTIONS)
        with streaming_replica(primary) as replica:
            forwarder = Forwarder(primary)
            daemon = Daemon(forwarder.url(), slots=4, env={"SLOTD_POLL_INTERVAL": "5s"})
            try:
                daemon.start()
                with psycopg.connect(forwarder.url()) as conn:
                    ids = slotd.enqueue_many(conn, [("rt.noop", {}) for _ in range(200)])
                left = "SELECT count(*) FROM slotd_tasks"
                wait_for(lambda: count(primary.url(), left) == 0, 60, "the first batch")
                wait_for(lambda: count(replica.url(), left) == 0, 60, "the replica caught up")
                primary.stop("immediate")
                time.sleep(outage)
                promote(replica)
                forwarder.switch(replica)  # the new primary is now reachable, and writable
                with psycopg.connect(replica.url()) as conn:
                    switched = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
                    after = slotd.enqueue_many(conn, [("rt.work", {"ms": 50})] * BURST)
                wait_for(lambda: count(replica.url(), left) == 0, 300, "the burst drained")
                with psycopg.connect(replica.url()) as conn:
                    joined = [
                        row[0]
                        for row in conn.execute(
                            "SELECT extract(epoch FROM min(at) - %s)::float8 FROM executions"
                            " WHERE task_id >= %s GROUP BY pid ORDER BY 1",
                            (switched, after[0]),
                        ).fetchall()
                    ]
                    drained = conn.execute(
                        "SELECT extract(epoch FROM max(at) - %s)::float8 FROM executions",
                        (switched,),
                    ).fetchone()[0]  # type: ignore[index]
                    rows = conn.execute(
                        "SELECT task_id, count(*) FROM executions WHERE phase = 'start'"
                        " GROUP BY task_id"
                    ).fetchall()
                runs = dict(rows)
                lost = sum(1 for i in [*ids, *after] if i not in runs)
                twice = sum(1 for n in runs.values() if n > 1)
                return joined, drained, lost, twice
            finally:
                daemon.close()
                forwarder.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--outage", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for n in range(args.runs):
        joined, drained, lost, twice = run_once(args.outage)
        slots = ", ".join(f"{t:.2f}" for t in joined)
        print(
            f"run {n + 1} (outage {args.outage:g}s): slots joined the burst at {slots} s after"
            f" the switch ({len(joined)} of 4); burst of {BURST} drained at {drained:.2f}s;"
            f" lost {lost}, ran twice {twice}",
            flush=True,
        )


if __name__ == "__main__":
    main()
