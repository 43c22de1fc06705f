"""CPU microseconds of the runner's own per-task path, in process: no pipe, no database.

    python tests/bench/runner_path.py [--n 20000]

`runner._run` on a no-op sync and a no-op async handler, n times after a tenth as many
warm-ups, timed by `time.process_time` (the process title update is left out: the same in
every version). Run it in a checkout of each version, alternating, to compare them."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import slotd  # noqa: E402
from slotd.runner import child as runner  # noqa: E402
from slotd.task import Task  # noqa: E402

registry = slotd.Registry()


@registry.handler("bench.noop", ceiling=timedelta(seconds=30))
def noop(task: slotd.Task, ctx: slotd.Context) -> None:
    return None


@registry.handler("bench.async_noop", ceiling=timedelta(seconds=30))
async def async_noop(task: slotd.Task, ctx: slotd.Context) -> None:
    return None


def per_task(task_type: str, n: int) -> float:
    task = Task(1, task_type, {}, 1, None, datetime.now(UTC))
    deadline = datetime.now(UTC) + timedelta(hours=1)
    conn: Any = None  # a no-op handler writes no cursor
    for _ in range(max(1, n // 10)):
        runner._run(conn, registry, task, deadline, 0, None)
    began = time.process_time()
    for _ in range(n):
        runner._run(conn, registry, task, deadline, 0, None)
    return (time.process_time() - began) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    runner.proc.set_title = lambda *a: None  # type: ignore[assignment]
    sync, async_ = per_task("bench.noop", args.n), per_task("bench.async_noop", args.n)
    print(f"sync no-op {sync:.2f} us/task, async no-op {async_:.2f} us/task")


if __name__ == "__main__":
    main()
