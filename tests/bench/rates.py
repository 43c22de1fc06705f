"""What rates cost (#25), on a throwaway PostgreSQL (fsync off), one connection in-process.

    python tests/bench/rates.py [--samples 300] [--waiting 1000,100000]

1. Discovery and claim latency of an unlimited type while N rows of a rated type wait on a
   full window (rate=(1, 1 h), one start made): discover every 20 claims, claim, dequeue.
   The same with N rows waiting behind a full max_running=1 (one lease held): since #25 a
   closed type is decided once per discovery, before its rows (type_open); before it each
   blocked row was passed over by a filter. N = 0 is the baseline.
2. The claim of a rated type whose window has room (rate=(10^9, 1 s)): the limit lock, the
   look-up of the start N places back, the start's row and its window's, against the same
   claim of an unlimited type.

`--checkout DIR`: import slotd from another worktree (the commit before #25, for the
max_running rows' "before"; its code has no rates, so the rated rows are left out there).

Drain rate and statements per task of unlimited work: tests/bench/workflows.py --types
bench.noop, from this checkout and from the one before (--checkout)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
if "--checkout" in sys.argv:
    ROOT = Path(sys.argv[sys.argv.index("--checkout") + 1]).resolve()
sys.path.insert(0, str(ROOT))

import slotd  # noqa: E402
from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.registry import Registry  # noqa: E402
from slotd.repository import Repository, migrate  # noqa: E402

HOUR = timedelta(hours=1)
RATES = "rate" in Registry.register.__code__.co_varnames  # the checkout has rates


TRUNCATE = "TRUNCATE slotd_tasks" + (", slotd_rate_windows, slotd_rate_starts" if RATES else "")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def registry() -> Registry:
    reg = Registry()
    noop = lambda task, ctx: None  # noqa: E731
    reg.register("bench.noop", noop, ceiling=timedelta(minutes=1))
    reg.register("bench.limited", noop, ceiling=timedelta(minutes=1), max_running=1)
    if RATES:
        reg.register("bench.rated", noop, ceiling=timedelta(minutes=1), rate=(1, HOUR))
        reg.register("bench.open", noop, ceiling=timedelta(minutes=1), rate=(10**9, HOUR / 3600))
    return reg


def seed(conn: psycopg.Connection[Any], task_type: str, n: int) -> None:
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, run_at, order_at)"
        " SELECT %s, now() - interval '1 hour' + g * interval '1 ms',"
        " now() - interval '1 hour' + g * interval '1 ms' FROM generate_series(1, %s) g",
        (task_type, n),
    )


def close(conn: psycopg.Connection[Any], repo: Repository, reg: Registry, task_type: str) -> None:
    """Make `task_type`'s one start (rated: its window is full) or its one lease (limited)."""
    first = slotd.enqueue(conn, task_type, {}, delay=timedelta(0))
    conn.execute(
        "UPDATE slotd_tasks SET run_at = now() - interval '2 hours',"
        " order_at = now() - interval '2 hours' WHERE id = %s",
        (first,),
    )
    claimed = repo.claim([first], reg)
    assert claimed is not None and claimed.id == first


def samples(
    repo: Repository, reg: Registry, task_type: str, n: int
) -> tuple[list[float], list[float]]:
    claims, discovers = [], []
    batch: list[int] = []
    served = [task_type, "bench.rated", "bench.limited"] if RATES else [task_type, "bench.limited"]
    extra = {"rates": reg.rates} if RATES else {}
    for _ in range(n):
        if not batch:
            t0 = time.perf_counter()
            batch = repo.discover(served, 20, reg.concurrency_limits, **extra)
            discovers.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        got = repo.claim(batch, reg)
        claims.append(time.perf_counter() - t1)
        assert got is not None and got.task_type == task_type, got
        batch = [i for i in batch if i != got.id]
        repo.dequeue(got.id, got.token)
    return claims, discovers


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--waiting", default="1000,100000")
    parser.add_argument("--checkout", type=Path, default=ROOT)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="slotd-rates-"))
    root.chmod(0o711)
    server = LocalPostgres(root=root / "pg", socket_dir=root / "sock", port=5437, fast=True)
    server.start()
    reg = registry()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            migrate(conn)
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            print(f"PostgreSQL {version}; code from {ROOT}; {load()}")
            print("\n| waiting rows | held back by | claim p50 ms | claim p99 ms |"
                  " discover p50 ms | discover p99 ms |")  # fmt: skip
            print("|---|---|---|---|---|---|")
            for waiting in [0, *map(int, args.waiting.split(","))]:
                kinds = ("bench.rated", "bench.limited") if RATES else ("bench.limited",)
                for blocked in kinds if waiting else ("-",):
                    conn.execute(TRUNCATE)
                    repo = Repository(conn)
                    if waiting:
                        close(conn, repo, reg, blocked)
                        seed(conn, blocked, waiting)
                    seed(conn, "bench.noop", args.samples + 20)
                    conn.execute("VACUUM ANALYZE slotd_tasks")
                    claims, discovers = samples(repo, reg, "bench.noop", args.samples)
                    why = {"bench.rated": "rate=(1, 1h), window full",
                           "bench.limited": "max_running=1, full"}.get(blocked, "-")  # fmt: skip
                    print(f"| {waiting:,} | {why} | {pct(claims, 0.5):.3f} |"
                          f" {pct(claims, 0.99):.3f} | {pct(discovers, 0.5):.3f} |"
                          f" {pct(discovers, 0.99):.3f} |")  # fmt: skip
            print(f"\n{load()}")
            if not RATES:
                return
            print("\n| claim of | claim p50 ms | claim p99 ms |")
            print("|---|---|---|")
            for task_type in ("bench.noop", "bench.open"):
                conn.execute(TRUNCATE)
                seed(conn, task_type, args.samples + 20)
                conn.execute("VACUUM ANALYZE slotd_tasks")
                claims, _ = samples(Repository(conn), reg, task_type, args.samples)
                label = "unlimited type" if task_type == "bench.noop" else "rated type, room"
                print(f"| {label} | {pct(claims, 0.5):.3f} | {pct(claims, 0.99):.3f} |")
    finally:
        server.stop("immediate")


if __name__ == "__main__":
    main()
