"""Enqueue-to-start latency at 50 tasks/s into a freshly started 4-slot replica: run.py's
step 2 alone, repeated, with each runner's first starts shown (a slot's cold first tasks are
what its p99 is made of).

    python tests/bench/start_latency.py [--n 300] [--rounds 3] [--rate 50] [--checkout DIR]
    python tests/bench/start_latency.py --first-claims 10

--first-claims K: instead, K new slot sessions (as SlotConnections makes them), half of them
warmed by Candidates.warm first, each timing its first discovery and claim of a due task,
in-process: what a new slot's first task waits for, without the daemon's other noise.

Its own PostgreSQL (fsync on), a warm producer (12 enqueues before the replica starts, as
run.py's producer has served earlier steps), then `slotd run --slots 4` started afresh each
round. The handler (tests/bench/app.py, bench.noop) writes time.time() minus the
producer's stamp taken before its enqueue. --checkout runs another tree's slotd (an A/B:
a `git worktree` or `git archive` of the commit before)."""

from __future__ import annotations

import argparse
import glob
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--checkout", type=Path, default=ROOT)
    ap.add_argument("--first-claims", type=int, default=0)
    a = ap.parse_args()
    sys.path.insert(0, str(a.checkout))
    if a.first_claims:
        first_claims(a.first_claims)
        return
    import slotd
    from slotd.dev.localpg import scratch
    from slotd.repository import migrate
    from tests.daemon import Daemon

    with scratch(port=5441, fast=False) as server:
        url = server.url()
        with psycopg.connect(url, autocommit=True) as c:
            migrate(c)
        for _ in range(a.rounds):
            out = tempfile.mkdtemp(prefix="latency-")
            enq = psycopg.connect(url, autocommit=True)
            for _ in range(12):
                slotd.enqueue(enq, "bench.noop", {})
            env = {"SLOTD_BENCH_OUT": out, "SLOTD_METRICS_ADDR": "off"}
            daemon = Daemon(url, slots=4, app="tests.bench.app:registry", env=env).start()
            try:
                time.sleep(2.0)  # the warm-up enqueues drained; every slot idle
                start = time.time() + 0.1
                for i in range(a.n):
                    pause = start + i / a.rate - time.time()
                    if pause > 0:
                        time.sleep(pause)
                    slotd.enqueue(enq, "bench.noop", {"t": time.time()})
                deadline = time.time() + 30
                empty = "SELECT NOT EXISTS (SELECT FROM slotd_tasks)"
                while time.time() < deadline and not enq.execute(empty).fetchone()[0]:  # type: ignore[index]
                    time.sleep(0.05)
                time.sleep(0.3)  # the last handler's line written
            finally:
                daemon.signal(signal.SIGTERM)
                daemon.wait(30)
                daemon.close()
                enq.close()
            runners = [
                [float(x) * 1000 for x in Path(f).read_text().split()]
                for f in glob.glob(os.path.join(out, "lat-*"))
            ]
            ms = sorted(x for r in runners for x in r)
            print(
                f"n={len(ms)} p50={pct(ms, 0.5):.2f} p95={pct(ms, 0.95):.2f} "
                f"p99={pct(ms, 0.99):.2f} max={ms[-1]:.2f} ms; first starts per runner: "
                + " | ".join(" ".join(f"{x:.1f}" for x in r[:3]) for r in runners),
                flush=True,
            )


def first_claims(k: int) -> None:
    import slotd
    from slotd import db, repository
    from slotd.dev.localpg import scratch
    from slotd.registry import load_registry
    from slotd.repository import Repository, migrate
    from slotd.slot.candidates import Candidates

    registry = load_registry("tests.bench.app:registry")
    with scratch(port=5441, fast=False) as server:
        url = server.url()
        with psycopg.connect(url, autocommit=True) as c:
            migrate(c)
        enq = psycopg.connect(url, autocommit=True)
        seen: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for i in range(k):
            warm = i % 2 == 1
            conn = db.connect(url, role="slotd slot 0")
            repository.plan_generically(conn)
            repo = Repository(conn)
            candidates = Candidates(20, 4)
            if warm:
                candidates.warm(repo, registry)
            slotd.enqueue(enq, "bench.noop", {})
            t0 = time.perf_counter()
            ids = repo.discover(
                registry.types,
                candidates.limit,
                registry.concurrency_limits,
                rates=registry.rates,
                shared=registry.shared_rows,
                fair=registry.fair_types,
                bursts=registry.group_bursts,
            )
            t1 = time.perf_counter()
            claimed = repo.claim(ids, registry)
            t2 = time.perf_counter()
            assert claimed is not None
            repo.dequeue(claimed.id, claimed.token)
            seen[warm].append(((t1 - t0) * 1000, (t2 - t1) * 1000))
            conn.close()
        for warm, times in seen.items():
            discover = sorted(d for d, _ in times)
            claim = sorted(c for _, c in times)
            print(
                f"{'warmed' if warm else 'cold  '} sessions={len(times)}: first discovery "
                f"median {pct(discover, 0.5):.2f} ms (max {discover[-1]:.2f}), first claim "
                f"median {pct(claim, 0.5):.2f} ms (max {claim[-1]:.2f})"
            )


if __name__ == "__main__":
    main()
