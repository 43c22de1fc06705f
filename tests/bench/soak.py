"""A soak: slotd under steady traffic for a long time, minute by minute (#26).

    python tests/bench/soak.py [--minutes 30] [--slots 4] [--rate N | --fraction 0.7]
                               [--hold-at M --hold-minutes 10] [--results FILE]

A private PostgreSQL with a production's durability (fsync, synchronous_commit and
full_page_writes on; autovacuum at PostgreSQL's defaults), one `slotd run --slots N` as
users run it. First a 10,000-task drain (--calibrate) measures what the replica drains;
the producer then enqueues at --fraction of that (or --rate tasks/s), in a transaction
every 100 ms: 89% plain no-ops, 10% that fail their first attempt (retried after 1 s), 1%
that fail twice and dead-letter (max_attempts=2); a schedule fires every second. Dead
letters older than two minutes are pruned every minute in batches (what the hourly
retention does with its 7 days, at the soak's time scale), so the table's size is the live
work's.

Every minute: tasks finished per second (rows deleted, less the pruned dead letters), start
latency p50/p99 of first attempts (handler start minus the producer's clock), the queue
table's and its indexes' sizes, dead tuples, autovacuum runs, WAL bytes per task.

--hold-at M holds a REPEATABLE READ transaction open from minute M for --hold-minutes (a
held xmin: no vacuum can remove what died after it began). The summary compares the last
minute with the first (target: throughput and p99 within 10%, sizes flat) and, with a hold,
says how long after it ended the figures came back within 10% of the first minute's."""

from __future__ import annotations

import argparse
import glob
import math
import os
import random
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
from slotd.repository import NewTask, Repository, enqueue_many, migrate  # noqa: E402
from tests.daemon import Daemon, wait_for  # noqa: E402

APP = "tests.bench.soak_app:registry"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)] if s else float("nan")


def stats(conn: psycopg.Connection[Any]) -> dict[str, float]:
    row = conn.execute(
        "SELECT n_tup_del, n_dead_tup, autovacuum_count, pg_table_size('slotd_tasks'),"
        " pg_indexes_size('slotd_tasks'), pg_current_wal_lsn() - '0/0'::pg_lsn"
        " FROM pg_stat_user_tables WHERE relname = 'slotd_tasks'"
    ).fetchone()
    assert row
    keys = ("deleted", "dead", "autovacuums", "table", "indexes", "wal")
    return dict(zip(keys, (float(x) for x in row), strict=True))


class Producer(threading.Thread):
    """`rate` tasks/s as a transaction every 100 ms, with the soak's mix of outcomes."""

    def __init__(self, url: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.url, self.rate = url, rate
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        rng = random.Random(26)
        owed = 0.0
        with psycopg.connect(self.url, autocommit=True) as conn:
            next_at = time.monotonic()
            while not self.stop.is_set():
                owed += self.rate * 0.1
                n, owed = int(owed), owed - int(owed)
                now = time.time()
                items = []
                for _ in range(n):
                    draw = rng.random()
                    kind = (
                        "soak.doomed"
                        if draw < 0.01
                        else "soak.flaky"
                        if draw < 0.11
                        else "soak.work"
                    )
                    items.append(NewTask(kind, {"t": now}))
                if items:
                    with conn.transaction():
                        enqueue_many(conn, items)
                    self.sent += n
                next_at += 0.1
                self.stop.wait(max(0.0, next_at - time.monotonic()))


def drain_rate(conn: psycopg.Connection[Any], n: int = 10_000) -> float:
    began = time.perf_counter()
    with conn.transaction():
        enqueue_many(conn, [NewTask("soak.work") for _ in range(n)])
    wait_for(
        lambda: conn.execute("SELECT NOT EXISTS (SELECT FROM slotd_tasks)").fetchone()[0],
        timeout=1200,
        what="the calibration drain",
    )
    return n / (time.perf_counter() - began)


def latencies(out: Path, seen: dict[str, int]) -> list[float]:
    """New first-attempt start latencies the runners wrote since the last call."""
    found = []
    for path in glob.glob(str(out / "lat-*.txt")):
        with open(path) as f:
            f.seek(seen.get(path, 0))
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        seen[path] = seen.get(path, 0) + len(complete)
        found += [float(x) * 1000 for x in complete.split()]
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument("--fraction", type=float, default=0.7)
    parser.add_argument("--calibrate", type=int, default=10_000, help="tasks in the first drain")
    parser.add_argument("--hold-at", type=float, default=None)
    parser.add_argument("--hold-minutes", type=float, default=10)
    parser.add_argument("--minute", type=float, default=60.0, help="seconds per sample")
    parser.add_argument("--results", type=Path, default=None, help="also append the table here")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"`python tests/bench/soak.py {' '.join(sys.argv[1:])}` started {started}, load {load()}"
    ]

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    tmp = Path(tempfile.mkdtemp(prefix="slotd-soak-"))
    tmp.chmod(0o711)
    out = tmp / "out"
    out.mkdir()
    out.chmod(0o777)
    pg = LocalPostgres(
        tmp / "pg",
        tmp / "sock",
        port=56_000 + os.getpid() % 1000,
        extra_options=[
            "-c shared_buffers=256MB",
            "-c fsync=on",
            "-c synchronous_commit=on",
            "-c full_page_writes=on",
            "-c max_wal_size=1GB",
        ],
    )
    pg.start()
    daemon = None
    try:
        conn = psycopg.connect(pg.url(), autocommit=True)
        migrate(conn)
        daemon = Daemon(
            pg.url(),
            slots=args.slots,
            app=APP,
            env={
                "SLOTD_METRICS_ADDR": "off",
                "SLOTD_POLL_INTERVAL": "5s",
                "SLOTD_LEASE_MARGIN": "30s",
                "SLOTD_KILL_GRACE": "5s",
                "SLOTD_BENCH_OUT": str(out),
            },
        ).start()
        if args.rate:
            rate = args.rate
            say(f"producing {rate:,.0f} tasks/s (--rate) at {args.slots} slots")
        else:
            measured = drain_rate(conn, args.calibrate)
            rate = measured * args.fraction
            say(
                f"drain rate {measured:,.0f} tasks/s at {args.slots} slots;"
                f" producing {rate:,.0f} tasks/s"
            )
        seen: dict[str, int] = {}
        latencies(out, seen)  # the calibration's own lines are not the soak's
        producer = Producer(pg.url(), rate)
        producer.start()
        prune = Repository(psycopg.connect(pg.url(), autocommit=True))
        held: psycopg.Connection[Any] | None = None
        header = (
            "| min | tasks/s | start p50 ms | p99 ms | table MB | indexes MB | dead tuples |"
            " autovacuums | WAL B/task | load | note |"
        )
        say(header)
        say("|" + "---|" * 11)
        rows: list[dict[str, float]] = []
        last = stats(conn)
        pruned_total = 0
        minutes = max(1, round(args.minutes))
        hold_end = None
        for minute in range(1, minutes + 1):
            note = ""
            if args.hold_at is not None and minute == round(args.hold_at) + 1 and held is None:
                # psycopg opens the transaction itself: the level is set on the connection
                # (a BEGIN of our own was ignored with a warning, leaving READ COMMITTED).
                held = psycopg.connect(pg.url(), application_name="soak-hold")
                held.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                held.execute("SELECT count(*) FROM slotd_tasks").fetchone()  # the snapshot
                hold_end = minute + round(args.hold_minutes)
                note = "xmin held from here"
            if held is not None and hold_end is not None and minute == hold_end:
                held.rollback()
                held.close()
                held = None
                note = "xmin released at start"
            time.sleep(args.minute)
            pruned = prune.prune_dead(retention=timedelta(minutes=2))
            pruned_total += pruned
            now = stats(conn)
            done = (now["deleted"] - last["deleted"] - pruned) / args.minute
            lat = latencies(out, seen)
            tasks = max(1.0, now["deleted"] - last["deleted"] - pruned)
            row = {
                "minute": minute,
                "rate": done,
                "p50": pct(lat, 0.5),
                "p99": pct(lat, 0.99),
                "table": now["table"] / 2**20,
                "indexes": now["indexes"] / 2**20,
                "dead": now["dead"],
                "autovacuums": now["autovacuums"] - last["autovacuums"],
                "wal": (now["wal"] - last["wal"]) / tasks,
                "held": 1.0 if held is not None else 0.0,
            }
            rows.append(row)
            say(
                f"| {minute} | {done:,.0f} | {row['p50']:.1f} | {row['p99']:.1f} |"
                f" {row['table']:.1f} | {row['indexes']:.1f} | {row['dead']:,.0f} |"
                f" {row['autovacuums']:.0f} | {row['wal']:,.0f} | {os.getloadavg()[0]:.1f} |"
                f" {note} |"
            )
            last = now
        producer.stop.set()
        producer.join(5)
        if held is not None:
            held.rollback()
            held.close()
        say(summary(rows, rate, pruned_total, producer.sent, hold_end))
        say(f"load at the end: {load()}")
    finally:
        if daemon is not None:
            daemon.close()
        pg.stop("immediate")
    if args.results:
        with args.results.open("a") as f:
            f.write("\n" + "\n".join(lines) + "\n")
    return 0


def summary(
    rows: list[dict[str, float]], rate: float, pruned: int, sent: int, hold_end: int | None
) -> str:
    first, lastrow = rows[0], rows[-1]

    def within(row: dict[str, float]) -> bool:
        return (
            abs(row["rate"] - first["rate"]) <= 0.1 * first["rate"]
            and row["p99"] <= first["p99"] * 1.1
        )

    text = (
        f"\nproduced {sent:,} tasks at {rate:,.0f}/s; pruned {pruned:,} dead letters. Last minute"
        f" vs first: throughput {lastrow['rate'] / first['rate'] * 100 - 100:+.1f}%, p99"
        f" {lastrow['p99']:.1f} vs {first['p99']:.1f} ms"
        f" ({lastrow['p99'] / first['p99'] * 100 - 100:+.0f}%), table"
        f" {first['table']:.1f} -> {lastrow['table']:.1f} MB, indexes {first['indexes']:.1f} ->"
        f" {lastrow['indexes']:.1f} MB."
    )
    if hold_end is not None:
        after = [r for r in rows if r["minute"] >= hold_end]
        back = next((r for r in after if within(r)), None)
        text += f" Held xmin released at the start of minute {hold_end}: " + (
            f"back within 10% of minute 1 in minute {back['minute']:.0f}"
            f" ({back['minute'] - hold_end + 1:.0f} min)."
            if back
            else "not back within 10% of minute 1 by the end."
        )
    return text


if __name__ == "__main__":
    raise SystemExit(main())
