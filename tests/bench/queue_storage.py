"""The queue table at volume: vacuum between drains, claim and discovery beside a million
dead letters, and retention of them (#26).

    python tests/bench/queue_storage.py drains [--drains 8] [--n 20000] [--slots 4]
                                               [--settings before after]
    python tests/bench/queue_storage.py volume [--dead 1000000] [--due 1000] [--results 1000000]
    python tests/bench/queue_storage.py retention [--dead 1000000] [--batch 5000]

drains: the issue's repro. A fresh server per setting (fsync on, autovacuum at PostgreSQL's
defaults), `slotd run --slots 4` draining N bulk-enqueued no-op tasks, eight times in a row.
Per drain: tasks/s, the discover statement's mean and max (pg_stat_statements, reset per
drain), the table's dead tuples and size after it, and the autovacuum runs during it.
`before` is the queue table's storage settings as sql/001 left them, `after` as sql/014
sets them, `after+ff100` those with fillfactor 100 instead of 70.

volume: the discover and claim statements and a settlement that keeps its result (prepared,
median and p99 of --runs) beside --due due rows, with nothing, then --dead dead letters of the
same type in the table, then --results kept results beside them too; then the retention
chore's prune of those results once they all expired.

retention: Repository.prune_dead over --dead dead letters in batches of --batch (each its
own short transaction), with a claimer timing claims beside it: the whole prune's time,
the longest batch, and claim latency while it runs."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.registry import Registry  # noqa: E402
from slotd.repository import NewTask, Repository, enqueue_many, migrate  # noqa: E402
from tests.daemon import Daemon, wait_for  # noqa: E402

# What sql/001 set on slotd_tasks before sql/014 (the `before` of the drains).
BEFORE = (
    "ALTER TABLE slotd_tasks RESET (autovacuum_vacuum_cost_delay, autovacuum_vacuum_cost_limit,"
    " autovacuum_vacuum_insert_threshold, autovacuum_vacuum_insert_scale_factor,"
    " vacuum_truncate, autovacuum_analyze_threshold);"
    " ALTER TABLE slotd_tasks SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,"
    " autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.02)"
)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def server(tmp: Path, port: int, *extra: str) -> LocalPostgres:
    return LocalPostgres(
        tmp / "pg",
        tmp / "sock",
        port=port,
        extra_options=[
            "-c shared_buffers=256MB",
            "-c fsync=on",
            "-c synchronous_commit=on",
            "-c shared_preload_libraries=pg_stat_statements",
            "-c pg_stat_statements.track=top",
            *extra,
        ],
    )


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, int(q * len(s) + 0.5) - 1)] if s else float("nan")


def table_stats(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    row = conn.execute(
        "SELECT n_dead_tup, autovacuum_count, pg_table_size('slotd_tasks'),"
        " pg_indexes_size('slotd_tasks'), n_tup_upd, n_tup_hot_upd"
        " FROM pg_stat_user_tables WHERE relname = 'slotd_tasks'"
    ).fetchone()
    assert row
    keys = ("dead", "autovacuums", "table", "indexes", "updates", "hot")
    return dict(zip(keys, row, strict=True))


def hot_share(before: dict[str, Any], after: dict[str, Any]) -> str:
    updates = after["updates"] - before["updates"]
    return f"{(after['hot'] - before['hot']) / updates:.0%}" if updates else "-"


def discover_stats(conn: psycopg.Connection[Any]) -> tuple[int, float, float]:
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time) / nullif(sum(calls), 0), 0),"
        " coalesce(max(max_exec_time), 0) FROM pg_stat_statements"
        " WHERE query LIKE '%CROSS JOIN LATERAL%' AND query LIKE '%served%'"
        " AND query NOT LIKE '%DELETE%' AND query NOT LIKE '%UPDATE%'"
    ).fetchone()
    assert row
    return int(row[0]), float(row[1]), float(row[2])


def drains(args: argparse.Namespace) -> None:
    for setting in args.settings:
        tmp = Path(tempfile.mkdtemp(prefix="slotd-storage-"))
        tmp.chmod(0o711)
        # "after+naptime10s": a server-wide autovacuum_naptime of 10 s (no table can set it);
        # "after+ff100": sql/014's settings with fillfactor 100.
        extra = ["-c autovacuum_naptime=10s"] if setting.endswith("naptime10s") else []
        pg = server(tmp, 55_400 + os.getpid() % 500, *extra)
        pg.start()
        try:
            with psycopg.connect(pg.url(), autocommit=True) as conn:
                migrate(conn)
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                if setting.startswith("before"):
                    conn.execute(BEFORE)
                if "+ff100" in setting:  # no room kept on a page: is fillfactor 70 worth it?
                    conn.execute("ALTER TABLE slotd_tasks SET (fillfactor = 100)")
                opts = conn.execute(
                    "SELECT reloptions FROM pg_class WHERE relname = 'slotd_tasks'"
                ).fetchone()
                print(f"\n#### {setting}: {opts[0] if opts else None} (load {load()})")
                print(
                    "| drain | tasks/s | discover mean ms | discover max ms | discovers |"
                    " dead tuples after | table MB | indexes MB | autovacuums in it | HOT updates |"
                )
                print("|---|---|---|---|---|---|---|---|---|---|")
                daemon = Daemon(
                    pg.url(),
                    slots=args.slots,
                    app="tests.bench.app:registry",
                    env={
                        "SLOTD_METRICS_ADDR": "off",
                        "SLOTD_POLL_INTERVAL": "5s",
                        "SLOTD_LEASE_MARGIN": "30s",
                        "SLOTD_KILL_GRACE": "5s",
                    },
                ).start()
                try:
                    for i in range(args.drains):
                        before = table_stats(conn)
                        conn.execute("SELECT pg_stat_statements_reset()")
                        began = time.perf_counter()
                        with conn.transaction():
                            enqueue_many(conn, [NewTask("bench.noop") for _ in range(args.n)])
                        wait_for(
                            lambda: conn.execute(
                                "SELECT NOT EXISTS (SELECT FROM slotd_tasks)"
                            ).fetchone()[0],
                            timeout=1800,
                            what="the drain",
                        )
                        took = time.perf_counter() - began
                        calls, mean, most = discover_stats(conn)
                        # The statistics collector flushes at most every 0.5 s.
                        time.sleep(1.0)
                        after = table_stats(conn)
                        print(
                            f"| {i + 1} | {args.n / took:,.0f} | {mean:.2f} | {most:.1f} |"
                            f" {calls:,} | {after['dead']:,} | {after['table'] / 2**20:.1f} |"
                            f" {after['indexes'] / 2**20:.1f} |"
                            f" {after['autovacuums'] - before['autovacuums']} |"
                            f" {hot_share(before, after)} |",
                            flush=True,
                        )
                finally:
                    daemon.close()
                print(f"load after: {load()}")
        finally:
            pg.stop("immediate")


def fill_dead(conn: psycopg.Connection[Any], n: int, task_type: str) -> None:
    """n dead letters (attempts at the threshold, last attempt a day ago), as retention
    and `slotd dead list` meet them, in 100k-row statements."""
    for start in range(0, n, 100_000):
        size = min(100_000, n - start)
        conn.execute(
            "INSERT INTO slotd_tasks (task_type, payload, attempt_count, max_attempts,"
            " last_error, last_attempted_at, run_at)"
            " SELECT %s, '{\"n\": 1}', 20, 20, 'boom', now() - interval '1 day',"
            " now() - interval '1 day' FROM generate_series(1, %s)",
            (task_type, size),
        )
    conn.execute("VACUUM ANALYZE slotd_tasks")


def fill_results(conn: psycopg.Connection[Any], n: int, task_type: str) -> None:
    """n kept results (keep_result, a week left each), as a month of a results-keeping type
    leaves them, in 100k-row statements; ids far above the queue's own."""
    for start in range(0, n, 100_000):
        size = min(100_000, n - start)
        conn.execute(
            "INSERT INTO slotd_results (task_id, task_type, value, expires_at)"
            ' SELECT 1000000000 + %s + g, %s, \'{"answer": 42, "rows": [1, 2, 3]}\','
            " now() + interval '7 days' FROM generate_series(1, %s) g",
            (start, task_type, size),
        )
    conn.execute("VACUUM ANALYZE slotd_results")


def prune_results(conn: psycopg.Connection[Any], repo: Repository) -> None:
    """The retention chore's results prune over every kept result, all expired at once: the
    whole prune's time and its longest batch (each batch its own short transaction)."""
    conn.execute("UPDATE slotd_results SET expires_at = now() - interval '1 second'")
    conn.execute("VACUUM ANALYZE slotd_results")
    batches: list[float] = []
    total = 0
    began = time.perf_counter()
    while True:
        start = time.perf_counter()
        n = repo.prune_results_batch(batch=5000)
        batches.append((time.perf_counter() - start) * 1000)
        total += n
        if n < 5000:
            break
    took = time.perf_counter() - began
    print(
        f"results prune: {total:,} expired results in {took:.1f} s ({total / took:,.0f} rows/s),"
        f" {len(batches)} batches, p50 {statistics.median(batches):.0f} ms,"
        f" max {max(batches):.0f} ms each"
    )


def time_statements(repo: Repository, registry: Registry, runs: int) -> dict[str, list[float]]:
    """discover, then claim one of what it found and finish it (a success deletes it); every
    other finish keeps its result (the fenced dequeue_keep, which writes slotd_results)."""
    out: dict[str, list[float]] = {"discover": [], "claim": [], "keep": []}
    for n in range(runs):
        began = time.perf_counter()
        ids = repo.discover(registry.types)
        out["discover"].append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        claimed = repo.claim(ids, registry)
        out["claim"].append((time.perf_counter() - began) * 1000)
        assert claimed is not None
        if n % 2:
            began = time.perf_counter()
            repo.dequeue(claimed.id, claimed.token, kept=('{"answer": 42}', 3600.0))
            out["keep"].append((time.perf_counter() - began) * 1000)
        else:
            repo.dequeue(claimed.id, claimed.token)
    return out


def claimer(
    url: str, registry: Registry, stop: threading.Event, out: list[float], top_up: bool = False
) -> None:
    """Live work beside a chore: discover + claim + dequeue, timed, until `stop`."""
    with psycopg.connect(url, autocommit=True) as conn:
        repo = Repository(conn)
        while not stop.is_set():
            got = time_statements(repo, registry, 1)
            out.append(got["discover"][0] + got["claim"][0])
            if top_up:
                enqueue_many(conn, [NewTask("work")])


def volume(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="slotd-storage-"))
    tmp.chmod(0o711)
    pg = server(tmp, 55_900 + os.getpid() % 90)
    pg.start()
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            migrate(conn)
            registry = Registry()
            registry.register("work", lambda task, ctx: None, ceiling=timedelta(minutes=1))
            repo = Repository(conn)
            print(f"load before: {load()}")
            print(
                "| beside 1k due rows | discover p50 ms | p99 | claim p50 ms | p99 |"
                " settle keeping a result p50 ms | p99 |"
            )
            print("|---|---|---|---|---|---|---|")
            steps = [("nothing", 0, 0), (f"{args.dead:,} dead letters", args.dead, 0)]
            if args.results:
                steps.append(
                    (f"{args.dead:,} dead letters + {args.results:,} kept results", 0, args.results)
                )
            for label, dead, results in steps:
                began = time.perf_counter()
                if dead:
                    fill_dead(conn, dead, "work")
                if results:
                    fill_results(conn, results, "work")
                if dead or results:
                    print(f"(filled {label} in {time.perf_counter() - began:.0f} s)")
                conn.execute("DELETE FROM slotd_tasks WHERE attempt_count < max_attempts")
                with conn.transaction():  # --due due rows, and what the runs take on top
                    enqueue_many(conn, [NewTask("work") for _ in range(args.due + args.runs + 50)])
                conn.execute("VACUUM ANALYZE slotd_tasks")
                time_statements(repo, registry, 50)  # warm: plans and caches
                got = time_statements(repo, registry, args.runs)
                print(
                    f"| {label} | {statistics.median(got['discover']):.3f} |"
                    f" {pct(got['discover'], 0.99):.3f} | {statistics.median(got['claim']):.3f} |"
                    f" {pct(got['claim'], 0.99):.3f} | {statistics.median(got['keep']):.3f} |"
                    f" {pct(got['keep'], 0.99):.3f} |",
                    flush=True,
                )
            if args.results:
                prune_results(conn, repo)
            print(f"load after: {load()}")
    finally:
        pg.stop("immediate")


def retention(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="slotd-storage-"))
    tmp.chmod(0o711)
    pg = server(tmp, 55_990 + os.getpid() % 9)
    pg.start()
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            migrate(conn)
            registry = Registry()
            registry.register("work", lambda task, ctx: None, ceiling=timedelta(minutes=1))
            print(f"load before: {load()}")
            fill_dead(conn, args.dead, "work")
            with conn.transaction():
                enqueue_many(conn, [NewTask("work") for _ in range(200_000)])
            conn.execute("VACUUM ANALYZE slotd_tasks")
            size = conn.execute("SELECT pg_total_relation_size('slotd_tasks')").fetchone()[0]
            # A claimer beside the prune: what the live work sees while retention runs.
            stop = threading.Event()
            claims: list[float] = []
            thread = threading.Thread(target=claimer, args=(pg.url(), registry, stop, claims))
            thread.start()
            time.sleep(2.0)
            quiet = list(claims)
            prune_repo = Repository(conn)
            batches: list[float] = []
            began = time.perf_counter()
            total = 0
            while True:
                t0 = time.perf_counter()
                pruned = prune_repo.dead_purge_batch(
                    older_than=timedelta(hours=1), batch=args.batch
                )
                batches.append((time.perf_counter() - t0) * 1000)
                total += pruned
                if pruned < args.batch:
                    break
            took = time.perf_counter() - began
            during = claims[len(quiet) :]
            stop.set()
            thread.join()
            print(
                f"table + indexes before: {size / 2**20:.0f} MB; pruned {total:,} in {took:.1f} s"
                f" ({total / took:,.0f} rows/s), {len(batches)} batches of {args.batch}:"
                f" p50 {statistics.median(batches):.0f} ms, max {max(batches):.0f} ms"
            )
            print(
                f"discover+claim+dequeue beside it: before p50 {statistics.median(quiet):.2f} ms"
                f" p99 {pct(quiet, 0.99):.2f} ms ({len(quiet)}); during p50"
                f" {statistics.median(during):.2f} ms p99 {pct(during, 0.99):.2f} ms"
                f" max {max(during):.1f} ms ({len(during)})"
            )
            print(f"load after: {load()}")
    finally:
        pg.stop("immediate")


def vacuum(args: argparse.Namespace) -> None:
    """A vacuum of a drained table beside live claims: with sql/001's settings and sql/014's.
    --n rows are enqueued and deleted (what eight 20k drains leave before autovacuum comes),
    2k enqueued before them stay due; a claimer times discover+claim+dequeue while VACUUM
    runs, throttled as autovacuum is by default (2 ms per 200 cost units) or not, as each
    setting says."""
    tmp = Path(tempfile.mkdtemp(prefix="slotd-storage-"))
    tmp.chmod(0o711)
    pg = server(tmp, 55_950 + os.getpid() % 40)
    pg.start()
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            migrate(conn)
            registry = Registry()
            registry.register("work", lambda task, ctx: None, ceiling=timedelta(minutes=1))
            print(f"load before: {load()}")
            print("| setting | VACUUM s | truncated pages | claim p50 ms | p99 | max | claims |")
            print("|---|---|---|---|---|---|---|")
            for rnd in range(args.rounds):
                for setting in ("before", "after"):
                    if setting == "before":
                        conn.execute(BEFORE)
                        delay = "2ms"
                    else:
                        conn.execute("ALTER TABLE slotd_tasks RESET (fillfactor)")
                        for body in (ROOT / "sql").glob("014_*.sql"):
                            conn.execute(body.read_text())  # type: ignore[arg-type]
                        delay = "0"
                    conn.execute("DELETE FROM slotd_tasks")
                    conn.execute("SET vacuum_cost_delay = 0")
                    conn.execute("VACUUM slotd_tasks")
                    # 1k due rows first, then the drained burst behind them: the file's
                    # tail is empty, as after a drain.
                    with conn.transaction():
                        enqueue_many(conn, [NewTask("work") for _ in range(2_000)])
                    with conn.transaction():
                        enqueue_many(conn, [NewTask("drained") for _ in range(args.n)])
                    conn.execute("DELETE FROM slotd_tasks WHERE task_type = 'drained'")
                    pages = conn.execute(
                        "SELECT pg_relation_size('slotd_tasks') / 8192"
                    ).fetchone()[0]
                    stop = threading.Event()
                    claims: list[float] = []
                    thread = threading.Thread(
                        target=claimer, args=(pg.url(), registry, stop, claims)
                    )
                    thread.start()
                    time.sleep(0.5)
                    skip = len(claims)
                    conn.execute(f"SET vacuum_cost_delay = '{delay}'")
                    began = time.perf_counter()
                    conn.execute("VACUUM slotd_tasks")
                    took = time.perf_counter() - began
                    during = claims[skip:]
                    stop.set()
                    thread.join()
                    after = conn.execute(
                        "SELECT pg_relation_size('slotd_tasks') / 8192"
                    ).fetchone()[0]
                    print(
                        f"| {setting} (round {rnd + 1}) | {took:.2f} | {pages - after:,} of"
                        f" {pages:,} | {statistics.median(during):.2f} |"
                        f" {pct(during, 0.99):.2f} | {max(during):.1f} | {len(during)} |",
                        flush=True,
                    )
            print(f"load after: {load()}")
    finally:
        pg.stop("immediate")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    d = sub.add_parser("drains")
    d.add_argument("--drains", type=int, default=8)
    d.add_argument("--n", type=int, default=20_000)
    d.add_argument("--slots", type=int, default=4)
    d.add_argument("--settings", nargs="+", default=["before", "after"])
    v = sub.add_parser("volume")
    v.add_argument("--dead", type=int, default=1_000_000)
    v.add_argument("--due", type=int, default=1_000)
    v.add_argument("--runs", type=int, default=500)
    v.add_argument("--results", type=int, default=1_000_000, help="kept results, then")
    r = sub.add_parser("retention")
    r.add_argument("--dead", type=int, default=1_000_000)
    r.add_argument("--batch", type=int, default=5_000)
    w = sub.add_parser("vacuum")
    w.add_argument("--n", type=int, default=160_000)
    w.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        f"`python tests/bench/queue_storage.py {' '.join(sys.argv[1:])}`"
        f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load()}"
    )
    {"drains": drains, "volume": volume, "retention": retention, "vacuum": vacuum}[args.what](args)


if __name__ == "__main__":
    main()
