"""What an idle discovery costs when other types fill the table.

    python tests/bench/discovery_cost.py [--rows 20000 1000000] [--runs 300]

A shared queue where this replica serves `mine.a` and `mine.b` (nothing due) and another
fleet's type `theirs` holds N due rows. Times the `discover` statement (what every idle
tick and every wake costs) against discovery as it was before sql/011: the same filters in
one ordered scan over all types (slotd_tasks_order, sql/008), keeping the served ones.
Each both as PostgreSQL plans it for psycopg's prepared statement by default (auto: it kept
custom plans here) and with a generic plan (plan_cache_mode = force_generic_plan: what a
prepared statement runs once PostgreSQL settles on one), the latter also with jit = off: the
generic plan's cost estimate (an unknown LIMIT reads as 10% of the rows) passes
jit_above_cost at 1M rows, and compiling costs more than the scan. Throwaway PostgreSQL,
like the suite."""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd.dev.localpg import scratch  # noqa: E402
from slotd.repository import limit_params, migrate, statements  # noqa: E402

PARAMS = {"types": ["mine.a", "mine.b"], "limit": 80, "lead_s": 100.0, **limit_params({})}


def before_sql() -> str:
    """sql/008's discover: today's filters (claimable, window, limits), one ordered scan."""
    now = statements()["discover"]
    found = re.search(r"WHERE t\.task_type = served\.task_type AND (.*?)\n\s*ORDER BY", now, re.S)
    assert found, now
    return (
        "SELECT t.id, t.task_type FROM slotd_tasks t WHERE " + found.group(1)
        + " AND t.task_type = ANY(%(types)s::text[]) ORDER BY t.order_at, t.id LIMIT %(limit)s"
    )  # fmt: skip


MODES = ("auto", "force_generic_plan", "force_generic_plan, jit off")
_fresh = itertools.count()


def timed(conn: psycopg.Connection[Any], sql: str, runs: int) -> list[float]:
    """Median ms per plan mode; prepared, as psycopg does after a few executions."""
    medians = []
    for mode in MODES:
        conn.execute(f"SET plan_cache_mode = {mode.split(',')[0]}")
        conn.execute("SET jit = " + ("off" if "jit off" in mode else "default"))
        fresh = f"/* {next(_fresh)} */ " + sql  # a statement of its own, planned afresh
        samples = []
        for _ in range(runs):
            began = time.perf_counter()
            conn.execute(fresh, PARAMS, prepare=True).fetchall()
            samples.append(time.perf_counter() - began)
        medians.append(statistics.median(samples[5:]) * 1000)
    conn.execute("RESET plan_cache_mode")
    conn.execute("RESET jit")
    return medians


def cells(figures: list[float]) -> str:
    return " | ".join(f"{ms:.3f}" for ms in figures)


def before(conn: psycopg.Connection[Any], runs: int) -> list[float]:
    """The old statement on the old index (sql/008's), inside a transaction rolled back."""
    with conn.transaction(force_rollback=True):
        conn.execute("DROP INDEX slotd_tasks_order_by_type")
        conn.execute(
            "CREATE INDEX slotd_tasks_order ON slotd_tasks (order_at, id)"
            " INCLUDE (task_type, run_at, lease_expires_at) WHERE attempt_count < max_attempts"
        )
        return timed(conn, before_sql(), runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[20_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    with (
        scratch(prefix="slotd-bench-discovery-") as server,
        psycopg.connect(server.url(), autocommit=True) as conn,
    ):
        migrate(conn)
        print(
            "| rows of an unserved type | now, auto (ms, median) | now, generic | now, generic,"
            " no JIT | before sql/011, auto | before, generic | before, generic, no JIT |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        few = max(25, args.runs // 10)
        now, old = timed(conn, statements()["discover"], args.runs), before(conn, few)
        print(f"| 0 | {cells(now)} | {cells(old)} |")
        have = 0
        for rows in sorted(args.rows):
            conn.execute(
                "INSERT INTO slotd_tasks (task_type, run_at, order_at) SELECT 'theirs',"
                " now() - interval '1 hour', now() - interval '1 hour'"
                " FROM generate_series(1, %s)",
                (rows - have,),
            )
            have = rows
            conn.execute("VACUUM ANALYZE slotd_tasks")
            now, old = timed(conn, statements()["discover"], args.runs), before(conn, few)
            print(f"| {rows:,} | {cells(now)} | {cells(old)} |")
        plan = conn.execute("EXPLAIN " + statements()["discover"], PARAMS).fetchall()
        print("\n".join(r[0] for r in plan))


if __name__ == "__main__":
    main()
