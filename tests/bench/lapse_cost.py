"""What remembering a lapsed attempt costs a claim that takes over no lapse (#37): the
claim reads the old lease under its row lock (fragment `lapsed_lease`, two CASE columns),
so the plain claim's text changed. On a throwaway PostgreSQL (fsync off), one connection
in-process: discover every 20 claims, then claim alone (`claim.plain`) or settle-and-claim
(`succeeded.plain+claim.plain`), with the statements as they were before and as they are
now, interleaved in blocks of 20 so the machine's noise lands on both alike. Reports the
latency per statement and the server backend's CPU per claim (its /proc stat).

    python tests/bench/lapse_cost.py [--claims 4000] [--rounds 3]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd import repository  # noqa: E402
from slotd.dev.localpg import scratch  # noqa: E402
from slotd.registry import Registry  # noqa: E402
from slotd.repository import Repository, migrate  # noqa: E402
from tests.bench.control_cost import pct, seed, slotd_minute, use_statements  # noqa: E402

# The fragment's text as spliced, and the columns that carry it through the claim.
REMOVED = (
    ", CASE WHEN t.lease_token IS NOT NULL THEN t.lease_expires_at END AS lapsed_at,\n"
    "CASE WHEN t.lease_token IS NOT NULL THEN t.last_attempted_at END AS lapsed_started",
    ", l.lapsed_at, l.lapsed_started",
    ",\n              picked.lapsed_at, picked.lapsed_started",
)
BLOCK = 20
TICKS = os.sysconf("SC_CLK_TCK")


def before(sql: str) -> str:
    for text in REMOVED:
        sql = sql.replace(text, "")
    return sql


def backend_cpu(pid: int) -> float:
    """The server process's user + system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def block(conn: psycopg.Connection[Any], repo: Repository, reg: Registry, chained: bool) -> float:
    """BLOCK claims; seconds spent in the claim statements."""
    spent, batch, held = 0.0, repo.discover(reg.types, BLOCK + 5), None
    for _ in range(BLOCK):
        t0 = time.perf_counter()
        if chained and held is not None:
            got = repo.dequeue_and_claim(held.id, held.token, batch, reg)
        else:
            got = repo.claim(batch, reg)
        spent += time.perf_counter() - t0
        assert got is not None
        batch = [i for i in batch if i != got.id]
        if not chained:
            repo.dequeue(got.id, got.token)
        held = got
    if held is not None and chained:
        repo.dequeue(held.id, held.token)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    now = dict(repository.statements())
    old = {name: before(sql) for name, sql in now.items()}
    for name in ("claim.plain", "succeeded.plain+claim.plain"):
        assert old[name] != now[name] and "lapsed" not in old[name], name
    reg = Registry()
    reg.register("bench.noop", lambda task, ctx: None, ceiling=slotd_minute())
    with (
        scratch(prefix="slotd-lapse-", port=55491) as pg,
        psycopg.connect(pg.url(), autocommit=True) as conn,
    ):
        migrate(conn)
        pid = conn.info.backend_pid
        repo = Repository(conn)
        blocks = args.claims // BLOCK
        for rnd in range(args.rounds):
            seed(conn, args.claims * 4 + 100, 0)
            lat: dict[str, list[float]] = {}
            cpu: dict[str, float] = {}
            for b in range(blocks):
                for chained in (False, True):
                    order = ("before", "now") if b % 2 else ("now", "before")
                    for label in order:
                        use_statements(old if label == "before" else now)
                        key = f"{label}, {'settle+claim' if chained else 'claim alone'}"
                        c0 = backend_cpu(pid)
                        spent = block(conn, repo, reg, chained)
                        cpu[key] = cpu.get(key, 0.0) + backend_cpu(pid) - c0
                        lat.setdefault(key, []).append(spent / BLOCK)
            use_statements(now)
            print(f"\nround {rnd + 1}: {args.claims} claims per variant")
            print("| variant | statement p50 ms | p99 ms | PG CPU µs per claim (+ dequeue) |")
            print("|---|---|---|---|")
            for key in sorted(lat):
                xs = lat[key]
                print(
                    f"| {key} | {statistics.median(xs) * 1000:.3f} | "
                    f"{pct(xs, 0.99) * 1000:.3f} | {cpu[key] / args.claims * 1e6:.0f} |"
                )


if __name__ == "__main__":
    main()
