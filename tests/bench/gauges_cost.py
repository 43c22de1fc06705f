"""What one fleet-gauge refresh costs the primary on a 1,000,000-row queue.

    python tests/bench/gauges_cost.py [--rows 1000000] [--runs 30] [--keep]

Builds the table in a throwaway PostgreSQL (slotd.localpg, like the test suite), with the
mix a long-lived queue has: mostly dead letters kept for retention and rows scheduled in
the future (delays, backoff), some due, a handful leased. Then times the `gauges`
statement, before and after VACUUM (an index-only scan is only as good as the visibility
map, which on a hot table depends on autovacuum keeping up), and prints EXPLAIN (ANALYZE,
BUFFERS) so every branch's access path is visible."""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.ops.metrics import db_gauge_source  # noqa: E402
from slotd.repository import Repository, migrate, statements  # noqa: E402

# Share of rows per kind; the remainder after these is due (claimable) work.
MIX = {"dead": 0.60, "future": 0.33, "leased": 0.0001}
TYPES = 12


def build(conn: psycopg.Connection[Any], rows: int) -> dict[str, int]:
    counts = {kind: int(rows * share) for kind, share in MIX.items()}
    counts["due"] = rows - sum(counts.values())
    # Skewed task types: type_0 is the busiest, like a real fleet's prefix_delete.
    ttype = f"'type_' || (floor(power(random(), 2) * {TYPES}))::int"
    conn.execute(
        f"""
        INSERT INTO slotd_tasks (task_type, payload, run_at, attempt_count, last_attempted_at,
                                 last_error, created_at)
        SELECT {ttype}, jsonb_build_object('org', g), now() - random() * interval '7 days',
               20, now() - random() * interval '7 days', 'boom: gave up after 20 attempts',
               now() - interval '8 days'
        FROM generate_series(1, %(n)s) g
        """,  # type: ignore[arg-type]
        {"n": counts["dead"]},
    )
    conn.execute(
        f"""
        INSERT INTO slotd_tasks (task_type, payload, run_at, attempt_count, last_attempted_at)
        SELECT {ttype}, jsonb_build_object('org', g),
               now() + interval '1 minute' + random() * interval '30 days',
               (random() * 5)::int, CASE WHEN random() < 0.3 THEN now() END
        FROM generate_series(1, %(n)s) g
        """,  # type: ignore[arg-type]
        {"n": counts["future"]},
    )
    conn.execute(
        f"""
        INSERT INTO slotd_tasks (task_type, payload, run_at, attempt_count)
        SELECT {ttype}, jsonb_build_object('org', g), now() - random() * interval '10 minutes',
               (random() * 3)::int
        FROM generate_series(1, %(n)s) g
        """,  # type: ignore[arg-type]
        {"n": counts["due"]},
    )
    conn.execute(
        f"""
        INSERT INTO slotd_tasks (task_type, payload, run_at, attempt_count, lease_token,
                                 lease_expires_at, last_attempted_at)
        SELECT {ttype}, jsonb_build_object('org', g), now() - interval '1 minute',
               CASE WHEN g %% 10 = 0 THEN 20 ELSE 1 END, gen_random_uuid(),
               now() + interval '1 hour', now()
        FROM generate_series(1, %(n)s) g
        """,  # type: ignore[arg-type]
        {"n": counts["leased"]},
    )
    return counts


def time_gauges(conn: psycopg.Connection[Any], runs: int) -> tuple[float, float, float]:
    repo = Repository(conn)
    repo.gauges()  # warm the cache: a scrape every few seconds keeps it warm
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        repo.gauges()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
    return statistics.median(samples), p95, samples[0]


def explain(conn: psycopg.Connection[Any], sql: str) -> str:
    rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}").fetchall()  # type: ignore[arg-type]
    return "\n".join(r[0] for r in rows)


def report(conn: psycopg.Connection[Any], label: str, runs: int, sql: str) -> None:
    median, p95, best = time_gauges(conn, runs) if sql == GAUGES else time_sql(conn, sql, runs)
    print(f"\n== {label}: median {median:.1f} ms, p95 {p95:.1f} ms, best {best:.1f} ms")
    print(explain(conn, sql))


def time_sql(conn: psycopg.Connection[Any], sql: str, runs: int) -> tuple[float, float, float]:
    conn.execute(sql)  # type: ignore[arg-type]
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        conn.execute(sql).fetchall()  # type: ignore[arg-type]
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
    return statistics.median(samples), p95, samples[0]


GAUGES = statements()["gauges"]


def timed_source(url: str, runs: int) -> None:
    """The production path: slotd.metrics.DbGaugeSource (bounded, serial, one transaction)."""
    source = db_gauge_source(url)
    try:
        source()
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            source()
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        source.close()
    samples.sort()
    p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
    median = statistics.median(samples)
    print(f"\n== DbGaugeSource refresh: median {median:.1f} ms, p95 {p95:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="leave the server's files behind")
    parser.add_argument(
        "--also", action="append", default=[], help="a further SQL file to time (an alternative)"
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="slotd-bench-"))
    root.chmod(0o711)
    server = LocalPostgres(root=root / "pg", socket_dir=root / "sock", port=5433, fast=True)
    server.start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            migrate(conn)
            started = time.perf_counter()
            counts = build(conn, args.rows)
            conn.execute("ANALYZE slotd_tasks")
            print(f"built {args.rows:,} rows in {time.perf_counter() - started:.0f} s: {counts}")
            size = conn.execute(
                "SELECT pg_size_pretty(pg_table_size('slotd_tasks')), "
                "pg_size_pretty(pg_indexes_size('slotd_tasks'))"
            ).fetchone()
            print(f"table {size[0]}, indexes {size[1]}")  # type: ignore[index]
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            print(f"PostgreSQL {version}")

            report(conn, "gauges, after bulk load (visibility map not set)", args.runs, GAUGES)
            conn.execute("VACUUM (ANALYZE) slotd_tasks")
            report(conn, "gauges, after VACUUM (steady state)", args.runs, GAUGES)
            # Parallel workers buy latency with CPU the primary's real work could use; for
            # a background gauge the CPU is what matters.
            conn.execute("SET max_parallel_workers_per_gather = 0")
            report(conn, "gauges, after VACUUM, no parallel workers", args.runs, GAUGES)
            conn.execute("RESET max_parallel_workers_per_gather")
            timed_source(server.url(), args.runs)
            for path in args.also:
                report(conn, f"alternative {path}", args.runs, Path(path).read_text())
    finally:
        server.stop("immediate")
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
