"""What operator control costs and how fast it acts (#15), on a throwaway PostgreSQL.

    python tests/bench/control_cost.py [--samples 400] [--rounds 3] [--drain 3000]

1. Claim latency, one connection in-process (discover every 20 claims, claim, dequeue), with
   the claim and discovery statements as they were before #15 (no pause clause) and as they
   are now with nothing paused, one other type paused, ten other types paused (variants
   interleave in blocks of 20 claims so the machine's noise lands on all alike); then one
   other type paused with 100,000 of its tasks due at the head of the queue, and a queue of
   1,000,000 due tasks with and without the pause clause.
2. Statements per task while a real `slotd run` (2 slots) drains bench tasks, with nothing
   paused and with another type paused (10,000 of its tasks due), from pg_stat_statements.
3. Cancel-to-stopped latency against a real `slotd run` (production kill grace, 5 s): a
   cooperative handler (rt.polite, checks ctx.cancelled every 20 ms) and one that ignores the
   cancel (rt.stubborn_long), from the cancel's commit to the handler's own "stopped" row
   (cooperative only) and to the row's settlement (both).

Server: slotd.localpg with fsync off (fast=True): compare the variants with each other."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import slotd  # noqa: E402
from slotd import repository  # noqa: E402
from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.registry import Registry  # noqa: E402
from slotd.repository import Repository, cancel_tasks, migrate  # noqa: E402
from tests.daemon import EXECUTIONS, Daemon, wait_for  # noqa: E402

PAUSE_CLAUSE = "(t.task_type NOT IN ("


def without_pause_clause(sql: str) -> str:
    """The statement as it was before #15: the spliced {unpaused} predicate made `true`."""
    while (start := sql.find(PAUSE_CLAUSE)) >= 0:
        depth, end = 0, start
        for end in range(start, len(sql)):
            depth += {"(": 1, ")": -1}.get(sql[end], 0)
            if depth == 0:
                break
        sql = sql[:start] + "true" + sql[end + 1 :]
    return sql


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def seed(conn: psycopg.Connection[Any], due: int, paused_backlog: int) -> None:
    conn.execute("TRUNCATE slotd_tasks, slotd_paused_types")
    if paused_backlog:  # older than the served work: discovery meets them first
        conn.execute(
            "INSERT INTO slotd_tasks (task_type, run_at) SELECT 'bench.held', now() - "
            "interval '2 hours' FROM generate_series(1, %s)",
            (paused_backlog,),
        )
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, run_at) SELECT 'bench.noop', now() - "
        "interval '1 hour' FROM generate_series(1, %s)",
        (due,),
    )
    conn.execute("VACUUM ANALYZE slotd_tasks")


def claim_samples(conn: psycopg.Connection[Any], n: int) -> dict[str, list[float]]:
    reg = Registry()
    reg.register("bench.noop", lambda task, ctx: None, ceiling=slotd_minute())
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


def slotd_minute() -> Any:
    from datetime import timedelta

    return timedelta(minutes=1)


VARIANTS: list[tuple[str, bool, int]] = [
    # label, pause clause in the SQL, other types paused
    ("before #15 (no pause clause)", False, 0),
    ("nothing paused", True, 0),
    ("1 other type paused", True, 1),
    ("10 other types paused", True, 10),
]
BLOCK = 20  # claims per variant in a row; variants rotate block by block


def use_statements(table: dict[str, str]) -> None:
    """Every repository module runs the statements of `table` from now on: the loaded
    statements are one cached dict that they all read, swapped here in place."""
    live = repository.statements()
    live.clear()
    live.update(table)


def bench_claims(url: str, samples: int, rounds: int) -> None:
    original = dict(repository.statements())
    before = {name: without_pause_clause(sql) for name, sql in original.items()}
    assert before["claim"] != original["claim"] and before["discover"] != original["discover"]
    results: dict[str, dict[str, list[float]]] = {
        v[0]: {"claim": [], "discover": []} for v in VARIANTS
    }
    others = ["bench.held", *(f"bench.other{n}" for n in range(1, 10))]
    with psycopg.connect(url, autocommit=True) as conn:
        blocks = samples * rounds // BLOCK
        seed(conn, blocks * BLOCK * len(VARIANTS) + 50, 0)
        for block in range(blocks):
            for label, clause, paused in VARIANTS[block % 4 :] + VARIANTS[: block % 4]:
                # Pause rows of other types only: none of them is a type being claimed.
                conn.execute("DELETE FROM slotd_paused_types")
                for name in others[:paused]:
                    slotd.pause(conn, name, by="bench")
                table = original if clause else before
                use_statements(table)
                got = claim_samples(conn, BLOCK)
                for key, values in got.items():
                    results[label][key] += values
            if block % 10 == 9:
                conn.execute("VACUUM slotd_paused_types")
        # A paused backlog ahead of the served work: what discovery pays for it today.
        seed(conn, samples + 50, 100_000)
        slotd.pause(conn, "bench.held", by="bench")
        use_statements(original)
        results["1 other type paused, 100,000 of it due first"] = claim_samples(conn, samples)
        # A deep queue: discovery must still stop at its LIMIT, paused check or not.
        seed(conn, 1_000_000, 0)
        for label, table in (("before #15", before), ("nothing paused", original)):
            use_statements(table)
            results[f"{label}, 1,000,000 due"] = claim_samples(conn, samples // 4)
    print("\n| statements | claims | claim p50 ms | claim p99 ms | discover p50 ms |")
    print("|---|---|---|---|---|")
    for label, got in results.items():
        c, d = got["claim"], got["discover"]
        print(
            f"| {label} | {len(c)} | {pct(c, 0.5) * 1000:.3f} | {pct(c, 0.99) * 1000:.3f} | "
            f"{statistics.median(d) * 1000:.3f} |"
        )


def bench_statements(server: LocalPostgres, drain: int) -> None:
    url = server.url()
    worker_url = server.url().replace("postgresql://slotd@", "postgresql://bench@")
    print("\n| drain (2 slots) | tasks | statements per task (workers) | tasks/s |")
    print("|---|---|---|---|")
    for label, backlog in (("nothing paused", 0), ("other type paused, 10,000 due", 10_000)):
        with psycopg.connect(url, autocommit=True) as admin:
            seed(admin, 0, backlog)
            if backlog:
                slotd.pause(admin, "bench.held", by="bench")
            daemon = Daemon(
                worker_url, slots=2, app="tests.bench.app:registry",
                env={"SLOTD_POLL_INTERVAL": "5s", "SLOTD_LEASE_MARGIN": "30s",
                     "SLOTD_KILL_GRACE": "5s"},
            )  # fmt: skip
            daemon.start()
            try:
                time.sleep(1.0)  # every slot in its first idle wait
                admin.execute("SELECT pg_stat_statements_reset()")
                with admin.transaction():
                    slotd.enqueue_many(admin, [("bench.noop", {}) for _ in range(drain)])
                t0 = time.perf_counter()
                wait_for(
                    lambda: (
                        admin.execute(
                            "SELECT count(*) FROM slotd_tasks WHERE task_type = 'bench.noop'"
                        ).fetchone()
                        == (0,)
                    ),
                    timeout=600,
                    what="the drain",
                )
                took = time.perf_counter() - t0
                calls = admin.execute(
                    "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
                    "WHERE userid = 'bench'::regrole"
                ).fetchone()[0]  # type: ignore[index]
            finally:
                daemon.close()
        print(f"| {label} | {drain} | {float(calls) / drain:.2f} | {drain / took:,.0f} |")


def bench_cancel(url: str, rounds: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE slotd_tasks, slotd_paused_types")
        conn.execute("DROP TABLE IF EXISTS executions")
        conn.execute(EXECUTIONS)
        daemon = Daemon(
            url, slots=1, env={"SLOTD_LEASE_MARGIN": "30s", "SLOTD_KILL_GRACE": "5s",
                               "SLOTD_POLL_INTERVAL": "5s"},
        )  # fmt: skip
        daemon.start()
        try:
            print("\n| handler | cancel -> handler saw it (s) | cancel -> settled (s) |")
            print("|---|---|---|")
            for task_type in ("rt.polite", "rt.stubborn_long"):
                saw, settled = [], []
                for _ in range(rounds):
                    task_id = slotd.enqueue(conn, task_type)
                    wait_for(
                        lambda task_id=task_id: conn.execute(
                            "SELECT 1 FROM executions WHERE task_id = %s", (task_id,)
                        ).fetchone(),
                        what="a start",
                    )
                    with conn.transaction():
                        cancel_tasks(conn, ids=[task_id], by="bench")
                    wait_for(
                        lambda task_id=task_id: (
                            conn.execute(
                                "SELECT lease_token IS NULL FROM slotd_tasks WHERE id = %s",
                                (task_id,),
                            ).fetchone()
                            == (True,)
                        ),
                        what="the settlement",
                    )
                    done = time.time()
                    at, end = conn.execute(
                        "SELECT extract(epoch FROM t.cancelled_at),"
                        " (SELECT extract(epoch FROM max(e.at)) FROM executions e"
                        "   WHERE e.task_id = t.id AND e.phase = 'end')"
                        " FROM slotd_tasks t WHERE t.id = %s",
                        (task_id,),
                    ).fetchone()  # type: ignore[misc]
                    settled.append(done - float(at))
                    if end is not None:
                        saw.append(float(end) - float(at))
                print(
                    f"| {task_type} | {', '.join(f'{s:.3f}' for s in saw) or '-'} | "
                    f"{', '.join(f'{s:.3f}' for s in settled)} |"
                )
        finally:
            daemon.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drain", type=int, default=3000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="slotd-bench-"))
    root.chmod(0o711)
    server = LocalPostgres(
        root=root / "pg",
        socket_dir=root / "sock",
        port=5434,
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
        print(f"PostgreSQL {version}, {args.samples} claims x {args.rounds} rounds per variant")
        bench_claims(server.url(), args.samples, args.rounds)
        bench_statements(server, args.drain)
        bench_cancel(server.url(), args.rounds)
    finally:
        server.stop("immediate")


if __name__ == "__main__":
    main()
