"""What periodic schedules cost: statements per evaluation, and an idle replica's statements
per second with 0, 10 and 1,000 schedules declared.

    python tests/bench/schedules.py                  # ~4 minutes; appends to RESULTS.md
    python tests/bench/schedules.py --idle-seconds 20 --results /tmp/r.md   # quicker

A private PostgreSQL with pg_stat_statements (track=top) counts every statement:

1. Evaluation, in-process on the daemon's own code (slotd.scheduler.Evaluator, the same
   declare and fire statements): N every=1s schedules, one evaluation per second of
   database time, for N = 1, 10, 1,000; and two replicas racing for the same fire times.
2. Idle: a real `slotd run --slots 4` declaring N schedules that are not due (every=1d),
   counted over a window, for N = 0, 10, 1,000. N = 0 is the cost of a replica before
   schedules existed: no thread, no statement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import slotd  # noqa: E402
from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.repository import Repository, migrate  # noqa: E402
from slotd.supervisor.scheduler import Evaluator  # noqa: E402
from tests.daemon import Daemon  # noqa: E402

COUNTS = "SELECT coalesce(sum(calls), 0)::float8 FROM pg_stat_statements WHERE dbid = %s"
BY_QUERY = """SELECT coalesce(sum(calls), 0)::float8, coalesce(sum(total_exec_time), 0)::float8
              FROM pg_stat_statements WHERE dbid = %s AND query LIKE %s"""


def registry(n: int, period: timedelta) -> slotd.Registry:
    reg = slotd.Registry()
    reg.register("bench.noop", lambda task, ctx: None, ceiling=timedelta(seconds=30))
    for i in range(n):
        reg.schedule(f"s{i:04d}", task_type="bench.noop", every=period, overlap="allow")
    return reg


class Server:
    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="slotd-bench-sched-"))
        os.chmod(self.tmp, 0o755)
        self.pg = LocalPostgres(
            self.tmp / "pg",
            self.tmp / "sock",
            port=56_000 + os.getpid() % 4000,
            extra_options=[
                "-c shared_preload_libraries=pg_stat_statements",
                "-c pg_stat_statements.track=top",
            ],
        )
        self.pg.start()
        self.pg.wait_ready()
        self.admin = psycopg.connect(self.pg.url(), autocommit=True)
        self.admin.execute("CREATE EXTENSION pg_stat_statements")
        self._n = 0

    def database(self) -> tuple[str, int]:
        self._n += 1
        name = f"bench_{self._n}"
        self.admin.execute(f"CREATE DATABASE {name}")
        url = self.pg.url(name)
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        oid = self.admin.execute("SELECT oid FROM pg_database WHERE datname = %s", (name,))
        return url, oid.fetchone()[0]  # type: ignore[index]

    def reset(self) -> None:
        self.admin.execute("SELECT pg_stat_statements_reset()")

    def calls(self, dbid: int, like: str | None = None) -> tuple[float, float]:
        if like is None:
            return self.admin.execute(COUNTS, (dbid,)).fetchone()[0], 0.0  # type: ignore[index]
        row = self.admin.execute(BY_QUERY, (dbid, like)).fetchone()
        return row[0], row[1]  # type: ignore[index]

    def close(self) -> None:
        self.admin.close()
        self.pg.stop("immediate")
        shutil.rmtree(self.tmp, ignore_errors=True)


def evaluation(server: Server, n: int, rounds: int, replicas: int = 1) -> dict[str, Any]:
    url, dbid = server.database()
    reg = registry(n, timedelta(seconds=1))
    conns = [psycopg.connect(url, autocommit=True) for _ in range(replicas)]
    evs = [Evaluator(reg.schedules, f"r{i}", 20) for i in range(replicas)]
    repos = [Repository(c) for c in conns]
    for ev, repo in zip(evs, repos, strict=True):
        ev.declare(repo)
    now = conns[0].execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    server.reset()
    walls, fired = [], 0
    for r in range(1, rounds + 1):
        for ev, repo in zip(evs, repos, strict=True):  # the replicas take turns at each second
            ev.offset = float(r)
            started = time.perf_counter()
            fired += sum(len(f.task_ids) for f in ev.fire_due(repo, now + timedelta(seconds=r)))
            walls.append(time.perf_counter() - started)
    stmts, _ = server.calls(dbid)
    fire_calls, fire_ms = server.calls(dbid, "%slotd_schedules s%FOR UPDATE%")
    for c in conns:
        c.close()
    evaluations = rounds * replicas
    return {
        "schedules": n,
        "replicas": replicas,
        "fire_times": rounds,
        "tasks": fired,
        "statements_per_evaluation": round(stmts / evaluations, 2),
        "statements_per_fire_time_fleet_wide": round(stmts / rounds, 2),
        "fire_statement_ms_mean": round(fire_ms / max(fire_calls, 1), 3),
        "evaluation_wall_ms_p50": round(statistics.median(walls) * 1000, 3),
    }


def idle(server: Server, n: int, seconds: float) -> dict[str, Any]:
    url, dbid = server.database()
    env = {
        "SLOTD_BENCH_SCHEDULES": str(n),
        "SLOTD_POLL_INTERVAL": "5s",
        "SLOTD_METRICS_ADDR": "off",
    }
    daemon = Daemon(url, slots=4, app="tests.bench.schedules:bench_registry", env=env)
    daemon.start()
    try:
        time.sleep(3)  # start-up statements (declaration, first discoveries) are not idle
        server.reset()
        t0 = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        total, _ = server.calls(dbid)
        sched, _ = server.calls(dbid, "%slotd_schedule%")
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait(60)
        daemon.close()
    return {
        "schedules": n,
        "window_s": round(elapsed, 1),
        "statements_per_s": round(total / elapsed, 3),
        "schedule_statements_per_s": round(sched / elapsed, 3),
    }


def bench_registry() -> slotd.Registry:
    """The daemon's app in the idle part: N schedules a day apart, none due in the window."""
    return registry(int(os.environ.get("SLOTD_BENCH_SCHEDULES", "0")), timedelta(days=1))


def report(evals: list[dict[str, Any]], idles: list[dict[str, Any]], args: Any) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## Schedules: evaluation and idle cost ({stamp})",
        "",
        f"`python tests/bench/schedules.py --idle-seconds {args.idle_seconds:g} "
        f"--rounds {args.rounds}`; {os.cpu_count()} vCPU shared with other work; private "
        "PostgreSQL 15 (fsync and synchronous_commit on), pg_stat_statements track=top counting "
        "every statement; the suite of another engineer may be running alongside.",
        "",
        "| schedules due each second | replicas | statements per evaluation | fleet-wide per "
        "fire time | fire statement mean | evaluation p50 (wall) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for e in evals:
        lines.append(
            f"| {e['schedules']:,} | {e['replicas']} | {e['statements_per_evaluation']} | "
            f"{e['statements_per_fire_time_fleet_wide']} | {e['fire_statement_ms_mean']} ms | "
            f"{e['evaluation_wall_ms_p50']} ms |"
        )
    lines += [
        "",
        "| schedules declared (none due) | idle statements/s, whole replica (4 slots) | of "
        "which schedule statements/s |",
        "| --- | --- | --- |",
    ]
    for i in idles:
        lines.append(
            f"| {i['schedules']:,} | {i['statements_per_s']} | {i['schedule_statements_per_s']} |"
        )
    lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--results", type=Path, default=ROOT / "tests" / "bench" / "RESULTS.md")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    server = Server()
    try:
        evals = [evaluation(server, n, args.rounds) for n in (1, 10, 1000)]
        evals.append(evaluation(server, 10, args.rounds, replicas=2))
        idles = [idle(server, n, args.idle_seconds) for n in (0, 10, 1000)]
    finally:
        server.close()
    text = report(evals, idles, args)
    with args.results.open("a") as out:
        out.write("\n" + text)
    if args.json:
        args.json.write_text(json.dumps({"evaluation": evals, "idle": idles}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
