"""What a runner does per no-op task, N times, in-process: the "run" message back to a Task,
the Context, processor.execute, the result tuple. For instruction counts that load does not
blur:

    valgrind --tool=callgrind python3.11 tests/bench/runner_instructions.py ROOT N

at two N; per task = the difference of the totals over the difference of N
(tests/bench/RESULTS.md). ROOT: the checkout measured."""

from __future__ import annotations

import datetime
import sys
from typing import Any


def main() -> None:
    root, n = sys.argv[1], int(sys.argv[2])
    sys.path.insert(0, root)
    import slotd
    from slotd.runner import child as runner
    from slotd.runner.processor import execute
    from slotd.task import Context, Task

    registry = slotd.Registry()
    registry.register("x", lambda t, c: None, ceiling=datetime.timedelta(seconds=30))
    handler = registry.get("x")
    assert handler is not None
    now = datetime.datetime.now(datetime.UTC)
    task = Task(1, "x", {}, 1, None, now)
    message = runner.run_message(task, now + datetime.timedelta(seconds=60), False)

    def one() -> tuple[Any, ...]:
        _, fields, deadline_ts, _stale, _steps = message
        deadline = datetime.datetime.fromtimestamp(deadline_ts, datetime.UTC)
        ctx = Context(runner._task(fields), deadline, lambda p: True)
        return ("result", *execute(handler, ctx).fields())

    for _ in range(n):
        one()


if __name__ == "__main__":
    main()
