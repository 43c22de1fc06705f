"""Runtime schedules (slotd.put_schedule), fired by every replica: no leader, no replica
evaluating every schedule every tick.

One thread per replica, its own connection (the supervisor's loop never waits for it). Each
row holds its next fire time; the thread takes only the due rows (an index range, FOR UPDATE
SKIP LOCKED, a batch at a time), plans each one's fire time and next one, and in the same
transaction inserts the tasks and advances the rows (slotd/repository/runtime_schedules.py):
a row being fired by another replica is skipped, so each fire time is enqueued once. Between
fires it sleeps until the soonest next fire time. A schedule put meanwhile (it commits in
someone else's transaction) is told by a control notification (sql `runtime_schedule_put`),
which the supervisor's LISTEN hears and passes on (`poke`): the thread looks at once, and
once each time LISTEN is (re)opened (what was sent while it was down is lost). While the
replica's NOTIFY self-test says notifications reach it, the thread otherwise looks only every
IDLE_POLL seconds, a safety net; else every POLL (a transaction pooler in the way), the one
second a put may wait for its first fire. An idle look is one statement (`next_fire`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from slotd import db
from slotd.producer.schedules import plan
from slotd.repository import runtime_schedules as store
from slotd.repository.named import resolve_schema

log = logging.getLogger("slotd.schedules")

POLL = 1.0  # seconds: how late a schedule put just now may fire its first time, at most
# Seconds between looks while notifications reach the replica: each look is a statement, and
# an idle replica's cost is counted in them (#43: at 1 s this was 4 of every 4.23/s).
IDLE_POLL = 300.0
BATCH = 500
BACKOFF_CAP = 30.0


class RuntimeScheduleThread(threading.Thread):
    def __init__(self, settings: Any, url: str, hears: Callable[[], bool] = lambda: False) -> None:
        super().__init__(name="slotd-runtime-schedules", daemon=True)
        self.hears = hears  # whether a put's notification reaches this replica now
        self.settings = settings
        self.url = url
        self.schema = resolve_schema(getattr(settings, "schema", None))
        self._stop_event = threading.Event()
        self._poked = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self.fired = 0  # schedules advanced: tests and the bench read it
        self.enqueued = 0
        self.busy = 0.0  # seconds of this thread's CPU spent in passes (the bench reads it)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self._poked.set()
        self.join(timeout)

    def poke(self) -> None:
        """A schedule was put somewhere in the fleet: look now (from the supervisor's loop,
        which only sets the event)."""
        self._poked.set()

    def run(self) -> None:
        backoff = 0.5
        while not self._stop_event.is_set():
            try:
                wait = self.step()
                backoff = 0.5
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any error
                if isinstance(exc, psycopg.Error):
                    log.warning(
                        "runtime schedules: %s; retrying in %.1fs", db.first_line(exc), backoff
                    )
                else:
                    log.exception("runtime schedules: firing failed; retrying in %.1fs", backoff)
                self._drop()
                wait, backoff = backoff, min(backoff * 2, BACKOFF_CAP)
            self._poked.wait(wait)
            self._poked.clear()
        self._drop()

    def step(self) -> float:
        """Fire what is due, a batch at a time; returns how long to sleep."""
        conn = self._connection()
        started = time.thread_time()
        try:
            next_at, db_now = store.next_fire(conn, self.schema)
            while next_at is not None and next_at <= db_now:
                advanced, enqueued, next_at, db_now = store.fire_due(
                    conn,
                    self.schema,
                    plan,
                    batch=BATCH,
                    max_attempts=self.settings.max_attempts,
                )
                self.fired += advanced
                self.enqueued += enqueued
                if advanced:
                    log.debug("runtime schedules: %d fired, %d enqueued", advanced, enqueued)
                if advanced < BATCH or self._stop_event.is_set():
                    break
        finally:
            self.busy += time.thread_time() - started
        poll = IDLE_POLL if self.hears() else POLL
        if next_at is None:
            return poll
        return min(max((next_at - db_now).total_seconds() + 0.005, 0.0), poll)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            conn = db.connect(
                self.url, role="slotd runtime schedules", prepare=self.settings.prepare
            )
            conn.autocommit = True
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail too
                pass


def start(
    settings: Any, url: str, hears: Callable[[], bool] = lambda: False
) -> RuntimeScheduleThread:
    thread = RuntimeScheduleThread(settings, url, hears)
    thread.start()
    return thread
