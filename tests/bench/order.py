"""Who runs next at scale (#39): drain rate and the claim's and discovery's statement times
with 10,000 groups of one task beside one group of 100,000 (a fair type, and the same type
without turns), 1,000 sequences, and 100 types under one shared limit (and without it).

    python tests/bench/order.py [--slots 4] [--scenarios groups,sequences,limits] [--take 5000]

A private PostgreSQL (fsync on) with pg_stat_statements, slotd's schema, one `slotd run` per
scenario and registry (tests/bench/order_app.py). Per scenario the tasks are enqueued
before the daemon starts; the drain is timed from its `serving` line until `--take` tasks
have started (groups: of 110,000) or the table is empty (sequences, limits). Statement times
are pg_stat_statements' mean over that drain for the discovery and the claim statements
(every variant). The plain drain (no new feature in the registry) is compared before/after
with tests/bench/workflows.py --types bench.noop --checkout DIR. The machine is shared: each
figure is printed with `uptime`."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

parser = argparse.ArgumentParser()
parser.add_argument("--slots", type=int, default=4)
parser.add_argument("--scenarios", default="groups,sequences,limits")
parser.add_argument("--take", type=int, default=5000)
args = parser.parse_args()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.repository import NewTask, enqueue_many, migrate  # noqa: E402
from tests.daemon import Daemon, wait_for  # noqa: E402

MARK = "/* bench */ "


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _left(conn: psycopg.Connection) -> int:
    return int(conn.execute(MARK + "SELECT count(*) FROM slotd_tasks").fetchone()[0])


def _statements(conn: psycopg.Connection) -> dict[str, tuple[int, float]]:
    """(calls, mean ms) of the discovery and of the claim, all variants."""
    rows = conn.execute(
        MARK + "SELECT query, calls, mean_exec_time FROM pg_stat_statements"
        " WHERE query NOT LIKE '%%/* bench */%%'"
    ).fetchall()
    out: dict[str, tuple[int, float]] = {}
    for query, calls, mean in rows:
        kind = (
            "discover"
            if "AS wait_s" in query
            else "claim"
            if "lease_token = coalesce(" in query
            else None
        )
        if kind:
            n, ms = out.get(kind, (0, 0.0))
            out[kind] = (n + calls, (ms * n + mean * calls) / (n + calls))
    return out


def run(
    server: LocalPostgres,
    app: str,
    label: str,
    done: callable,
    conn: psycopg.Connection,
    total: int,
) -> None:
    conn.execute(MARK + "SELECT pg_stat_statements_reset()")
    daemon = Daemon(server.url(), slots=args.slots, app=f"tests.bench.order_app:{app}")
    daemon.cmd[0] = sys.executable
    daemon.start()
    began = time.perf_counter()
    try:
        wait_for(lambda: done(conn), timeout=3600, what=label)
        took = time.perf_counter() - began
    finally:
        daemon.close()
    started = total - _left(conn)
    st = _statements(conn)
    parts = ", ".join(f"{k} {n} calls mean {ms:.2f} ms" for k, (n, ms) in sorted(st.items()))
    print(
        f"{label}: {started} started in {took:.1f}s = {started / took:.0f} tasks/s; {parts}"
        f" | {_load()}",
        flush=True,
    )


def groups(server: LocalPostgres, conn: psycopg.Connection) -> None:
    for app in ("grouped", "fair"):
        conn.execute(MARK + "TRUNCATE slotd_tasks, slotd_turns")
        with conn.transaction():
            enqueue_many(conn, [NewTask("bo.fair", group="big") for _ in range(100_000)])
            enqueue_many(conn, [NewTask("bo.fair", group=f"g{i}") for i in range(10_000)])
        conn.execute(MARK + "ANALYZE slotd_tasks")
        total = 110_000
        run(
            server,
            app,
            f"groups {app} (100,000 of one group, then 10,000 groups of one)",
            lambda c, total=total: total - _left(c) >= args.take,
            conn,
            total,
        )
        small = conn.execute(
            MARK + "SELECT 10000 - count(*) FROM slotd_tasks WHERE task_group <> 'big'"
        ).fetchone()[0]
        print(f"  small groups started among them: {small}", flush=True)
        # A backlog of one group enqueued first, 500 groups of one task after it: how many
        # of the small groups' tasks start among the first 1,000 starts.
        conn.execute(MARK + "TRUNCATE slotd_tasks, slotd_turns")
        with conn.transaction():
            enqueue_many(conn, [NewTask("bo.fair", group="big") for _ in range(20_000)])
            enqueue_many(conn, [NewTask("bo.fair", group=f"g{i}") for i in range(500)])
        total = 20_500
        run(
            server,
            app,
            f"groups {app} (20,000 of one group, then 500 groups of one)",
            lambda c, total=total: total - _left(c) >= 1000,
            conn,
            total,
        )
        small = conn.execute(
            MARK + "SELECT 500 - count(*) FROM slotd_tasks WHERE task_group <> 'big'"
        ).fetchone()[0]
        print(f"  small groups started among them: {small}", flush=True)


def sequences(server: LocalPostgres, conn: psycopg.Connection) -> None:
    import slotd

    conn.execute(MARK + "TRUNCATE slotd_tasks, slotd_sequences")
    began = time.perf_counter()
    with conn.transaction():
        slotd.enqueue_many(
            conn, [NewTask("bo.seq", sequence=f"s{i % 1000}") for i in range(10_000)]
        )
    print(
        f"sequences: 10,000 tasks into 1,000 sequences enqueued in"
        f" {time.perf_counter() - began:.1f}s",
        flush=True,
    )
    due = conn.execute(MARK + "SELECT count(*) FROM slotd_tasks WHERE isfinite(run_at)").fetchone()[
        0
    ]
    print(f"  due at once (the heads): {due}", flush=True)
    conn.execute(MARK + "ANALYZE slotd_tasks")
    run(server, "sequences", "sequences (1,000 x 10)", lambda c: _left(c) == 0, conn, 10_000)


def limits(server: LocalPostgres, conn: psycopg.Connection) -> None:
    from tests.bench.order_app import TYPES

    for app in ("unlimited", "limits"):
        conn.execute(MARK + "TRUNCATE slotd_tasks")
        with conn.transaction():
            enqueue_many(conn, [NewTask(TYPES[i % 100]) for i in range(10_000)])
        conn.execute(MARK + "ANALYZE slotd_tasks")
        run(server, app, f"100 types, {app}", lambda c: _left(c) == 0, conn, 10_000)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="slotd-order-"))
    tmp.chmod(0o711)
    preload = ["-c shared_preload_libraries=pg_stat_statements", "-c pg_stat_statements.track=top"]
    server = LocalPostgres(tmp / "pg", tmp / "sock", port=5457, extra_options=preload, fast=False)
    server.start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            migrate(conn)
            for name in args.scenarios.split(","):
                {"groups": groups, "sequences": sequences, "limits": limits}[name](server, conn)
    finally:
        server.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
