"""Claim and settle beside a million remembered tasks (#37 item 4).

    python tests/bench/remembered.py [--remembered 1000000] [--due 1000] [--runs 600]
                                     [--drain 5000] [--slots 4]

A private PostgreSQL (fsync on). Each phase first times, on one connection, serial
discover + claim + settle over --due due rows kept topped up, the settlements taking turns:
a plain success (the lone delete), a remembered success (keep_history: the delete, its
answerable result without a value and its attempt, sql `settled_kept`) and a failure (its
attempt written, `failed_plain`); then a `slotd run --slots N` replica drains --drain
bulk-enqueued no-op tasks with SLOTD_KEEP_HISTORY=7d, so every success is remembered.

Phases: nothing remembered; then --remembered succeeded tasks remembered as keep_history
leaves them (a row in slotd_results with no value and a week left, and its attempt in
slotd_attempts), written by one INSERT ... SELECT generate_series each, not through the
API, ids below the live ones. Last, the retention chore's prune of all of it once expired:
the results' and the attempts' batches, each its own short transaction."""

from __future__ import annotations

import argparse
import os
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

from slotd.registry import Registry  # noqa: E402
from slotd.repository import NewTask, Repository, enqueue_many, migrate  # noqa: E402
from tests.bench.queue_storage import load, pct, server  # noqa: E402
from tests.daemon import Daemon, wait_for  # noqa: E402

KEEP_S = 7 * 86400.0
KINDS = ("plain", "remembered", "failure")


def remember(conn: psycopg.Connection[Any], n: int) -> None:
    """n succeeded tasks remembered as keep_history leaves them: their answerable result
    (no value, a week left) and their one attempt, under the queue's next n ids (the
    sequence moved past them), as if they had run before the live tasks that follow."""
    base = conn.execute(
        "SELECT setval(pg_get_serial_sequence('slotd_tasks', 'id'),"
        " nextval(pg_get_serial_sequence('slotd_tasks', 'id')) + %s)",
        (n,),
    ).fetchone()[0]  # type: ignore[index]
    first = base - n
    conn.execute(
        "INSERT INTO slotd_results (task_id, task_type, value, succeeded_at, expires_at)"
        " SELECT g, 'bench.noop', NULL, now() - interval '1 hour', now() + interval '7 days'"
        " FROM generate_series(%s::bigint, %s::bigint) g",
        (first, base - 1),
    )
    conn.execute(
        "INSERT INTO slotd_attempts (task_id, task_type, number, outcome, error, started_at,"
        " ended_at, host, pid, slot)"
        " SELECT g, 'bench.noop', 1, 'success', NULL, now() - interval '1 hour',"
        " now() - interval '1 hour', 'bench-host', 4242, (g %% 4)::int"
        " FROM generate_series(%s::bigint, %s::bigint) g",
        (first, base - 1),
    )
    conn.execute("VACUUM ANALYZE slotd_results")
    conn.execute("VACUUM ANALYZE slotd_attempts")


def serial(repo: Repository, registry: Registry, runs: int) -> dict[str, list[float]]:
    """discover, claim one, settle it; the settlement's kind by turn (see KINDS)."""
    out: dict[str, list[float]] = {"claim": [], **{k: [] for k in KINDS}, "task": []}
    for n in range(runs):
        start = time.perf_counter()
        ids = repo.discover(registry.types)
        began = time.perf_counter()
        claimed = repo.claim(ids, registry)
        out["claim"].append((time.perf_counter() - began) * 1000)
        assert claimed is not None
        kind = KINDS[n % len(KINDS)]
        began = time.perf_counter()
        if kind == "plain":
            repo.dequeue(claimed.id, claimed.token)
        elif kind == "remembered":
            repo.dequeue(claimed.id, claimed.token, kept=(None, KEEP_S))
        else:
            repo.record_failure(claimed.id, claimed.token, "Traceback ...\nValueError: bench")
        now = time.perf_counter()
        out[kind].append((now - began) * 1000)
        out["task"].append(now - start)
    return out


def drain(url: str, n: int, slots: int) -> float:
    """tasks/s of a `slotd run` replica draining n bulk-enqueued no-op tasks, each success
    remembered (SLOTD_KEEP_HISTORY)."""
    daemon = Daemon(
        url,
        slots=slots,
        app="tests.bench.app:registry",
        env={
            "SLOTD_METRICS_ADDR": "off",
            "SLOTD_POLL_INTERVAL": "5s",
            "SLOTD_KEEP_HISTORY": "7d",
        },
    ).start()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            began = time.perf_counter()
            with conn.transaction():
                enqueue_many(conn, [NewTask("bench.noop") for _ in range(n)])
            wait_for(
                lambda: conn.execute(
                    "SELECT NOT EXISTS (SELECT FROM slotd_tasks WHERE task_type = 'bench.noop')"
                ).fetchone()[0],
                timeout=1800,
                what="the drain",
            )
            return n / (time.perf_counter() - began)
    finally:
        daemon.close()


def prune(conn: psycopg.Connection[Any], repo: Repository) -> None:
    """The retention chore's prunes over everything remembered, expired at once."""
    conn.execute("UPDATE slotd_results SET expires_at = now() - interval '1 second'")
    conn.execute("VACUUM ANALYZE slotd_results")
    for what, step in (
        ("results", repo.prune_results_batch),
        ("attempts", repo.prune_attempts_batch),
    ):
        batches: list[float] = []
        total = 0
        began = time.perf_counter()
        while True:
            start = time.perf_counter()
            got = step(batch=5000)
            batches.append((time.perf_counter() - start) * 1000)
            total += got
            if got < 5000:
                break
        took = time.perf_counter() - began
        print(
            f"{what} prune: {total:,} rows in {took:.1f} s ({total / took:,.0f} rows/s),"
            f" {len(batches)} batches, p50 {statistics.median(batches):.0f} ms,"
            f" max {max(batches):.0f} ms each"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--remembered", type=int, default=1_000_000)
    ap.add_argument("--due", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=600)
    ap.add_argument("--drain", type=int, default=5000)
    ap.add_argument("--slots", type=int, default=4)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="slotd-remembered-"))
    tmp.chmod(0o711)
    pg = server(tmp, 56_100 + os.getpid() % 90)
    pg.start()
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            migrate(conn)
            registry = Registry()
            registry.register(
                "work", lambda task, ctx: None, ceiling=timedelta(minutes=1), max_attempts=1000
            )
            repo = Repository(conn)
            print(f"load before: {load()}")
            print(
                "| beside | claim p50 ms | p99 | plain success p50 ms | p99 |"
                " remembered success p50 ms | p99 | failure p50 ms | p99 | serial tasks/s |"
                f" drain, {args.slots} slots, every success remembered, tasks/s |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for label, n in (("nothing remembered", 0), (f"{args.remembered:,} remembered", 1)):
                if n:
                    began = time.perf_counter()
                    remember(conn, args.remembered)
                    print(
                        f"(remembered {args.remembered:,} in {time.perf_counter() - began:.0f} s)"
                    )
                conn.execute("DELETE FROM slotd_tasks")
                with conn.transaction():  # --due due rows, and what the runs take on top
                    enqueue_many(conn, [NewTask("work") for _ in range(args.due + args.runs + 60)])
                conn.execute("VACUUM ANALYZE slotd_tasks")
                serial(repo, registry, 60)  # warm: plans and caches
                got = serial(repo, registry, args.runs)
                rate = len(got["task"]) / sum(got["task"])
                conn.execute("DELETE FROM slotd_tasks")
                drained = drain(pg.url(), args.drain, args.slots)
                cells = [
                    f"{statistics.median(got[k]):.3f} | {pct(got[k], 0.99):.3f}"
                    for k in ("claim", *KINDS)
                ]
                print(
                    f"| {label} | {' | '.join(cells)} | {rate:,.0f} | {drained:,.0f} |", flush=True
                )
            counts = conn.execute(
                "SELECT (SELECT count(*) FROM slotd_results), (SELECT count(*) FROM slotd_attempts)"
            ).fetchone()
            print(f"remembered at the end: {counts[0]:,} results, {counts[1]:,} attempts")  # type: ignore[index]
            prune(conn, repo)
            print(f"load after: {load()}")
    finally:
        pg.stop("immediate")


if __name__ == "__main__":
    main()
