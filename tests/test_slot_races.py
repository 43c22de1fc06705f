"""The slot's smaller races, each pinned as a daemon (or its runner) meets it."""

from __future__ import annotations

import os
import signal
import socket
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

import slotd
from slotd import proc
from slotd.slot.runner_keeper import Runner
from tests.daemon import ROOT, Daemon, gone, wait_for


def start(daemons: list[Daemon], db_url: str, **kw: Any) -> Daemon:
    daemon = Daemon(db_url, **kw)
    daemons.append(daemon)
    return daemon.start()


def last_error(conn: psycopg.Connection[Any], task_id: int) -> str | None:
    row = conn.execute(
        "SELECT last_error FROM slotd_tasks WHERE id = %s AND lease_token IS NULL", (task_id,)
    ).fetchone()
    return row[0] if row else None


def test_a_killed_attempt_is_settled_before_the_next_runner_is_forked(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    # Each runner, as it is forked, looks whether the row is still leased (tests/apps).
    start(daemons, db_url, slots=1, env={"RT_RUNNER_FORK_PROBE": "1"})
    task_id = slotd.enqueue(qconn, "rt.gil")  # holds the GIL: only the kill ends it
    wait_for(lambda: last_error(qconn, task_id), what="the watchdog kill's settlement")
    boots = wait_for(
        lambda: [
            note
            for (note,) in qconn.execute(
                "SELECT note FROM executions WHERE phase = 'runner_boot' ORDER BY at"
            )
        ][1:],
        what="the replacement runner",
    )
    assert boots == ["settled"]


def test_a_runner_that_died_between_tasks_is_settled_by_its_slot(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1, env={"SLOTD_LOCK_TIMEOUT": "30s"})
    first, second = slotd.enqueue_many(qconn, [("rt.die_after", {}), ("rt.noop", {})])
    runner_pid = wait_for(
        lambda: qconn.execute("SELECT pid FROM executions WHERE task_id = %s", (first,)).fetchone(),
        what="the first task to start",
    )[0]
    # Hold the first row: its settlement (which also claims the second) waits, and the
    # runner dies meanwhile, so the second task is sent to a dead runner.
    with psycopg.connect(db_url) as lock:
        lock.execute("SELECT 1 FROM slotd_tasks WHERE id = %s FOR UPDATE", (first,))
        qconn.execute("INSERT INTO executions (task_id, phase) VALUES (%s, 'locked')", (first,))
        wait_for(lambda: gone(runner_pid), what="the runner to die after its task")
    error = wait_for(lambda: last_error(qconn, second), what="the second task's settlement")
    assert "runner died before it got the task" in error
    assert not [x for x in daemon.lines if "restarting it" in x]  # the slot itself lived


def test_a_cancel_that_reaches_the_runner_before_its_task_is_kept(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1)
    [runner_] = wait_for(lambda: daemon.titled("runner 0"), what="the idle runner")
    # As a SIGTERM landing while the runner receives its task: the cancel comes first.
    os.kill(runner_.pid, signal.SIGUSR1)
    task_id = slotd.enqueue(qconn, "rt.polite")
    wait_for(
        lambda: qconn.execute(
            "SELECT 1 FROM executions WHERE task_id = %s AND note = 'cancelled'", (task_id,)
        ).fetchone(),
        timeout=15,
        what="the handler to see ctx.cancelled at once",
    )


def test_stopping_a_runner_that_will_not_die_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    ours, theirs = socket.socketpair()
    try:
        # A runner in uninterruptible sleep, as far as the slot can tell: SIGKILL does nothing.
        monkeypatch.setattr(proc, "kill_group", lambda pid, sig=signal.SIGKILL: None)
        runner_ = Runner(pid, Connection(ours.detach()), proc.ChildWatch(pid))
        began = time.monotonic()
        assert runner_.stop(timeout=0.5) is None
        assert time.monotonic() - began < 10
        assert runner_.watch.fd is not None or runner_.watch.status is None  # still watched
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        theirs.close()


def test_without_pidfd_open_tasks_run_and_runners_are_watched(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], tmp_path: Path
) -> None:
    # A kernel or seccomp policy without pidfd_open, as Python sees it.
    (tmp_path / "sitecustomize.py").write_text("import os\ndel os.pidfd_open\n")
    pythonpath = f"{tmp_path}{os.pathsep}{ROOT}"
    daemon = start(daemons, db_url, slots=1, env={"PYTHONPATH": pythonpath})
    [slot_proc] = wait_for(lambda: daemon.titled("slot 0"), what="the slot")
    assert not [f for f in slot_proc.open_files() if "pidfd" in f.path]
    noop, crash, spin = slotd.enqueue_many(
        qconn, [("rt.noop", {}), ("rt.crash", {}), ("rt.gil", {})]
    )
    assert "runner died under the handler" in wait_for(
        lambda: last_error(qconn, crash), what="the crash"
    )
    assert "killed" in wait_for(lambda: last_error(qconn, spin), what="the watchdog kill")
    assert qconn.execute("SELECT count(*) FROM slotd_tasks WHERE id = %s", (noop,)).fetchone() == (
        0,
    )
    assert not [x for x in daemon.lines if "slot failed" in x or "restarting it" in x]


def test_a_dead_slot_takes_its_current_runner_not_a_replaced_one(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1, env={"SLOTD_RUNNER_MAX_TASKS": "1"})
    task_id = slotd.enqueue(qconn, "rt.noop")
    first_runner = wait_for(
        lambda: qconn.execute(
            "SELECT pid FROM executions WHERE task_id = %s", (task_id,)
        ).fetchone(),
        what="the task",
    )[0]
    # Recycled after one task: a new runner, which the supervisor must be told about.
    [current] = wait_for(
        lambda: [p for p in daemon.titled("runner 0") if p.pid != first_runner],
        what="the recycled runner",
    )
    [slot_proc] = wait_for(lambda: daemon.titled("slot 0 idle"), what="the idle slot")
    slot_proc.kill()
    line = daemon.wait_line(r"slot 0 killed by SIGKILL; restarting it")
    assert f"runner_pid={current.pid}" in line
    wait_for(lambda: gone(current.pid), what="the current runner to go with its slot")
    assert psutil.pid_exists(daemon.pid)
