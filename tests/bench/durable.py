"""The cost of durable steps and of a durable sleep (#38), in process, against a private
PostgreSQL (autocommit, the statements a slot runs, through the test modes' same doors).

    python tests/bench/durable.py [N]

Prints, per task (median of N): a plain task's claim + success; one taking 1 and 10 steps
(first run: each step one fenced statement); the same replayed by a retry (no statement per
step); a sleep's suspend + its resume. Statements per task are by construction (the
statements `process` runs: a step is one fenced UPDATE, a replayed step none, a sleep one
at the suspend and one at the resume, beside each attempt's claim and settlement)."""

from __future__ import annotations

import logging
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg

import slotd
from slotd.repository import Repository
from slotd.runner.processor import process
from slotd.testing.postgres import throwaway_postgres

registry = slotd.Registry()


@registry.handler("b.plain", ceiling=timedelta(seconds=30))
def plain(task: slotd.Task, ctx: slotd.Context) -> None:
    return None


@registry.handler("b.steps", ceiling=timedelta(seconds=30))
def steps(task: slotd.Task, ctx: slotd.Context) -> None:
    for i in range(task.payload["n"]):
        ctx.step(f"s{i}", lambda i=i: {"i": i, "pad": "x" * 100})
    if task.payload.get("fail") and task.attempt == 1:
        raise RuntimeError("retry me")


@registry.handler("b.sleep", ceiling=timedelta(seconds=30))
def sleep(task: slotd.Task, ctx: slotd.Context) -> None:
    ctx.sleep(timedelta(0))


def _attempt(repo: Repository, task_id: int) -> None:
    claimed = repo.claim([task_id], registry)
    assert claimed is not None
    process(repo, registry, claimed)


def measure(
    repo: Repository,
    conn: psycopg.Connection[Any],
    task_type: str,
    payload: dict,
    runs: int,
    n: int,
) -> float:
    times = []
    for _ in range(n):
        task_id = slotd.enqueue(conn, task_type, payload)
        started = time.perf_counter()
        for _ in range(runs):
            conn.execute("UPDATE slotd_tasks SET run_at = now() WHERE id = %s", (task_id,))
            _attempt(repo, task_id)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with throwaway_postgres() as pg, psycopg.connect(pg.url, autocommit=True) as conn:
        repo = Repository(conn)
        rows = [
            ("plain task: claim + success", "b.plain", {}, 1, 2),
            ("1 step, first run", "b.steps", {"n": 1}, 1, 3),
            ("10 steps, first run", "b.steps", {"n": 10}, 1, 12),
            ("10 steps, run + retry that replays them", "b.steps", {"n": 10, "fail": True}, 2, 14),
            ("sleep: suspend, then resume", "b.sleep", {}, 2, 5),
        ]
        print(f"n={n} per row, median of the whole task (every attempt)")
        print("| case | ms per task | statements per task |\n|---|---|---|")
        if "plain" in sys.argv[2:]:  # the A/B against a checkout without steps
            rows = rows[:1]
        for label, task_type, payload, runs, stmts in rows:
            ms = measure(repo, conn, task_type, payload, runs, n)
            print(f"| {label} | {ms:.2f} | {stmts} |")


if __name__ == "__main__":
    logging.disable(logging.WARNING)
    main()
