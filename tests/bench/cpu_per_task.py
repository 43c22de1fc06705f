"""CPU microseconds per task, per process role, while `slotd run` drains no-op tasks.

    python tests/bench/cpu_per_task.py [--n 5000] [--slots 4] [--rounds 2] [--py-spy DIR]
        [--types bench.noop,bench.async_noop,bench.noop+otel,bench.async_noop+otel]
        [--schemas public,jobs] [--claims 2000] [--times total|user|system]

Starts its own PostgreSQL (fsync on), runs `slotd run --slots N` (metrics off) as users run
it, bulk-enqueues n no-op tasks (sync `bench.noop` and async `bench.async_noop`, interleaved
rounds) and divides the CPU seconds each process spent over the drain by the tasks drained.
CPU seconds, unlike tasks/s, stay meaningful on a machine shared with other load; --times
user or system counts only that part of them (Python's own work, or the system calls).

A kind ending in "+otel" runs with tracing on: the tasks are enqueued with slotd.enqueue_many
inside a span (so each row carries a trace context) and every runner has the OpenTelemetry
SDK with a BatchSpanProcessor whose exporter drops the spans (tests/bench/app.py).

Roles come from the process titles slotd sets ("slotd: supervisor", "slotd: slot N",
"slotd: runner N"); PostgreSQL's figure is every child of the postmaster (backends,
walwriter, checkpointer, autovacuum), split into slotd's backends and the rest.

--py-spy DIR also records each slotd process with py-spy during the drain (collapsed stacks,
one file per role and kind; --gil: only samples holding the GIL, i.e. running Python, not
blocked in a syscall) and prints the top self-time and inclusive frames per role.

--schemas runs every kind in each of these schemas of one database (SLOTD_SCHEMA for the
daemon, schema= for the enqueue), interleaved; --claims N then also times N serial
discover + claim + dequeue on one connection per schema (psycopg prepares each statement
after its fifth run, as a slot does): the claim latency in public and in a named schema."""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import psutil
import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd.dev.localpg import LocalPostgres, scratch  # noqa: E402
from slotd.registry import Registry  # noqa: E402
from slotd.repository import NewTask, Repository, enqueue_many, migrate  # noqa: E402
from slotd.repository.named import qualified  # noqa: E402
from tests.daemon import Daemon, wait_for  # noqa: E402

ROLES = ("supervisor", "slots", "runners", "pg slotd backends", "pg other")


# Which CPU seconds count (--times): user + system, or one of them (is it Python or syscalls?).
TIMES = "total"


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    if TIMES == "user":
        return t.user
    if TIMES == "system":
        return t.system
    return t.user + t.system


def _role(p: psutil.Process) -> str | None:
    try:
        title = " ".join(p.cmdline())
    except psutil.Error:
        return None
    for prefix, role in (
        ("slotd: supervisor", "supervisor"),
        ("slotd: slot", "slots"),
        ("slotd: runner", "runners"),
    ):
        if title.startswith(prefix):
            return role
    return None


def _postmaster(server: LocalPostgres) -> psutil.Process:
    return psutil.Process(int((server.datadir / "postmaster.pid").read_text().split()[0]))


@dataclass
class Snapshot:
    cpu: dict[int, float] = field(default_factory=dict)
    role: dict[int, str] = field(default_factory=dict)


def snapshot(daemon: Daemon, postmaster: psutil.Process, slotd_backends: set[int]) -> Snapshot:
    snap = Snapshot()
    procs = [psutil.Process(daemon.pid), *daemon.tree()]
    for p in procs:
        role = _role(p)
        if role is None:
            continue
        try:
            snap.cpu[p.pid] = _cpu(p)
        except psutil.Error:
            continue
        snap.role[p.pid] = role
    for p in postmaster.children():
        try:
            snap.cpu[p.pid] = _cpu(p)
        except psutil.Error:
            continue
        snap.role[p.pid] = "pg slotd backends" if p.pid in slotd_backends else "pg other"
    try:
        snap.cpu[postmaster.pid] = _cpu(postmaster)
        snap.role[postmaster.pid] = "pg other"
    except psutil.Error:
        pass
    return snap


def per_role(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per role between two snapshots; a process born in between counts whole
    (one that died in between is lost: slotd's processes live through a drain)."""
    out = dict.fromkeys(ROLES, 0.0)
    for pid, cpu in after.cpu.items():
        out[after.role[pid]] += cpu - before.cpu.get(pid, 0.0)
    return out


def _slotd_backends(conn: psycopg.Connection) -> set[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    ).fetchall()
    return {pid for (pid,) in rows}


class Spy:
    """py-spy record on every slotd process of the daemon, stopped with SIGINT."""

    def __init__(self, out: Path, daemon: Daemon, tag: str) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        out.mkdir(parents=True, exist_ok=True)
        for p in [psutil.Process(daemon.pid), *daemon.tree()]:
            role = _role(p)
            if role is None:
                continue
            path = out / f"{tag}-{role}-{p.pid}.txt"
            cmd = ["py-spy", "record", "-p", str(p.pid), "-f", "raw", "-r", "200", "-o", str(path)]
            cmd += ["--nonblocking", "--gil"]
            spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append((role, spy))
        time.sleep(1.0)  # py-spy attaches asynchronously; the drain must not start before

    def stop(self) -> None:
        for _, spy in self.procs:
            spy.send_signal(signal.SIGINT)
        for _, spy in self.procs:
            spy.wait(60)


def top_frames(out: Path, tag: str, limit: int = 12) -> dict[str, list[tuple[float, str]]]:
    """Per role: the frames with the most self time (leaf of each collapsed stack), in %."""
    result: dict[str, list[tuple[float, str]]] = {}
    for role in ("supervisor", "slots", "runners"):
        leaf: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        total = 0
        for path in out.glob(f"{tag}-{role}-*.txt"):
            for line in path.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                if not stack:
                    continue
                n = int(count)
                frames = stack.split(";")
                leaf[frames[-1].strip()] += n
                for f in {f.strip().split(" (")[0] for f in frames}:
                    inclusive[f] += n
                total += n
        result[role] = [(100 * n / total, f) for f, n in leaf.most_common(limit)] if total else []
        result[f"{role} inclusive"] = (
            [(100 * n / total, f) for f, n in inclusive.most_common(limit * 3)] if total else []
        )
    return result


def drain(
    conn: psycopg.Connection,
    server: LocalPostgres,
    task_type: str,
    n: int,
    slots: int,
    spy_dir: Path | None,
    tag: str,
    schema: str = "public",
) -> dict[str, float]:
    task_type, _, otel = task_type.partition("+")
    env = {"SLOTD_BENCH_TRACING": "1"} if otel else {}
    env["SLOTD_SCHEMA"] = schema
    empty = f"SELECT NOT EXISTS (SELECT FROM {qualified('slotd_tasks', schema)})"
    daemon = Daemon(server.url(), slots=slots, app="tests.bench.app:registry", env=env).start()
    try:
        postmaster = _postmaster(server)
        wait_for(lambda: len([p for p in daemon.tree() if _role(p) == "runners"]) == slots)
        backends = _slotd_backends(conn)
        spy = Spy(spy_dir, daemon, tag) if spy_dir else None
        # Before the enqueue: the drain starts at its commit. The enqueue's own server time
        # lands in "pg other" (this connection's backend).
        before = snapshot(daemon, postmaster, backends)
        began = time.perf_counter()
        with conn.transaction():
            if otel:
                traced_enqueue(conn, [NewTask(task_type) for _ in range(n)], schema)
            else:
                enqueue_many(conn, [NewTask(task_type) for _ in range(n)], schema=schema)
        wait_for(
            lambda: conn.execute(empty).fetchone()[0],  # type: ignore[arg-type]
            timeout=1200,
            what="the drain",
        )
        took = time.perf_counter() - began
        after = snapshot(daemon, postmaster, backends)
        if spy:
            spy.stop()
        cpu = per_role(before, after)
        cpu["wall"] = took
        return cpu
    finally:
        daemon.close()


def traced_enqueue(conn: psycopg.Connection, rows: list[NewTask], schema: str) -> None:
    """slotd.enqueue_many under a request's span (a provider of its own, never exported)."""
    from opentelemetry.sdk.trace import TracerProvider

    import slotd

    with TracerProvider().get_tracer("bench").start_as_current_span("request"):
        slotd.enqueue_many(conn, rows, schema=schema)


def claim_latency(url: str, schema: str, n: int) -> dict[str, float]:
    """n serial discover + claim + dequeue on one connection, 1,000 due at the start."""
    registry = Registry()
    registry.register("bench.claim", lambda task, ctx: None, ceiling=timedelta(seconds=30))
    claims: list[float] = []
    settles: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        repo = Repository(conn, schema=schema)
        enqueue_many(conn, [NewTask("bench.claim")] * (n + 1000), schema=schema)
        batch: list[int] = []
        while len(claims) < n:
            if not batch:
                batch = repo.discover(registry.types, 20)
            t0 = time.perf_counter()
            got = repo.claim(batch, registry)
            t1 = time.perf_counter()
            assert got is not None
            batch = [i for i in batch if i != got.id]
            repo.dequeue(got.id, got.token)
            settles.append(time.perf_counter() - t1)
            claims.append(t1 - t0)
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
        conn.execute(f"TRUNCATE {qualified('slotd_tasks', schema)}")  # type: ignore[arg-type]
    claims.sort()
    settles.sort()
    return {
        "claim_p50_ms": claims[len(claims) // 2] * 1000,
        "claim_p99_ms": claims[int(len(claims) * 0.99)] * 1000,
        "dequeue_p50_ms": settles[len(settles) // 2] * 1000,
        "prepared": float(prepared[0]) if prepared else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--types", default="bench.noop,bench.async_noop")
    parser.add_argument("--py-spy", type=Path, default=None, dest="spy")
    parser.add_argument("--schemas", default="public")
    parser.add_argument("--claims", type=int, default=0)
    parser.add_argument("--times", choices=("total", "user", "system"), default="total")
    args = parser.parse_args()
    global TIMES
    TIMES = args.times
    schemas = args.schemas.split(",")
    kinds = [k if s == "public" else f"{k}@{s}" for k in args.types.split(",") for s in schemas]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with (
        scratch(prefix="slotd-cpu-bench-", port=5437, fast=False) as server,
        psycopg.connect(server.url(), autocommit=True) as conn,
    ):
        for schema in schemas:
            migrate(conn, schema=schema)
        runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        claims: dict[str, list[dict[str, float]]] = {schema: [] for schema in schemas}
        # Interleaved rounds: on a shared machine the load drifts, and every kind sees it.
        for r in range(args.rounds):
            for kind in kinds:
                tag = f"{kind}-{r}"
                base, _, schema = kind.partition("@")
                runs[kind].append(
                    drain(conn, server, base, args.n, args.slots, args.spy, tag, schema or "public")
                )
            for schema in schemas if args.claims else ():
                claims[schema].append(claim_latency(server.url(), schema, args.claims))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    header = "| handler | tasks/s | slotd µs/task | " + " | ".join(ROLES) + " |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for kind, results in runs.items():
        for res in results:
            own = res["supervisor"] + res["slots"] + res["runners"]
            cells = " | ".join(f"{res[role] / args.n * 1e6:,.0f}" for role in ROLES)
            rate = args.n / res["wall"]
            print(f"| {kind} | {rate:,.0f} | {own / args.n * 1e6:,.0f} | {cells} |")
    if args.claims:
        print("\n| schema | claim p50 ms | claim p99 ms | dequeue p50 ms | prepared |")
        print("|---|---|---|---|---|")
        for schema, results in claims.items():
            for c in results:
                print(
                    f"| {schema} | {c['claim_p50_ms']:.3f} | {c['claim_p99_ms']:.3f} | "
                    f"{c['dequeue_p50_ms']:.3f} | {c['prepared']:.0f} |"
                )
    if args.spy:
        for kind in kinds:
            for role, frames in top_frames(args.spy, f"{kind}-0").items():
                print(f"\npy-spy {kind} {role} (self time, % of samples):")
                for pct, frame in frames:
                    print(f"  {pct:5.1f}% {frame}")


if __name__ == "__main__":
    main()
