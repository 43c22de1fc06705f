"""After an attempt that timed out, nothing it started survives, while its runner does."""

from __future__ import annotations

from typing import Any

import psutil
import psycopg

import slotd
from tests.daemon import Daemon, gone, wait_for


def test_a_timed_out_attempt_leaves_no_subprocess_behind_and_keeps_its_runner(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = Daemon(db_url, slots=1)
    daemons.append(daemon)
    daemon.start()
    task_id = slotd.enqueue(qconn, "rt.popen_wait")
    runner_pid, sleep_pid = wait_for(
        lambda: qconn.execute(
            "SELECT pid, note::int FROM executions WHERE task_id = %s", (task_id,)
        ).fetchone(),
        what="the handler to start its subprocess",
    )
    error = wait_for(
        lambda: qconn.execute(
            "SELECT last_error FROM slotd_tasks WHERE id = %s AND lease_token IS NULL",
            (task_id,),
        ).fetchone(),
        what="the timeout's settlement",
    )[0]
    assert "DeadlineExceeded" in error  # interrupted in its frame, not killed with the runner
    wait_for(lambda: gone(sleep_pid), timeout=10, what="the attempt's `sleep` to be killed")
    assert psutil.Process(runner_pid).status() != psutil.STATUS_ZOMBIE  # the runner stays warm
