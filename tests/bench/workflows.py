"""Drain rate and statements per task for workflows (#24): plain no-op tasks (before/after:
must be unchanged), tasks with keep_result, a batch (`batch`: n no-op tasks in one
slotd.batch, timed to its callback's end), and a chain of dependants (`--chain K`: K tasks
each after the one before; from a parent's settlement to its child's start, p50/p99).

    python tests/bench/workflows.py [--n 5000] [--slots 2] [--rounds 2] [--checkout DIR]
        [--types bench.noop,bench.keep,batch] [--chain 0]

A private PostgreSQL (fsync on) with pg_stat_statements (track=top), slotd's schema, one
`slotd run` of the checkout's slotd (`--checkout DIR`: another worktree, e.g. the commit
before, for the before figure; its tests/bench/app.py must serve the types). Per round: n
tasks bulk-enqueued in one transaction into idle workers; the drain is timed from the commit
to the table's last row (and, for bench.keep, to the n-th stored result); statements are
pg_stat_statements calls over the drain, less this script's own (the enqueue and its polls,
marked /* bench */), divided by n. The machine is shared: the script prints `uptime` with
each figure."""

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
parser.add_argument("--n", type=int, default=5000)
parser.add_argument("--slots", type=int, default=2)
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--types", default="bench.noop,bench.keep")
parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[2])
parser.add_argument(
    "--chain", type=int, default=0, help="a chain of K dependants, after the rounds"
)
args = parser.parse_args()
sys.path.insert(0, str(args.checkout))

from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.repository import NewTask, enqueue_many, migrate  # noqa: E402
from tests.daemon import Daemon, wait_for  # noqa: E402

MARK = "/* bench */ "


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _drained(conn: psycopg.Connection, task_type: str, n: int) -> bool:
    left = conn.execute(MARK + "SELECT NOT EXISTS (SELECT FROM slotd_tasks)").fetchone()[0]
    if not left or task_type != "bench.keep":
        return bool(left)
    kept = conn.execute(MARK + "SELECT count(*) FROM slotd_results").fetchone()[0]
    return bool(kept >= n)


def one_round(conn: psycopg.Connection, task_type: str, n: int) -> tuple[float, float]:
    conn.execute(MARK + "TRUNCATE slotd_results") if task_type == "bench.keep" else None
    conn.execute(MARK + "SELECT pg_stat_statements_reset()")
    began = time.perf_counter()
    if task_type == "batch":  # n no-op tasks in one batch; drained once its callback ran
        import slotd

        with slotd.batch(conn, on_complete=("bench.noop", {})) as b:
            b.enqueue_many([NewTask("bench.noop") for _ in range(n)])
    else:
        with conn.transaction():
            enqueue_many(conn, [NewTask(task_type) for _ in range(n)])
    wait_for(lambda: _drained(conn, task_type, n), timeout=1800, what="the drain")
    took = time.perf_counter() - began
    rows = conn.execute(
        MARK + "SELECT calls, query FROM pg_stat_statements"
        " WHERE query NOT LIKE '%%/* bench */%%' AND query NOT LIKE '%%pg_stat_statements%%'"
    ).fetchall()
    # The producer's statements (the enqueue; a batch's open, join and seal) are not the
    # drain's.
    producing = (
        "INSERT INTO slotd_tasks (id, task_type, payload, key,",
        "INSERT INTO slotd_batches",
        "WITH joined AS",
        "sealed_at = now()",
    )
    enqueue_calls = sum(c for c, q in rows if any(p in q for p in producing))
    statements = sum(c for c, _ in rows) - enqueue_calls
    return n / took, statements / n


def chain(conn: psycopg.Connection, k: int, out: Path) -> tuple[float, float, float]:
    """K bench.link tasks, each after the one before, enqueued while the first cannot start
    (its parent, a bench.noop, is enqueued in the same transaction). Returns p50, p99 and
    max of (child's start - the moment its parent's settlement made it due), in ms."""
    import slotd

    for f in out.glob("link-*.txt"):
        f.unlink()
    with conn.transaction():
        parent = slotd.enqueue(conn, "bench.noop", {})
        for _ in range(k):
            parent = slotd.enqueue(conn, "bench.link", {}, after=[parent])
    wait_for(lambda: _drained(conn, "bench.link", k), timeout=1800, what="the chain")
    lat = sorted(
        float(line) * 1000 for f in out.glob("link-*.txt") for line in f.read_text().split()
    )
    assert len(lat) == k, (len(lat), k)
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))], lat[-1]


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="slotd-flows-"))
    tmp.chmod(0o711)
    preload = ["-c shared_preload_libraries=pg_stat_statements", "-c pg_stat_statements.track=top"]
    server = LocalPostgres(tmp / "pg", tmp / "sock", port=5453, extra_options=preload, fast=False)
    server.start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            migrate(conn)
            out = tmp / "out"
            out.mkdir()
            daemon = Daemon(
                server.url(),
                slots=args.slots,
                app="tests.bench.app:registry",
                env={"SLOTD_BENCH_OUT": str(out)},
            )
            daemon.env["PYTHONPATH"] = str(args.checkout)
            daemon.cmd[0] = sys.executable
            daemon.start()
            try:
                for task_type in args.types.split(","):
                    one_round(conn, task_type, min(args.n, 500))  # warm-up, not reported
                    for r in range(args.rounds):
                        rate, per_task = one_round(conn, task_type, args.n)
                        print(
                            f"{args.checkout.name} {task_type} round {r + 1}: n={args.n}"
                            f" {rate:.0f} tasks/s, {per_task:.2f} statements/task"
                            f" | {_load()}",
                            flush=True,
                        )
                if args.chain:
                    p50, p99, worst = chain(conn, args.chain, out)
                    print(
                        f"{args.checkout.name} chain of {args.chain} dependants: parent settled"
                        f" -> child started p50 {p50:.1f} ms, p99 {p99:.1f} ms, max"
                        f" {worst:.1f} ms | {_load()}",
                        flush=True,
                    )
            finally:
                daemon.close()
    finally:
        server.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
