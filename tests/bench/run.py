"""slotd's benchmark: slotd, procrastinate, pgqueuer, oban and the database's own ceiling
for slotd's statements, side by side on one private PostgreSQL, one run.

    python tests/bench/run.py            # full run, < 15 min on a 2-core machine
    python tests/bench/run.py --quick    # every step at small counts (the suite runs it)
    python tests/bench/run.py --quick --only slotd   # slotd's steps only, no peers
    python tests/bench/run.py --only floor   # slotd's drain and the pgbench floor: the ratio

Appends one section to tests/bench/RESULTS.md per run (never overwrites), so runs sit side
by side and their noise is visible. The peers are installed (latest from PyPI) into
tests/bench/.work/venv, oban (oban-py, which needs Python >= 3.12) into
tests/bench/.work/venv-oban, and run from there; slotd runs as users run it, `slotd run`,
with the runner hop included.

The server: fsync=on, synchronous_commit=on, full_page_writes=on (a production server's
durability), shared_buffers=256MB, pg_stat_statements (track=top) to count statements per
role: `bench` is every worker (slotd's slots and supervisor, the peers' workers, pgbench),
`bench_enq` the producer, `slotd` (the superuser) our own monitoring."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import slotd  # noqa: E402
from slotd.dev.localpg import LocalPostgres, find_bindir  # noqa: E402
from slotd.registry import load_registry  # noqa: E402
from slotd.repository import NewTask, Repository, enqueue_many, migrate, statements  # noqa: E402
from tests.daemon import Daemon  # noqa: E402

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
VENV = WORK / "venv"
VENV_OBAN = WORK / "venv-oban"  # oban-py needs Python >= 3.12; the other peers run on ours
APP = "tests.bench.app:registry"
DB = "bench"
KEEP = "bench-keep"  # in-process connections that clean() must not terminate
PEER_PKGS = ["procrastinate", "pgqueuer", "psycopg[binary]", "psycopg-pool", "asyncpg"]
OBAN_PKGS = ["oban"]


@dataclass(frozen=True)
class Profile:
    drain_n: int
    drain_slots: tuple[int, ...]
    mem_rounds: int  # 4-slot drains of drain_n back to back: memory before/after
    peer_n: int
    pgbench_slots: tuple[int, ...]
    lat_n: int
    idle_s: float
    idle_warmup_s: float
    backlog_big: int
    claim_samples: int
    enqueue_n: int
    watchdog_rounds: int
    variant_n: int
    sync_off_drain: bool = True


PROFILES = {
    "full": Profile(
        20_000,
        (1, 2, 4, 8, 16),
        5,
        20_000,
        (1, 2, 4, 8, 16),
        300,
        30,
        11,
        1_000_000,
        400,
        10_000,
        3,
        3_000,
    ),
    "quick": Profile(1_000, (1, 4), 2, 1_000, (4,), 50, 6, 2, 50_000, 100, 2_000, 1, 500),
    # Every contender at 4 workers and the latency at 50 tasks/s, in a quarter of the time.
    "medium": Profile(
        5_000, (4,), 1, 5_000, (4,), 300, 30, 11, 100_000, 200, 5_000, 1, 1_000, False
    ),
}


@dataclass(frozen=True)
class CpuMark:
    server: float  # every PostgreSQL process's CPU seconds so far
    ours: dict[int, float]  # the bench's own backends (monitor, producer), by pid
    workers: dict[int, float]  # the contender's processes, by pid

    def per_task_us(self, before: CpuMark, n: int) -> dict[str, float]:
        """CPU microseconds per task between two marks: PostgreSQL's for the workers (the
        bench's own backends taken out; one born in between counts whole) and the
        workers' own (processes that live through the drain)."""
        ours = sum(cpu - before.ours.get(pid, 0.0) for pid, cpu in self.ours.items())
        mine = sum(cpu - before.workers.get(pid, 0.0) for pid, cpu in self.workers.items())
        return {
            "pg_cpu_us_per_task": round((self.server - before.server - ours) / n * 1e6),
            "workers_cpu_us_per_task": round(mine / n * 1e6),
        }


# Environment for every `slotd run`: production defaults except metrics (no port clash).
DAEMON_ENV = {
    "SLOTD_POLL_INTERVAL": "5s",
    "SLOTD_LEASE_MARGIN": "30s",
    "SLOTD_KILL_GRACE": "5s",
    "SLOTD_SHUTDOWN_GRACE": "5s",
    "SLOTD_BACKOFF_BASE": "15s",
    "SLOTD_BACKOFF_CAP": "10m",
    "SLOTD_METRICS_ADDR": "off",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)] if s else float("nan")


class Bench:
    def __init__(self, profile: Profile, sync_commit: str, out: Path) -> None:
        self.p = profile
        self.tmp = Path(tempfile.mkdtemp(prefix="slotd-bench-"))
        self.out = out
        self.pg = LocalPostgres(
            self.tmp / "pg",
            self.tmp / "sock",
            port=55_000 + os.getpid() % 5000,
            extra_options=[
                "-c shared_buffers=256MB",
                "-c fsync=on",
                f"-c synchronous_commit={sync_commit}",
                "-c shared_preload_libraries=pg_stat_statements",
                "-c pg_stat_statements.track=top",
                "-c pg_stat_statements.max=2000",
            ],
        )
        self.daemons: list[FileLogDaemon] = []
        self.procs: list[subprocess.Popen[Any]] = []
        self.results: dict[str, Any] = {}
        self.skipped: dict[str, str] = {}  # peer -> why it could not be installed

    # set-up

    def url(self, user: str) -> str:
        return f"postgresql://{user}@/{DB}?host={self.pg.socket_dir}&port={self.pg.port}"

    def start(self) -> None:
        os.chmod(self.tmp, 0o755)  # the server user must reach its directories under ours
        self.pg.start()
        self.pg.wait_ready()
        with psycopg.connect(self.pg.url(), autocommit=True) as c:
            # Roles only so pg_stat_statements can tell workers, producer and monitor apart.
            c.execute("CREATE ROLE bench LOGIN SUPERUSER")
            c.execute("CREATE ROLE bench_enq LOGIN SUPERUSER")
            c.execute(f"CREATE DATABASE {DB} OWNER bench")
        self.admin = psycopg.connect(self.url("slotd"), autocommit=True)
        self.admin.execute("CREATE EXTENSION pg_stat_statements")
        with psycopg.connect(self.url("bench"), autocommit=True) as c:
            migrate(c)
        self.enq = psycopg.connect(self.url("bench_enq"), autocommit=True, application_name=KEEP)

    def close(self) -> None:
        for d in self.daemons:
            d.close()
        for p in self.procs:
            _stop_group(p)
        with contextlib.suppress(Exception):
            self.pg.stop("immediate")
        shutil.rmtree(self.tmp, ignore_errors=True)

    # counting

    def counters(self) -> dict[str, float]:
        row = self.admin.execute(
            """SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
                        WHERE userid = 'bench'::regrole)::float8,
                      (SELECT xact_commit + xact_rollback FROM pg_stat_database
                        WHERE datname = current_database())::float8"""
        ).fetchone()
        self.admin.execute("SELECT pg_stat_clear_snapshot()")
        assert row is not None
        return {"t": time.time(), "stmts": row[0], "xacts": row[1]}

    def cpu_mark(self, workers: list[psutil.Process]) -> CpuMark:
        """CPU seconds so far: the server's (the postmaster, its live children, and the
        children it has reaped, so a backend that exits mid-drain still counts), less the
        bench's own backends (this monitor, the producers: role slotd or bench_enq), and the
        workers' processes'."""
        pm = self.postmaster
        t = pm.cpu_times()
        server = t.user + t.system + t.children_user + t.children_system
        for child in pm.children():
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                server += c.user + c.system
        ours: dict[int, float] = {}
        for (pid,) in self.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE usename IN ('slotd', 'bench_enq')"
        ).fetchall():
            with contextlib.suppress(psutil.Error):
                c = psutil.Process(pid).cpu_times()
                ours[pid] = c.user + c.system
        self.admin.execute("SELECT pg_stat_clear_snapshot()")
        mine: dict[int, float] = {}
        for proc in workers:
            with contextlib.suppress(psutil.Error):
                c = proc.cpu_times()
                mine[proc.pid] = c.user + c.system
        return CpuMark(server, ours, mine)

    def wait_backends_gone(self, user: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (user,)
            ).fetchone()
            self.admin.execute("SELECT pg_stat_clear_snapshot()")
            exiting = [c for c in self.postmaster.children() if _status(c) == psutil.STATUS_ZOMBIE]
            if left == (0,) and not exiting:
                time.sleep(0.2)  # a backend off the view may still be on its way out
                return
            time.sleep(0.05)

    @functools.cached_property
    def postmaster(self) -> psutil.Process:
        return psutil.Process(int((self.pg.datadir / "postmaster.pid").read_text().split()[0]))

    def reset_stats(self) -> None:
        self.admin.execute("SELECT pg_stat_statements_reset()")

    def mix(self, per: float, limit: int = 6) -> list[str]:
        rows = self.admin.execute(
            r"""SELECT calls, mean_exec_time, left(regexp_replace(query, '\s+', ' ', 'g'), 70)
                FROM pg_stat_statements WHERE userid = 'bench'::regrole
                ORDER BY calls DESC LIMIT %s""",
            (limit,),
        ).fetchall()
        return [f"{c / per:.2f} x {m:.3f} ms `{q}`" for c, m, q in rows]

    def remaining(self, table: str, where: str = "") -> int:
        row = self.admin.execute(f"SELECT count(*) FROM {table} {where}").fetchone()
        return int(row[0]) if row else -1

    def wait_empty(self, table: str, where: str = "", timeout: float = 600) -> float:
        deadline = time.time() + timeout
        while time.time() < deadline:
            left = self.remaining(table, where)
            if left == 0:
                return time.time()
            time.sleep(0.1 if left > 2000 else 0.01)
        raise RuntimeError(f"{table} not drained within {timeout}s")

    def clean(self) -> None:
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE usename IN ('bench', 'bench_enq') AND pid <> pg_backend_pid() "
            "AND application_name NOT LIKE 'bench-keep%%'"
        )
        self.admin.execute("TRUNCATE slotd_tasks, slotd_replicas, slotd_maintenance")
        self.admin.execute("CHECKPOINT")

    # slotd

    @contextlib.contextmanager
    def daemon(self, slots: int, **env: str) -> Iterator[FileLogDaemon]:
        outdir = Path(tempfile.mkdtemp(prefix="out-", dir=self.tmp))
        d = FileLogDaemon(
            self.url("bench"),
            slots=slots,
            app=APP,
            env={**DAEMON_ENV, "SLOTD_BENCH_OUT": str(outdir), **env},
        )
        d.outdir = outdir
        self.daemons.append(d)
        d.start()
        time.sleep(1.0)  # every slot has reached its first idle wait
        try:
            yield d
        finally:
            d.signal(signal.SIGTERM)
            try:
                d.wait(30)
            finally:
                d.close()
                self.daemons.remove(d)

    def enqueue_bulk(self, n: int, task_type: str = "bench.noop") -> float:
        with self.enq.transaction():
            enqueue_many(self.enq, [NewTask(task_type, {"i": i}) for i in range(n)])
        return time.time()

    def drain_slotd(self, d: Daemon, n: int) -> dict[str, Any]:
        procs = [psutil.Process(d.pid), *d.tree()]
        self.reset_stats()
        s0 = self.counters()
        c0 = self.cpu_mark(procs)
        t0 = self.enqueue_bulk(n)
        t1 = self.wait_empty("slotd_tasks")
        c1 = self.cpu_mark(procs)
        s1 = self.counters()
        return {
            "tasks_per_s": round(n / (t1 - t0), 1),
            "stmts_per_task": round((s1["stmts"] - s0["stmts"]) / n, 3),
            **c1.per_task_us(c0, n),
            "mix": self.mix(n),
        }

    def bench_drain(self) -> None:
        out: dict[str, Any] = {}
        for slots in self.p.drain_slots:
            if slots == 4:
                continue  # measured by the memory run below: mem_rounds drains at 4 slots
            self.clean()
            with self.daemon(slots) as d:
                out[str(slots)] = [self.drain_slotd(d, self.p.drain_n)]
            log(f"  slotd drain slots={slots}: {out[str(slots)][0]['tasks_per_s']} tasks/s")
        # One 4-slot replica, the default, for most figures: memory at start, latency into
        # it while idle, mem_rounds drains, memory again, then its idle cost (alone and in a
        # fleet of three).
        self.clean()
        with self.daemon(4) as d:
            mem0 = self.memory(d)
            lat = self.paced_slotd(self.p.lat_n, 50.0, d.outdir)
            self.results.setdefault("latency", {})["slotd (4 slots)"] = _lat_summary(lat)
            log(f"  slotd latency: {_lat_summary(lat)}")
            rounds = []
            mem_first = mem0
            for _ in range(self.p.mem_rounds):
                rounds.append(self.drain_slotd(d, self.p.drain_n))
                log(f"  slotd drain slots=4: {rounds[-1]['tasks_per_s']} tasks/s")
                if len(rounds) == 1:
                    # After the first drain too: a forked child's USS grows as it touches
                    # pages it shared with its parent; a leak keeps growing after that.
                    mem_first = self.memory(d)
            mem1 = self.memory(d)
            idle: dict[str, Any] = {}
            time.sleep(self.p.idle_warmup_s)
            idle["1 replica x 4 slots"] = self.idle_window()
            with self.daemon(4), self.daemon(4):
                time.sleep(self.p.idle_warmup_s)
                idle["3 replicas x 4 slots"] = self.idle_window()
            self.results["idle"] = idle
            log(f"  idle: {idle}")
        out["4"] = rounds
        if self.p.sync_off_drain:
            self.clean()
            with self.daemon(4, SLOTD_SYNCHRONOUS_COMMIT="off") as d:
                off = self.results["drain_sync_off_4"] = self.drain_slotd(d, self.p.drain_n)
            log(f"  slotd drain slots=4 sync off: {off['tasks_per_s']}")
        self.results["drain"] = dict(sorted(out.items(), key=lambda kv: int(kv[0])))
        self.results["memory"] = {
            "tasks": self.p.drain_n * self.p.mem_rounds,
            "start": mem0,
            "first_drain": mem_first,
            "end": mem1,
        }

    def memory(self, d: Daemon) -> dict[str, dict[str, float]]:
        procs = {"supervisor": psutil.Process(d.pid)}
        for p in d.tree():
            with contextlib.suppress(psutil.Error):
                title = " ".join(p.cmdline())
                if "slot 0" in title and "slot" not in procs:
                    procs["slot"] = p
                elif "runner 0" in title and "runner" not in procs:
                    procs["runner"] = p
        whole = 0.0
        out: dict[str, dict[str, float]] = {}
        for name, p in procs.items():
            info = p.memory_full_info()
            out[name] = {"uss_mib": info.uss / 2**20, "pss_mib": info.pss / 2**20}
        for p in [psutil.Process(d.pid), *d.tree()]:
            with contextlib.suppress(psutil.Error):
                whole += p.memory_full_info().uss / 2**20
        out["supervisor + all slots + all runners"] = {"uss_mib": whole, "pss_mib": float("nan")}
        return out

    def paced_slotd(self, n: int, rate: float, outdir: Path) -> list[float]:
        start = time.time() + 0.1
        for i in range(n):
            pause = start + i / rate - time.time()
            if pause > 0:
                time.sleep(pause)
            slotd.enqueue(self.enq, "bench.noop", {"t": time.time()})
        self.wait_empty("slotd_tasks", timeout=60)
        time.sleep(0.2)
        return _read_floats(outdir, "lat-")

    def idle_window(self) -> dict[str, Any]:
        self.reset_stats()
        s0 = self.counters()
        time.sleep(self.p.idle_s)
        s1 = self.counters()
        dt = s1["t"] - s0["t"]
        return {
            "stmts_per_s": round((s1["stmts"] - s0["stmts"]) / dt, 3),
            "xacts_per_s": round((s1["xacts"] - s0["xacts"] - 1) / dt, 3),
            "mix": self.mix(dt, 4),
        }

    # in-process: claim latency, enqueue rate, write-lane variants

    def bench_claim_latency(self) -> None:
        registry = load_registry(APP)
        out: dict[str, Any] = {}
        big = self.p.backlog_big
        cases = [
            (f"{1000:,} due", 1000, 0),
            (f"{big:,} due", big, 0),
            (f"1,000 due + {big:,} dead letters", 1000, big),
        ]
        with psycopg.connect(self.url("bench"), autocommit=True, application_name=KEEP) as c:
            repo = Repository(c)
            for label, due, dead in cases:
                self.clean()
                self._seed(due, dead)
                disc, claim, settle = [], [], []
                batch: list[int] = []
                for _ in range(self.p.claim_samples):
                    t0 = time.perf_counter()
                    if not batch:
                        batch = repo.discover(registry.types, 20)
                        disc.append(time.perf_counter() - t0)
                    t1 = time.perf_counter()
                    got = repo.claim(batch, registry)
                    t2 = time.perf_counter()
                    assert got is not None
                    batch = [i for i in batch if i != got.id]
                    repo.dequeue(got.id, got.token)
                    settle.append(time.perf_counter() - t2)
                    claim.append(t2 - t1)
                out[label] = {
                    "claim_p50_ms": round(pct(claim, 0.5) * 1000, 3),
                    "claim_p99_ms": round(pct(claim, 0.99) * 1000, 3),
                    "discover_p50_ms": round(pct(disc, 0.5) * 1000, 3),
                    "dequeue_p50_ms": round(pct(settle, 0.5) * 1000, 3),
                }
                log(f"  claim latency {label}: {out[label]}")
        self.results["claim_latency"] = out

    def _seed(self, due: int, dead: int) -> None:
        # Bulk fixtures straight into the table: a million rows through enqueue_many would
        # measure the producer, which has its own figure below.
        self.admin.execute(
            "INSERT INTO slotd_tasks (task_type, payload, run_at) "
            "SELECT 'bench.noop', jsonb_build_object('i', g), now() - interval '1 hour' "
            "FROM generate_series(1, %s) g",
            (due,),
        )
        if dead:
            self.admin.execute(
                "INSERT INTO slotd_tasks (task_type, payload, run_at, attempt_count, "
                "last_error, last_attempted_at) "
                "SELECT 'bench.noop', '{}', now() - interval '2 hours', 20, 'boom', now() "
                "FROM generate_series(1, %s) g",
                (dead,),
            )
        self.admin.execute("ANALYZE slotd_tasks")

    def bench_enqueue(self) -> None:
        self.clean()
        n = self.p.enqueue_n
        t0 = time.perf_counter()
        with self.enq.transaction():
            for i in range(n):
                slotd.enqueue(self.enq, "bench.noop", {"i": i})
        single = n / (time.perf_counter() - t0)
        self.clean()
        t0 = time.perf_counter()
        with self.enq.transaction():
            slotd.enqueue_many(self.enq, [NewTask("bench.noop", {"i": i}) for i in range(n)])
        many = n / (time.perf_counter() - t0)
        self.results["enqueue"] = {
            "n": n,
            "enqueue_rows_per_s": round(single),
            "enqueue_many_rows_per_s": round(many),
        }
        log(f"  enqueue: {self.results['enqueue']}")

    def bench_write_variants(self) -> None:
        """One connection, serial discover + claim + dequeue, no runner hop: what each
        way of bounding a write costs per task (the SET LOCAL question of issue 7)."""
        registry = load_registry(APP)
        n = self.p.variant_n
        out: dict[str, Any] = {}
        with psycopg.connect(self.url("bench"), autocommit=True, application_name=KEEP) as c:
            variants = [
                ("slotd write lane (bound, one implicit transaction)", Repository(c)),
                ("no bound, plain autocommit", _Unbounded(c)),
                (
                    "slotd write lane, SLOTD_SYNCHRONOUS_COMMIT=off",
                    Repository(c, synchronous_commit=False),
                ),
                ("bound in BEGIN ... COMMIT (slotd before issue 7)", _Explicit(c)),
            ]
            # Twice, interleaved: the first pass after a CHECKPOINT pays full-page writes.
            for label, repo in variants + variants:
                self.clean()
                self.enqueue_bulk(n)
                t0 = time.perf_counter()
                done = 0
                while batch := repo.discover(registry.types, 20):
                    for _ in range(len(batch)):
                        got = repo.claim(batch, registry)
                        if got is None:
                            break
                        batch = [i for i in batch if i != got.id]
                        repo.dequeue(got.id, got.token)
                        done += 1
                dt = time.perf_counter() - t0
                out.setdefault(label, []).append(round(done / dt))
        self.results["write_variants"] = out
        log(f"  write variants: {out}")

    def bench_watchdog(self) -> None:
        self.clean()
        env = {"SLOTD_LEASE_MARGIN": "3s", "SLOTD_KILL_GRACE": "500ms"}
        kills, serves = [], []
        with self.daemon(1, **env) as d:
            outdir = d.outdir
            for _ in range(self.p.watchdog_rounds):
                before = len(_read_lines(outdir, "stuck-"))
                with self.enq.transaction():
                    enqueue_many(self.enq, [NewTask("bench.stuck", {})])
                time.sleep(0.05)  # the probe sorts after the stuck task
                with self.enq.transaction():
                    enqueue_many(self.enq, [NewTask("bench.mark", {})])
                deadline = time.time() + 30
                while len(_read_lines(outdir, "stuck-")) <= before:
                    if time.time() > deadline:
                        raise RuntimeError("the stuck handler never started")
                    time.sleep(0.005)
                # One file per runner process, and glob order is not time order.
                info = max(map(json.loads, _read_lines(outdir, "stuck-")), key=_deadline)
                while psutil.pid_exists(info["pid"]) and _alive(info["pid"]):
                    time.sleep(0.001)
                dead_at = time.time()
                self.wait_empty("slotd_tasks", "WHERE task_type = 'bench.mark'", timeout=30)
                marks = [float(x.split()[0]) for x in _read_lines(outdir, "mark-")]
                kills.append(dead_at - info["deadline"])
                serves.append(max(marks) - dead_at)
                self.admin.execute("DELETE FROM slotd_tasks")
        self.results["watchdog"] = {
            "kill_grace_s": 0.5,
            "kill_after_deadline_s": [round(x, 3) for x in kills],
            "serving_again_s": [round(x, 3) for x in serves],
        }
        log(f"  watchdog: {self.results['watchdog']}")

    # the ceiling

    def bench_pgbench(self) -> None:
        script = self.tmp / "claim_settle.sql"
        script.write_text(pgbench_script())
        out: dict[str, Any] = {}
        for conc in self.p.pgbench_slots:
            self.clean()
            n = self.p.drain_n
            self.enqueue_bulk(n)
            self.reset_stats()
            c0 = self.cpu_mark([])
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            per_client = math.ceil(n / conc) + 5
            cmd = [
                str(find_bindir() / "pgbench"),
                "-n",
                "-M",
                "prepared",
                "-c",
                str(conc),
                "-j",
                str(min(conc, 2)),
                "-t",
                str(per_client),
                "-f",
                str(script),
                "-D",
                "types={bench.noop}",
                "-D",
                "ceilings={30}",
                "-D",
                "types_max_attempts={20}",  # not max_attempts: \aset sets that name
                "-D",
                "margin=30",
                "-D",
                "id=0",  # no such task: the first statement settles nothing
                "-D",
                "lease_token=00000000-0000-0000-0000-000000000000",
                "-h",
                str(self.pg.socket_dir),
                "-p",
                str(self.pg.port),
                "-U",
                "bench",
                DB,
            ]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            # pgbench's backends exit with it: their CPU counts once the postmaster has
            # reaped them (then it is in its children's times), not while they are exiting.
            self.wait_backends_gone("bench")
            c1 = self.cpu_mark([])
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            client = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", res.stdout)
            left = self.remaining("slotd_tasks")
            if res.returncode != 0 or not m:
                raise RuntimeError(f"pgbench failed: {res.stderr[-800:]}")
            tx = per_client * conc
            tps = float(m.group(1)) * (n - left) / tx
            done = max(1, n - left)
            out[str(conc)] = {
                "tasks_per_s": round(tps, 1),
                "left": left,
                "pg_cpu_us_per_task": c1.per_task_us(c0, done)["pg_cpu_us_per_task"],
                "workers_cpu_us_per_task": round(client / done * 1e6),  # pgbench itself
                "mix": self.mix(n, 4),
            }
            log(f"  pgbench ceiling c={conc}: {out[str(conc)]['tasks_per_s']} tasks/s")
        self.results["pgbench"] = out
        self.results["pgbench_cmd"] = " ".join(cmd[:-9] + ["..."])

    # peers

    def bench_peers(self) -> None:
        for system in _PEER_LEFT:
            if system in self.skipped:
                continue
            install = [_peer_python(system), str(HERE / "peers.py"), "install", system]
            res = subprocess.run([*install, self.url("bench")], capture_output=True, text=True)
            if res.returncode != 0:
                tail = (res.stderr.strip().splitlines() or ["?"])[-1]
                self.skipped[system] = f"its schema install failed: {tail}"
        # (label, system, knobs, also measure start latency and idle cost on this worker)
        runs = [
            ("procrastinate concurrency=4", "procrastinate", ["conc=4"], True),
            ("pgqueuer defaults (batch 10)", "pgqueuer", [], False),
            (
                "pgqueuer batch_size=1, max_concurrent_tasks=4",
                "pgqueuer",
                ["batch=1", "conc=4"],
                True,
            ),
            ('oban queues={"default": 4}, defaults otherwise', "oban", ["conc=4"], True),
        ]
        drains: dict[str, Any] = {}
        lats: dict[str, Any] = {}
        idle: dict[str, Any] = {}
        for label, system, knobs, paced in runs:
            if system in self.skipped:
                continue
            py = _peer_python(system)
            self._clean_peers()
            with self.peer(system, knobs) as (outdir, worker):
                procs = [worker, *worker.children(recursive=True)]
                self.reset_stats()
                s0 = self.counters()
                c0 = self.cpu_mark(procs)
                # The producer keeps its connection until the drain is counted, so its
                # backend's CPU is still there to be taken out of the server's.
                bulk = subprocess.Popen(
                    [
                        py,
                        str(HERE / "peers.py"),
                        "bulk",
                        system,
                        self.url("bench_enq"),
                        str(self.p.peer_n),
                    ],  # fmt: skip
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert bulk.stdout is not None and bulk.stdin is not None
                line = bulk.stdout.readline()
                if not line.startswith("committed "):
                    bulk.wait(60)
                    raise RuntimeError(f"{system}: the bulk enqueue failed")
                t0 = float(line.split()[-1])
                t1 = self.wait_empty(*_PEER_LEFT[system])
                c1 = self.cpu_mark(procs)
                s1 = self.counters()
                bulk.stdin.close()
                bulk.wait(60)
                drains[label] = {
                    "tasks_per_s": round(self.p.peer_n / (t1 - t0), 1),
                    "stmts_per_task": round((s1["stmts"] - s0["stmts"]) / self.p.peer_n, 3),
                    **c1.per_task_us(c0, self.p.peer_n),
                    "mix": self.mix(self.p.peer_n, 4),
                }
                log(f"  {label}: {drains[label]}")
                if paced:
                    self._clean_peers(keep_workers=True)
                    subprocess.run(
                        [
                            py,
                            str(HERE / "peers.py"),
                            "paced",
                            system,
                            self.url("bench_enq"),
                            str(self.p.lat_n),
                            "50",
                        ],
                        check=True,
                    )
                    self.wait_empty(*_PEER_LEFT[system], timeout=60)
                    time.sleep(0.3)
                    lats[label] = _lat_summary(_read_floats(outdir, "lat-"))
                    log(f"  {label} latency: {lats[label]}")
                    # The same worker, idle, as slotd's replica is measured: its own
                    # defaults decide what it polls.
                    time.sleep(self.p.idle_warmup_s)
                    idle[f"{label}, 1 worker"] = self.idle_window()
                    log(f"  {label} idle: {idle[f'{label}, 1 worker']}")
        self.results["peers"] = drains
        self.results["peers_skipped"] = dict(self.skipped)
        self.results.setdefault("latency", {}).update(lats)
        self.results.setdefault("idle", {}).update(idle)

    def _clean_peers(self, keep_workers: bool = False) -> None:
        if not keep_workers:
            self.admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE usename IN ('bench', 'bench_enq') AND pid <> pg_backend_pid()"
            )
        # oban keeps finished jobs (its pruner deletes them after a day); its leader and
        # producer rows belong to a running worker, so they go only with the workers.
        oban = "oban_jobs" if keep_workers else "oban_jobs, oban_leaders, oban_producers"
        tables = {
            "procrastinate": "procrastinate_jobs, procrastinate_events",
            "pgqueuer": "pgqueuer, pgqueuer_log",
            "oban": oban,
        }
        installed = [t for system, t in tables.items() if system not in self.skipped]
        if installed:
            self.admin.execute(f"TRUNCATE {', '.join(installed)} CASCADE")
        self.admin.execute("CHECKPOINT")

    @contextlib.contextmanager
    def peer(self, system: str, knobs: list[str]) -> Iterator[tuple[Path, psutil.Process]]:
        outdir = Path(tempfile.mkdtemp(prefix="peer-", dir=self.tmp))
        p = subprocess.Popen(
            [
                _peer_python(system),
                str(HERE / "peers.py"),
                "work",
                system,
                self.url("bench"),
                str(outdir),
                *knobs,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.procs.append(p)
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{system} worker did not start")
        time.sleep(2.0)  # LISTEN and registration done
        try:
            yield outdir, psutil.Process(p.pid)
        finally:
            _stop_group(p)
            self.procs.remove(p)


class FileLogDaemon(Daemon):
    """tests.daemon.Daemon with its log in a file: at a line per task, a reader thread in
    this process would take CPU from the two cores being measured."""

    outdir: Path

    def start(self, wait_ready: bool = True) -> FileLogDaemon:
        self.logfile = self.outdir / "daemon.log"
        with self.logfile.open("w") as sink:
            self.proc = subprocess.Popen(
                self.cmd,
                env=self.env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=sink,
                text=True,
                start_new_session=True,
            )
        if wait_ready:
            self.wait_line(r"serving ")
        return self

    def wait_line(self, pattern: str, timeout: float = 30.0, after: int = 0) -> str:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.logfile.read_text().splitlines()[after:]:
                if regex.search(line):
                    return line
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = self.logfile.read_text()[-3000:]
        raise RuntimeError(f"slotd run: no log line matching {pattern!r}:\n{tail}")


_PEER_LEFT = {  # every peer: the table and filter of its unfinished jobs
    "procrastinate": ("procrastinate_jobs", "WHERE status IN ('todo', 'doing')"),
    "pgqueuer": ("pgqueuer", ""),
    "oban": ("oban_jobs", "WHERE state IN ('available', 'executing', 'scheduled', 'retryable')"),
}


class _Explicit(Repository):
    """The write lane as it was: BEGIN, bound, statement, COMMIT in one pipeline."""

    @contextlib.contextmanager
    def _bounded(
        self, lock_types: Any = (), before: Any = None
    ) -> Iterator[psycopg.Connection[Any]]:
        # The bench's claims take no type lock and no `before` statement: refuse one loudly
        # rather than measure a write that skipped it.
        assert not lock_types and before is None
        with self.write.pipeline(), self.write.transaction():
            self.write.execute(statements()["bound"], self._bounds)
            yield self.write


class _Unbounded(Repository):
    """The same statements without the SET LOCAL bound: the floor the bound is paid against."""

    def _write(
        self, name: str, params: Any, lock_types: Any = (), before: Any = None
    ) -> tuple[int, list[tuple[Any, ...]]]:
        assert not lock_types and before is None
        cur = self.write.execute(statements()[name], params)
        return cur.rowcount, (cur.fetchall() if cur.description else [])


def pgbench_script() -> str:
    """slotd's one-statement floor for pgbench: the fenced delete of the task just run and
    the single-row claim of the next, in one statement (`succeeded.plain+claim.plain`, what a slot
    sends per task once a backlog flows). pgbench cannot keep a discovery batch between
    transactions, so the claim's candidate list is the discovery statement itself, inlined:
    one statement per task, one row claimed. Built from the statements as loaded, so a
    change to them changes the floor (and a parameter this script cannot bind fails the
    bench's smoke in the suite, tests/test_bench_smoke.py)."""
    s = statements()
    unlimited = {  # an unlimited, unrated registry's arrays, and the default step's window
        "%(limited)s": "'{}'",
        "%(max_running)s": "'{}'",
        "%(max_per_group)s": "'{}'",
        "%(settling)s": "NULL",
        "%(settling_token)s": "NULL",
        "%(rated)s": "'{}'",
        "%(rate_n)s": "'{}'",
        "%(group_rate_n)s": "'{}'",
        "%(lead_s)s": "100",
    }
    # The candidates only: discovery's first branch (its second reports full rate windows,
    # which an unrated registry never has), reduced to the ids.
    head, sep, _ = s["discover"].partition("\nUNION ALL\n")
    assert sep and head.startswith("(SELECT d.id, d.task_type, "), "discovery changed shape"
    discover = "SELECT d.id " + head[1:].rstrip().removesuffix(")").split("\n", 1)[1]
    discover = discover.replace("%(types)s", ":types").replace("%(limit)s", "20")
    statement = s["succeeded.plain+claim.plain"].replace("%(ids)s::bigint[]", f"ARRAY({discover})")
    for name, value in unlimited.items():
        statement = statement.replace(name, value)
    statement = (
        statement.replace("%(types)s", ":types")
        .replace("%(ceilings_s)s", ":ceilings")
        .replace("%(max_attempts)s", ":types_max_attempts")
        .replace("%(margin_s)s", ":margin")
        .replace("%(lease_token)s::uuid", "NULL::uuid")
        # The previous transaction's claim, as \aset left it: empty when it found none.
        .replace("%(id)s", "nullif(:id, '')::bigint")
        .replace("%(done_token)s::uuid", "nullif(:lease_token, '')::uuid")
    )
    assert "%(" not in statement, "a parameter pgbench cannot bind: " + str(
        sorted(set(re.findall(r"%\((\w+)\)s", statement)))
    )
    # \aset: the claimed row's columns become :id and :lease_token for the next statement.
    return f"{statement}\n\\aset\n"


# helpers


def _stop_group(p: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def _deadline(info: dict[str, Any]) -> float:
    return float(info["deadline"])


def _status(p: psutil.Process) -> str:
    try:
        return str(p.status())
    except psutil.NoSuchProcess:
        return psutil.STATUS_DEAD


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _read_lines(outdir: Path, prefix: str) -> list[str]:
    lines: list[str] = []
    for f in outdir.glob(f"{prefix}*.txt"):
        lines += [x for x in f.read_text().splitlines() if x.strip()]
    return lines


def _read_floats(outdir: Path, prefix: str) -> list[float]:
    return [float(x) for x in _read_lines(outdir, prefix)]


def _lat_summary(samples: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in samples]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 0.5), 2),
        "p95_ms": round(pct(ms, 0.95), 2),
        "p99_ms": round(pct(ms, 0.99), 2),
        "max_ms": round(max(ms), 2) if ms else None,
    }


def _peer_python(system: str) -> str:
    return str((VENV_OBAN if system == "oban" else VENV) / "bin" / "python")


def _python312() -> str:
    """An interpreter oban-py accepts (>= 3.12): ours, one on PATH, or one pyenv installed."""
    if sys.version_info >= (3, 12):
        return sys.executable
    candidates = [found for name in ("python3.12", "python3.13", "python3.14")
                  if (found := shutil.which(name))]  # fmt: skip
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        root = subprocess.run(
            ["pyenv", "root"], capture_output=True, text=True, check=True
        ).stdout.strip()
        candidates += map(str, sorted(Path(root).glob("versions/3.1[2-9]*/bin/python3.1[2-9]")))
    for found in candidates:  # a pyenv shim is on PATH even when its version is not selected
        check = "import sys; sys.exit(sys.version_info < (3, 12))"
        if subprocess.run([found, "-c", check], capture_output=True).returncode == 0:
            return found
    raise PeerUnavailable("oban-py needs Python >= 3.12: none on PATH or in pyenv")


class PeerUnavailable(Exception):
    """A peer that cannot be installed here: reported as skipped, with this reason."""


def ensure_venv() -> tuple[dict[str, str], dict[str, str]]:
    """Both peer venvs, created on first use, peers upgraded to the latest on every run.
    Returns the versions installed and, per peer that could not be, why."""
    versions: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for venv, base, pkgs, wanted in (
        (VENV, sys.executable, PEER_PKGS, ("procrastinate", "pgqueuer", "asyncpg")),
        (VENV_OBAN, None, OBAN_PKGS, ("oban",)),
    ):
        py = str(venv / "bin" / "python")
        peers = [w for w in wanted if w in _PEER_LEFT]
        try:
            if not Path(py).exists():
                subprocess.run([base or _python312(), "-m", "venv", str(venv)], check=True)
            res = subprocess.run(
                [py, "-m", "pip", "install", "-q", "--upgrade", *pkgs],
                capture_output=True,
                text=True,
            )
            if res.returncode != 0:
                tail = (res.stderr.strip().splitlines() or ["?"])[-1]
                raise PeerUnavailable(f"pip install {' '.join(pkgs)} failed: {tail}")
        except (PeerUnavailable, OSError, subprocess.CalledProcessError) as e:
            skipped.update(dict.fromkeys(peers, str(e)))
            log(f"  skipped {', '.join(peers)}: {e}")
            continue
        freeze = subprocess.run([py, "-m", "pip", "freeze"], capture_output=True, text=True)
        versions.update(
            line.split("==", 1)
            for line in freeze.stdout.splitlines()
            if line.split("==")[0] in wanted
        )
    return versions, skipped


# the report


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    mem = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} vCPU ({cpu}), {mem:.0f} GiB, Linux {platform.release()}"


def render(r: dict[str, Any], header: dict[str, Any]) -> str:
    lines = [f"## {header['date']} — `{header['command']}`", ""]
    lines += [f"- {k}: {v}" for k, v in header.items() if k not in ("date", "command")]
    lines.append("")
    drain, ceiling = r.get("drain", {}), r.get("pgbench", {})
    peers = r.get("peers", {})
    if drain:
        lines += [
            "### 1. Drain (no-op tasks, bulk-enqueued into idle workers)",
            "",
            "CPU µs/task: PostgreSQL's (every server process, the bench's own backends taken "
            "out) and the workers' own processes' (slotd: supervisor, slots, runners; the "
            "floor: pgbench).",
            "",
            "| slots | slotd tasks/s (each drain) | stmts/task | PG µs/task | slotd µs/task | "
            "one-statement floor (pgbench) tasks/s | floor PG µs/task | slotd (median) / floor |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for slots, runs in drain.items():
            tps = [x["tasks_per_s"] for x in runs]
            ceil = ceiling.get(slots, {}).get("tasks_per_s")
            ratio = f"{statistics.median(tps) / ceil:.2f}" if ceil else "–"
            pg_us = statistics.median(x.get("pg_cpu_us_per_task", math.nan) for x in runs)
            own_us = statistics.median(x.get("workers_cpu_us_per_task", math.nan) for x in runs)
            floor_pg = ceiling.get(slots, {}).get("pg_cpu_us_per_task")
            lines.append(
                f"| {slots} | {' / '.join(f'{x:,.0f}' for x in tps)} | "
                f"{runs[0]['stmts_per_task']:.2f} | {pg_us:,.0f} | {own_us:,.0f} | "
                f"{f'{ceil:,.0f}' if ceil else '–'} | "
                f"{f'{floor_pg:,.0f}' if floor_pg is not None else '–'} | {ratio} |"
            )
        extra = [c for c in ceiling if c not in drain]
        for conc in extra:
            v = ceiling[conc]
            lines.append(
                f"| {conc} | – | – | – | – | {v['tasks_per_s']:,.0f} | "
                f"{v.get('pg_cpu_us_per_task', '–')} | – |"
            )
        # Ratios on the median drain: one stalled drain (autovacuum, a neighbour's burst)
        # must not decide the comparison.
        at4 = [x["tasks_per_s"] for x in drain.get("4", [])]
        first4 = statistics.median(at4) if at4 else None
        if (peers or r.get("peers_skipped")) and first4:
            lines += [
                "",
                "| peer (same run, same server) | tasks/s | stmts/task | PG µs/task | "
                "worker µs/task | slotd@4 (median) / peer |",
                "|---|---|---|---|---|---|",
            ]
            for label, v in peers.items():
                lines.append(
                    f"| {label} | {v['tasks_per_s']:,.0f} | {v['stmts_per_task']:.2f} | "
                    f"{v.get('pg_cpu_us_per_task', '–')} | "
                    f"{v.get('workers_cpu_us_per_task', '–')} | "
                    f"{first4 / v['tasks_per_s']:.2f} |"
                )
            for system, why in r.get("peers_skipped", {}).items():
                lines.append(f"| {system}: skipped ({why}) | – | – | – | – | – |")
        off = r.get("drain_sync_off_4")
        if off:
            lines += [
                "",
                f"slotd at 4 slots with SLOTD_SYNCHRONOUS_COMMIT=off (queue writes only): "
                f"{off['tasks_per_s']:,.0f} tasks/s, {off['stmts_per_task']:.2f} stmts/task",
            ]
        mix = drain.get("4", [{}])[0].get("mix")
        if mix:
            lines += ["", "Statement mix at 4 slots (calls per task, mean server time):", ""]
            lines += [f"- {m}" for m in mix]
    if "latency" in r:
        lines += [
            "",
            "### 2. Enqueue-to-start latency, 50 tasks/s into idle workers",
            "",
            "| system | n | p50 ms | p95 ms | p99 ms | max ms |",
            "|---|---|---|---|---|---|",
        ]
        for label, v in r["latency"].items():
            lines.append(
                f"| {label} | {v['n']} | {v['p50_ms']} | {v['p95_ms']} | {v['p99_ms']} | "
                f"{v['max_ms']} |"
            )
    if "idle" in r:
        lines += [
            "",
            "### 3. Idle cost on the primary (slotd: default 5 s poll; peers: their defaults)",
            "",
            "| fleet | worker stmts/s | db xacts/s | top statements (per s) |",
            "|---|---|---|---|",
        ]
        for label, v in r["idle"].items():
            lines.append(
                f"| {label} | {v['stmts_per_s']} | {v['xacts_per_s']} | {'; '.join(v['mix'])} |"
            )
    if "claim_latency" in r:
        lines += [
            "",
            "### 4. Claim latency by table contents (one connection, in-process)",
            "",
            "| table | claim p50 ms | claim p99 ms | discover p50 ms | dequeue p50 ms |",
            "|---|---|---|---|---|",
        ]
        for label, v in r["claim_latency"].items():
            lines.append(
                f"| {label} | {v['claim_p50_ms']} | {v['claim_p99_ms']} | "
                f"{v['discover_p50_ms']} | {v['dequeue_p50_ms']} |"
            )
    if "enqueue" in r:
        e = r["enqueue"]
        lines += [
            "",
            f"### 5. Enqueue, {e['n']:,} rows in one transaction",
            "",
            f"- enqueue() one call per row: {e['enqueue_rows_per_s']:,} rows/s",
            f"- enqueue_many() one call: {e['enqueue_many_rows_per_s']:,} rows/s",
        ]
    if "memory" in r:
        m = r["memory"]
        first = r.get("drain", {}).get("4", [{}]) and m.get("first_drain", {})
        lines += [
            "",
            f"### 6. Memory (4 slots): at start, after the first drain, after {m['tasks']:,} tasks",
            "",
            "| process | USS MiB start / first / end | PSS MiB start / first / end |",
            "|---|---|---|",
        ]
        for name in m["start"]:
            cells = [m["start"][name], (first or {}).get(name, {}), m["end"].get(name, {})]
            uss = " / ".join(f"{c.get('uss_mib', float('nan')):.1f}" for c in cells)
            pss = " / ".join(f"{c.get('pss_mib', float('nan')):.1f}" for c in cells)
            lines.append(f"| {name} | {uss} | {pss} |")
    if "watchdog" in r:
        w = r["watchdog"]
        lines += [
            "",
            "### 7. Watchdog (handler ignoring its interrupt, kill grace "
            f"{w['kill_grace_s']} s, 1 slot)",
            "",
            f"- kill after the deadline: {', '.join(map(str, w['kill_after_deadline_s']))} s",
            f"- until the runner serves again: {', '.join(map(str, w['serving_again_s']))} s",
        ]
    if "write_variants" in r:
        lines += ["", "### Write lane: serial discover+claim+dequeue on one connection", ""]
        lines += [
            f"- {k}: {' / '.join(f'{x:,}' for x in v)} tasks/s"
            for k, v in r["write_variants"].items()
        ]
    lines += ["", f"Wall time: {header_wall(r)} s", "", ""]
    return "\n".join(lines)


def header_wall(r: dict[str, Any]) -> Any:
    return r.get("wall_s", "?")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts, about a minute")
    ap.add_argument("--profile", choices=sorted(PROFILES), help="overrides --quick")
    ap.add_argument(
        "--only",
        choices=["all", "slotd", "floor"],
        default="all",
        help="slotd: no peers, no pgbench; floor: slotd's drain and the pgbench floor only",
    )
    ap.add_argument("--results", type=Path, default=HERE / "RESULTS.md")
    ap.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="the server's setting for every contender",
    )
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    a = ap.parse_args()
    name = a.profile or ("quick" if a.quick else "full")
    profile = PROFILES[name]
    started = time.time()
    versions: dict[str, str] = {}
    bench = Bench(profile, a.synchronous_commit, a.results)
    if a.only == "all":
        log("peers: installing the latest procrastinate, pgqueuer and oban (tests/bench/.work/)")
        versions, bench.skipped = ensure_venv()

    def on_term(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        bench.start()
        steps = [
            bench.bench_write_variants,
            bench.bench_drain,
            bench.bench_claim_latency,
            bench.bench_enqueue,
            bench.bench_watchdog,
        ]
        if a.only == "floor":  # the throughput ratio to the one-statement floor, one run
            steps = [bench.bench_drain, bench.bench_pgbench]
        if a.only == "all":
            steps += [bench.bench_pgbench, bench.bench_peers]
        for step in steps:
            log(step.__name__)
            step()
        pg_version = bench.admin.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        settings = bench.admin.execute(
            "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings "
            "WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers', "
            "'wal_level', 'autovacuum', 'max_connections', 'jit')"
        ).fetchone()[0]  # type: ignore[index]
    finally:
        bench.close()
    import importlib.metadata as md

    r = bench.results
    r["wall_s"] = round(time.time() - started)
    slotd_env = {k: v for k, v in os.environ.items() if k.startswith("SLOTD_")}
    header = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python tests/bench/run.py"
        + {"full": "", "quick": " --quick"}.get(name, f" --profile {name}")
        + ("" if a.only == "all" else f" --only {a.only}"),
        "machine": machine(),
        "versions": ", ".join(
            [
                f"PostgreSQL {pg_version}",
                f"Python {platform.python_version()}",
                f"slotd {md.version('slotd')}",
                f"psycopg {md.version('psycopg')}",
                *(f"{k} {v}" for k, v in sorted(versions.items())),
            ]
        ),
        "server": f"LocalPostgres over a unix socket; {settings}; pg_stat_statements "
        "(track=top) loaded for every contender",
        "slotd": f"`slotd run` with production defaults (poll 5s, discovery batch 20), "
        f"metrics off; extra env: {slotd_env or 'none'}",
        "sizes": f"profile {name}: {profile}",
    }
    a.results.parent.mkdir(parents=True, exist_ok=True)
    if not a.results.exists():
        a.results.write_text(
            "# slotd benchmark results\n\nAppended by `python tests/bench/run.py` (one "
            "section per run, newest last). Compare ratios inside one run; absolute "
            "figures move 1.3-2x between runs on a shared 2-core machine.\n\n"
        )
    with a.results.open("a") as f:
        f.write(render(r, header))
    if a.json:
        a.json.write_text(json.dumps({"header": header, "results": r}, indent=1, default=str))
    log(f"done in {r['wall_s']} s -> {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
