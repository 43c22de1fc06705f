"""The supervisor's database work, on a thread of its own with its own connection.

The supervisor's loop hands out wake tokens, keeps /healthz fresh and pings the systemd
watchdog; one statement waiting on a slow or unreachable database would stop all three, and
a slow database would become a killed replica. So every statement the supervisor needs (the
heartbeat, the settlement of a dead slot's lease, the hourly retention, opening the LISTEN
connection, the goodbye) is a job posted here. The loop never waits for one: it watches
`fileno()` like any other pipe and reads what finished with `finished()`.

Between jobs the thread also writes what the dashboard shows (recorder.py): the
outcome tally every few seconds and at shutdown, the lease holders, the fleet's backlog."""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from slotd import db
from slotd.config import Settings
from slotd.repository import Repository
from slotd.supervisor.recorder import Recorder

log = logging.getLogger("slotd.chores")


@dataclass
class Done:
    """A finished job: its name, what it returned, or the database error that ended it."""

    name: str
    value: Any = None
    error: BaseException | None = None


class Chores:
    def __init__(self, settings: Settings, url: str, recorder: Recorder | None = None) -> None:
        self.settings = settings
        self.url = url
        self.recorder = recorder
        self._jobs: queue.SimpleQueue[tuple[str, Callable[[], Any]] | None] = queue.SimpleQueue()
        self._done: collections.deque[Done] = collections.deque()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._repo: Repository | None = None
        self.pending: collections.Counter[str] = collections.Counter()  # the loop's view
        self._thread = threading.Thread(target=self._run, name="slotd-chores", daemon=True)
        self._thread.start()

    # the loop's side

    def fileno(self) -> int:
        return self._r

    def post(self, name: str, job: Callable[[], Any]) -> None:
        self.pending[name] += 1
        self._jobs.put((name, job))

    def finished(self) -> list[Done]:
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass
        out = []
        while self._done:
            done = self._done.popleft()
            self.pending[done.name] -= 1
            out.append(done)
        return out

    def stop(self, timeout: float) -> bool:
        """Let the queued jobs finish (a shutdown's last settlements, the goodbye), for at
        most `timeout` seconds; True when they did."""
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close_in_child(self) -> None:
        """In a forked slot: the pipe is the supervisor's; the thread did not survive the fork."""
        os.close(self._r)
        os.close(self._w)

    # the thread's side

    def repo(self) -> Repository:
        """The chores connection, opened on first use and again after any error. Its queue
        writes carry the statement and lock timeouts every queue write does (on its session
        when it goes straight to the server)."""
        if self._repo is None:
            conn = db.connect(self.url, role="slotd chores", prepare=self.settings.prepare)
            repo = Repository.from_settings(self.settings, conn)
            if db.session_is_ours(conn, self.settings.prepare):
                repo.bind_session()  # as a slot's: one statement per chore write, not two
            self._repo = repo
        return self._repo

    def _run(self) -> None:
        recorder = self.recorder
        while True:
            try:
                item = self._jobs.get(timeout=recorder.timeout() if recorder else None)
            except queue.Empty:
                item = ()  # only the record is due
            if item is None:
                break
            if item:
                self._run_job(*item)
            if recorder is not None and not recorder.tick(self.repo):
                self._forget_connection()
        # After the last job (a dead slot's settlement among them): the final outcomes.
        if recorder is not None:
            recorder.final(self.repo)
        self._forget_connection()

    def _run_job(self, name: str, job: Callable[[], Any]) -> None:
        try:
            done = Done(name, job())
        except psycopg.Error as exc:
            self._forget_connection()
            done = Done(name, error=exc)
        except Exception as exc:  # noqa: BLE001 - a bug in one chore must not end them all
            log.exception("chore %s failed", name)
            done = Done(name, error=exc)
        self._done.append(done)
        try:
            os.write(self._w, b"!")
        except BlockingIOError:
            pass  # the loop has a wake-up pending already

    def _forget_connection(self) -> None:
        if self._repo is not None:
            try:
                self._repo.write.close()
            except Exception:  # noqa: BLE001
                pass
            self._repo = None
