"""Lost nothing, none twice: the check beyond the harness's `jobs_lost` estimate.

The harness estimates loss from the adapters' own enqueue and completion counters (and a
SIGKILLed replica's counters die with it). This reads the durable records instead:

slotd: every id a committed producer transaction enqueued (slotd_bench.enqueued, written in
the enqueue's own transaction), every finished handler run (the runners' ledger files, one
line per run, written before the handler returns), and what is left in slotd_tasks. With
--drain it first runs a `slotd run` replica until none of the enqueued ids is left
claimable, so a task still queued when the harness stopped its replicas is shown to
complete rather than counted as lost.
  lost  = enqueued - finished - still in slotd_tasks (dead letters are listed, not hidden)
  twice = ids with more than one finished run (each with its attempt numbers)

procrastinate: its own tables (the adapter keeps finished rows): jobs by status, and jobs
with more than one `started` event.

Usage: python audit.py --dsn URL --system slotd --ledger DIR [--drain BENCH_DIR]
       python audit.py --dsn URL --system procrastinate
Prints one JSON object."""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import psycopg


def finished_runs(ledger: str) -> dict[int, list[int]]:
    runs: dict[int, list[int]] = defaultdict(list)
    for path in glob.glob(os.path.join(ledger, "done-*.txt")):
        with open(path, "rb") as fh:
            for line in fh.read().split(b"\n"):
                fields = line.split()
                if len(fields) == 3:
                    runs[int(fields[0])].append(int(fields[1]))
    return runs


def claimable_left(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM slotd_tasks t JOIN slotd_bench.enqueued e ON e.task_id = t.id"
        " WHERE t.attempt_count < t.max_attempts"
    ).fetchone()
    return int(row[0]) if row else 0


def drain(dsn: str, bench_dir: str, ledger: str, timeout: float) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = claimable_left(conn)
        if before == 0:
            return {"left_at_stop": 0, "drain_s": 0.0}
        env = {
            **os.environ,
            "DATABASE_URL": dsn,
            "SLOTD_BENCH_LEDGER": ledger,
            "SLOTD_METRICS_ADDR": "off",
            "BENCH_INSTANCE_ID": "drain",
        }
        started = time.monotonic()
        proc = subprocess.Popen(
            [
                os.path.join(bench_dir, ".venv", "bin", "python"),
                "-m",
                "slotd",
                "run",
                "--app",
                "slotd_bench_app:registry",
                "--slots",
                "4",
            ],
            cwd=bench_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while claimable_left(conn) and time.monotonic() - started < timeout:
                time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        return {
            "left_at_stop": before,
            "drain_s": round(time.monotonic() - started, 1),
            "left_after_drain": claimable_left(conn),
        }


def audit_slotd(dsn: str, ledger: str, bench_dir: str | None, timeout: float) -> dict[str, Any]:
    report: dict[str, Any] = {"system": "slotd"}
    if bench_dir:
        report["drain"] = drain(dsn, os.path.abspath(bench_dir), ledger, timeout)
    runs = finished_runs(ledger)
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueued = {r[0] for r in conn.execute("SELECT task_id FROM slotd_bench.enqueued")}
        left = {
            r[0]: {"attempts": r[1], "leased": r[2], "dead": r[3], "error": r[4]}
            for r in conn.execute(
                "SELECT t.id, t.attempt_count, t.lease_token IS NOT NULL,"
                " t.attempt_count >= t.max_attempts, left(t.last_error, 200)"
                " FROM slotd_tasks t JOIN slotd_bench.enqueued e ON e.task_id = t.id"
            )
        }
    finished = set(runs)
    lost = sorted(enqueued - finished - set(left))
    twice = {tid: attempts for tid, attempts in runs.items() if len(attempts) > 1}
    same_attempt = {tid: a for tid, a in twice.items() if len(set(a)) < len(a)}
    report.update(
        enqueued=len(enqueued),
        finished=len(finished & enqueued),
        finished_not_enqueued=len(finished - enqueued),
        still_queued=sum(1 for v in left.values() if not v["dead"]),
        dead_letters={str(k): v for k, v in left.items() if v["dead"]},
        lost=len(lost),
        lost_ids=lost[:20],
        ran_twice=len(twice),
        ran_twice_ids={str(k): v for k, v in list(twice.items())[:20]},
        # Two finished runs under one attempt number would mean two live leases at once.
        ran_twice_same_attempt=len(same_attempt),
        handler_runs=sum(len(a) for a in runs.values()),
    )
    return report


def audit_procrastinate(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        by_status = {
            r[0]: r[1]
            for r in conn.execute(
                "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY status"
            )
        }
        started_twice = conn.execute(
            "SELECT count(*) FROM (SELECT job_id FROM procrastinate_events"
            " WHERE type = 'started' GROUP BY job_id HAVING count(*) > 1) s"
        ).fetchone()
        never_started = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs j WHERE NOT EXISTS"
            " (SELECT 1 FROM procrastinate_events e WHERE e.job_id = j.id AND e.type = 'started')"
        ).fetchone()
    return {
        "system": "procrastinate",
        "jobs": sum(by_status.values()),
        "by_status": by_status,
        # 'doing' rows left after the run belong to killed workers: nothing picks them up again.
        "stuck_doing": by_status.get("doing", 0),
        "started_twice": int(started_twice[0]) if started_twice else 0,
        "never_started": int(never_started[0]) if never_started else 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--system", choices=["slotd", "procrastinate"], required=True)
    parser.add_argument("--ledger", help="the slotd runners' ledger directory")
    parser.add_argument("--drain", metavar="BENCH_DIR", help="run a replica from this dir first")
    parser.add_argument("--drain-timeout", type=float, default=150.0)
    args = parser.parse_args()
    if args.system == "slotd":
        if not args.ledger:
            parser.error("--ledger is required for slotd")
        report = audit_slotd(args.dsn, args.ledger, args.drain, args.drain_timeout)
    else:
        report = audit_procrastinate(args.dsn)
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
