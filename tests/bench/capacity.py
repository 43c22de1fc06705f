"""The capacity model's measurements (docs/CAPACITY.md): tasks/s and CPU per task of one
primary at 1-16 slots and 1-3 replicas, everything on this machine.

    python tests/bench/capacity.py [--n 5000] [--slots 1 4 16] [--replicas 1 2 3]

Per configuration: R `slotd run --slots S` replicas (metrics off, production defaults) on
one private PostgreSQL (fsync on), N no-op tasks bulk-enqueued into the idle fleet, and
from the enqueue's commit to the empty table: tasks/s, the CPU seconds (user + system) of
every slotd process and of every PostgreSQL process, per task. CPU seconds stay meaningful
on a machine shared with other load; tasks/s do not, so the load average is printed beside
each row."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd.dev.localpg import scratch  # noqa: E402
from slotd.repository import NewTask, enqueue_many, migrate  # noqa: E402
from tests.bench.cpu_per_task import (  # noqa: E402
    _postmaster,
    _role,
    _slotd_backends,
    per_role,
    snapshot,
)
from tests.daemon import Daemon, wait_for  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    print(
        f"`python tests/bench/capacity.py {' '.join(sys.argv[1:])}`"
        f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} vCPU"
    )
    print("| replicas x slots | tasks/s | slotd µs/task | PostgreSQL µs/task | of which slotd's"
          " backends | load (1 min) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    with (
        scratch(prefix="slotd-capacity-", port=5438, fast=False) as server,
        psycopg.connect(server.url(), autocommit=True) as conn,
    ):
        migrate(conn)
        postmaster = _postmaster(server)
        for replicas in args.replicas:
            for slots in args.slots:
                fleet = [
                    Daemon(server.url(), slots=slots, app="tests.bench.app:registry")
                    for _ in range(replicas)
                ]
                try:
                    for d in fleet:
                        d.start(wait_ready=False)
                    for d in fleet:
                        d.wait_line(r"serving ", timeout=120)
                    wait_for(
                        lambda fleet=fleet, slots=slots: all(
                            len([p for p in d.tree() if _role(p) == "runners"]) == slots
                            for d in fleet
                        ),
                        timeout=120,
                    )
                    backends = _slotd_backends(conn)
                    before = [snapshot(d, postmaster, backends) for d in fleet]
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
                    after = [snapshot(d, postmaster, backends) for d in fleet]
                    own = pg = pg_ours = 0.0
                    for i, (b, a) in enumerate(zip(before, after, strict=True)):
                        cpu = per_role(b, a)
                        own += cpu["supervisor"] + cpu["slots"] + cpu["runners"]
                        if i == 0:  # the server's processes are in every snapshot: once
                            pg = cpu["pg slotd backends"] + cpu["pg other"]
                            pg_ours = cpu["pg slotd backends"]
                    per = 1e6 / args.n
                    print(
                        f"| {replicas} x {slots} | {args.n / took:,.0f} | {own * per:,.0f} |"
                        f" {pg * per:,.0f} | {pg_ours * per:,.0f} | {os.getloadavg()[0]:.1f} |",
                        flush=True,
                    )
                finally:
                    for d in fleet:
                        d.close()


if __name__ == "__main__":
    main()
