"""What both test modes need to run a handler inside the test's process: the test's own
sync connection, a deadline re-based on the local clock, and the lock watch that turns a
handler waiting for the test's locks into a failure instead of a hang."""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg

from slotd import repository
from slotd.lifecycle import Settlement
from slotd.repository import Claimed, Executor
from slotd.task import Task

log = logging.getLogger("slotd.testing")


class TaskFailed(AssertionError):
    """Eager mode with propagate on: a handler run inline did not succeed. Chained to the
    handler's exception (``__cause__``) when it raised one."""


class BlockedByTest(TaskFailed):
    """A handler waited for a lock held by the test's own transaction; see "Handlers that
    need the database" in the slotd.testing docstring."""


def _connection(target: Executor) -> psycopg.Connection[Any]:
    if isinstance(target, psycopg.AsyncConnection | psycopg.AsyncCursor):
        raise TypeError(
            "slotd eager mode cannot run a task enqueued on an asyncio connection inline; "
            "enqueue on a sync connection in the test, or deliver it with task_queue"
        )
    return target.connection if isinstance(target, psycopg.Cursor) else target


class _LockWatch:
    """While a handler runs: is any session waiting for a lock the test's connection holds?
    The handler then waits for the test, which waits for the handler. Its statement is
    cancelled, so the test fails with a reason instead of hanging. The watcher connects
    only if the handler is still running after `grace` seconds: quick handlers cost
    nothing."""

    def __init__(self, conn: psycopg.Connection[Any], grace: float = 0.5, every: float = 0.1):
        self.holder = conn.info.backend_pid
        self.conninfo = psycopg.conninfo.make_conninfo(
            conn.info.dsn, **({"password": conn.info.password} if conn.info.password else {})
        )
        self.grace, self.every = grace, every
        self.blocked: list[int] = []
        self._handler_thread = threading.get_ident()  # the handler runs where we are made
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slotd-lock-watch", daemon=True)

    def __enter__(self) -> _LockWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        if self._done.wait(self.grace):
            return
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as watcher:
                while not self._done.wait(self.every):
                    waiting = repository.waiting_for(watcher, self.holder)
                    # Only the handler's own sessions: another process's session waiting
                    # for the test (a parallel test on a shared database) is none of ours.
                    mine = self._handler_sessions() if waiting else set()
                    for pid in waiting:
                        if pid in mine:
                            self.blocked.append(pid)
                            repository.cancel_backend(watcher, pid)
        except psycopg.Error:
            log.warning(
                "slotd lock watch could not connect; a handler blocked on the "
                "test's locks would hang",
                exc_info=True,
            )

    def _handler_sessions(self) -> set[int]:
        """Backend pids of the psycopg connections on the handler thread's stack right now
        (the one it is blocked in among them)."""
        frame = sys._current_frames().get(self._handler_thread)
        pids: set[int] = set()
        while frame is not None:
            for value in list(frame.f_locals.values()):
                conn = value.connection if isinstance(value, psycopg.Cursor) else value
                if isinstance(conn, psycopg.Connection) and not conn.closed:
                    pids.add(conn.pgconn.backend_pid)
            frame = frame.f_back
        pids.discard(self.holder)
        return pids

    def check(self, task: Task, settlement: Settlement) -> Settlement:
        if not self.blocked:
            return settlement
        raise BlockedByTest(
            f"task {task.type}#{task.id}: its handler waited for a lock held by the test's "
            f"transaction (session {self.blocked[0]} waited for the test's session "
            f"{self.holder}), and the test waits for the handler; slotd cancelled the "
            "handler's statement. Let the handler use the test's connection: see "
            "'Handlers that need the database' in the slotd.testing docstring."
        ) from settlement.exception


def _rebased(claimed: Claimed) -> Claimed:
    """The claim with its lease end moved onto the local clock, same length. Under a
    frozen transaction clock the stamp can lie in the past; see "Time inside a
    transaction" in the slotd.testing docstring. Only the deadline reads it: settlement
    is fenced by token."""
    length = claimed.lease_expires_at - claimed.claimed_at
    return replace(claimed, lease_expires_at=datetime.now(UTC) + length)
