"""What priorities and concurrency limits cost (#16), on a throwaway PostgreSQL.

    python tests/bench/priority_limits.py [--samples 300] [--drain 3000] [--idle 20]

Run it from a checkout of the commit before #16 as well (copy this file there; it only uses
the API both have) to get the "before" rows: the two runs print the same tables.

1. Claim latency, one connection in-process (discover every 20 claims, claim, dequeue), at
   1,000 and 1,000,000 due rows; with #16 the rows carry mixed priorities (-100..100,
   uniformly), before it they are plain.
2. Statements per task and tasks/s while a real `slotd run` (2 slots) drains no-op tasks of
   an unlimited type, from pg_stat_statements.
3. (#16 only) The idle cost of 1,000 tasks waiting behind `max_running=1` while the one
   running holds its place: a real `slotd run` (4 slots, production poll 5 s), statements
   per second of the workers over `--idle` seconds, next to the same daemon with an empty
   queue.

Server: slotd.localpg with fsync off (fast=True): compare the rows with each other."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import slotd  # noqa: E402
from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.registry import Registry  # noqa: E402
from slotd.repository import Repository, migrate  # noqa: E402
from tests.daemon import Daemon, wait_for  # noqa: E402

ENV = {"SLOTD_POLL_INTERVAL": "5s", "SLOTD_LEASE_MARGIN": "30s", "SLOTD_KILL_GRACE": "5s"}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def has_priorities(conn: psycopg.Connection[Any]) -> bool:
    return bool(
        conn.execute(
            "SELECT 1 FROM information_schema.columns"
            " WHERE table_name = 'slotd_tasks' AND column_name = 'order_at'"
        ).fetchone()
    )


def seed(conn: psycopg.Connection[Any], due: int) -> None:
    conn.execute("TRUNCATE slotd_tasks")
    if has_priorities(conn):
        conn.execute(
            "INSERT INTO slotd_tasks (task_type, run_at, priority, order_at)"
            " SELECT 'bench.noop', r, p, r - make_interval(secs => p)"
            " FROM (SELECT now() - interval '1 hour' + (g * interval '1 ms') AS r,"
            "              (floor(random() * 201) - 100)::int AS p"
            "       FROM generate_series(1, %s) g) s",
            (due,),
        )
    else:
        conn.execute(
            "INSERT INTO slotd_tasks (task_type, run_at) SELECT 'bench.noop',"
            " now() - interval '1 hour' + (g * interval '1 ms') FROM generate_series(1, %s) g",
            (due,),
        )
    conn.execute("VACUUM ANALYZE slotd_tasks")


def claim_samples(conn: psycopg.Connection[Any], n: int) -> dict[str, list[float]]:
    reg = Registry()
    reg.register("bench.noop", lambda task, ctx: None, ceiling=timedelta(minutes=1))
    repo = Repository(conn)
    claims, discovers = [], []
    batch: list[int] = []
    for _ in range(n):
        if not batch:
            t0 = time.perf_counter()
            batch = repo.discover(reg.types, 20)
            discovers.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        got = repo.claim(batch, reg)
        claims.append(time.perf_counter() - t1)
        assert got is not None
        batch = [i for i in batch if i != got.id]
        repo.dequeue(got.id, got.token)
    return {"claim": claims, "discover": discovers}


def bench_claims(url: str, samples: int) -> None:
    print("\n| due rows | priorities | claims | claim p50 ms | claim p99 ms | discover p50 ms |")
    print("|---|---|---|---|---|---|")
    with psycopg.connect(url, autocommit=True) as conn:
        mixed = "mixed -100..100" if has_priorities(conn) else "none (before #16)"
        for due in (1_000, 1_000_000):
            seed(conn, due + samples)
            got = claim_samples(conn, samples)
            c, d = got["claim"], got["discover"]
            print(
                f"| {due:,} | {mixed} | {len(c)} | {pct(c, 0.5) * 1000:.3f} | "
                f"{pct(c, 0.99) * 1000:.3f} | {statistics.median(d) * 1000:.3f} |"
            )


def worker_calls(admin: psycopg.Connection[Any]) -> float:
    row = admin.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE userid = 'bench'::regrole"
    ).fetchone()
    return float(row[0])  # type: ignore[index]


def bench_drain(server: LocalPostgres, drain: int) -> None:
    worker_url = server.url().replace("postgresql://slotd@", "postgresql://bench@")
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute("TRUNCATE slotd_tasks")
        daemon = Daemon(worker_url, slots=2, app="tests.bench.app:registry", env=ENV)
        daemon.start()
        try:
            time.sleep(1.0)  # every slot in its first idle wait
            admin.execute("SELECT pg_stat_statements_reset()")
            with admin.transaction():
                slotd.enqueue_many(admin, [("bench.noop", {}) for _ in range(drain)])
            t0 = time.perf_counter()
            wait_for(
                lambda: admin.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
                timeout=600,
                what="the drain",
            )
            took = time.perf_counter() - t0
            calls = worker_calls(admin)
        finally:
            daemon.close()
    print("\n| drain (2 slots, unlimited type) | tasks | statements per task (workers) | tasks/s |")
    print("|---|---|---|---|")
    print(f"| `slotd run` | {drain} | {calls / drain:.2f} | {drain / took:,.0f} |")


def bench_idle(server: LocalPostgres, seconds: float) -> None:
    from tests.apps.limits import RUNS

    worker_url = server.url().replace("postgresql://slotd@", "postgresql://bench@")
    print(f"\n| `slotd run`, 4 slots, poll 5 s, {seconds:g} s | statements/s (workers) |")
    print("|---|---|")
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute("TRUNCATE slotd_tasks")
        admin.execute("DROP TABLE IF EXISTS runs")
        admin.execute(RUNS)
        for label, waiting in (("empty queue", 0), ("1,000 waiting behind max_running=1", 1000)):
            admin.execute("TRUNCATE slotd_tasks, runs")
            if waiting:  # the one that runs holds its place for the whole window
                slotd.enqueue(admin, "lim.one", {"sleep": 3600})
            daemon = Daemon(worker_url, slots=4, app="tests.apps.limits:registry", env=ENV)
            daemon.start()
            try:
                if waiting:
                    wait_for(lambda: admin.execute("SELECT 1 FROM runs").fetchone(), 30)
                    slotd.enqueue_many(admin, [("lim.one", {"sleep": 0})] * waiting)
                time.sleep(6.0)  # the enqueue's wake cascade has settled
                admin.execute("SELECT pg_stat_statements_reset()")
                t0 = time.perf_counter()
                time.sleep(seconds)
                calls = worker_calls(admin)
                took = time.perf_counter() - t0
                attempts = admin.execute(
                    "SELECT coalesce(sum(attempt_count), 0) FROM slotd_tasks"
                ).fetchone()[0]  # type: ignore[index]
            finally:
                daemon.close()
            print(f"| {label} (attempts burnt: {int(attempts) - (1 if waiting else 0)}) "
                  f"| {calls / took:.2f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--drain", type=int, default=3000)
    parser.add_argument("--idle", type=float, default=20.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="slotd-bench-"))
    root.chmod(0o711)
    server = LocalPostgres(
        root=root / "pg",
        socket_dir=root / "sock",
        port=5436,
        fast=True,
        extra_options=[
            "-c shared_preload_libraries=pg_stat_statements",
            "-c pg_stat_statements.track=top",
        ],
    )
    server.start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE ROLE bench LOGIN SUPERUSER")
            conn.execute("CREATE EXTENSION pg_stat_statements")
            migrate(conn)
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            after = has_priorities(conn)
        print(f"PostgreSQL {version}; code from {ROOT}")
        bench_claims(server.url(), args.samples)
        bench_drain(server, args.drain)
        if after:
            bench_idle(server, args.idle)
    finally:
        server.stop("immediate")


if __name__ == "__main__":
    main()
