"""The supervisor's LISTEN connection: opened on the chores thread, read without blocking by
the supervisor's loop, reopened with a backoff when it drops, and proved by a NOTIFY
self-test.

Why opened on the chores thread: connecting may wait on the database, and the loop never
does (loop.py). Once open, only the loop uses the connection, and only without
blocking: its socket is one of the loop's watched objects and is read with consume_input."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from slotd import db, repository
from slotd.config import Settings, format_duration
from slotd.logs import Repeats
from slotd.repository.named import channel
from slotd.supervisor.chores import Chores, Done

log = logging.getLogger("slotd.supervisor")

SELFTEST_WAIT = 5.0  # how long the NOTIFY self-test waits for its own notification


class Listener:
    def __init__(
        self,
        settings: Settings,
        url: str,
        replica_id: str,
        on_control: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.url = url
        self.on_control = on_control  # a control notification's payload (cancel, pause, resume)
        self.conn: psycopg.Connection[Any] | None = None
        self.retry_at = 0.0
        self.backoff = db.Reconnect()
        self.repeats = Repeats()  # which of a run of failed opens are logged
        self.selftest_payload = f"selftest {replica_id}"
        self.selftest_deadline: float | None = None
        self.selftest_seen = False
        self.notify_reaches = True  # until a self-test's notification fails to arrive
        # Told each time LISTEN is (re)opened: notifications sent while deaf are lost, so
        # whoever waits on one looks once (the runtime schedules' thread).
        self.on_open: Callable[[], None] | None = None

    def due(self, now: float, chores: Chores) -> bool:
        return self.conn is None and not chores.pending["listen"] and now >= self.retry_at

    def open(self, chores: Chores, *, first: bool) -> None:
        """Open the LISTEN connection on the chores thread; `opened` takes it over."""
        url, prepare, schema = self.url, self.settings.prepare, self.settings.schema

        def job() -> psycopg.Connection[Any]:
            conn = db.connect(url, role="slotd listen", prepare=prepare)
            try:
                repository.listen(conn, schema=schema)
                repository.listen_control(conn, schema=schema)
                if first:  # pauses made before we listened are told nowhere else
                    _log_pauses(repository.paused_types(conn, schema=schema))
            except BaseException:
                conn.close()
                raise
            return conn

        chores.post("listen", job)

    def opened(self, done: Done, *, stopping: bool) -> bool:
        """Take over the connection `open` made; False when there is none to listen on."""
        if done.error is not None:
            delay = self.backoff.next()
            log.log(
                self.repeats.level(),
                "database unreachable, retrying in %.1fs: %s",
                delay,
                db.first_line(done.error),
            )
            self.retry_at = time.monotonic() + delay
            return False
        if stopping:
            done.value.close()
            return False
        # From here on only this loop uses the connection, and only without blocking: its
        # socket is watched and read with consume_input. Its keepalives (db.connect) notice
        # a peer that died silently.
        self.conn = done.value
        self.backoff.reset()
        self.repeats.ok()
        if self.on_open is not None:
            self.on_open()
        return True

    def socket(self) -> int | None:
        return None if self.conn is None else self.conn.pgconn.socket

    def notifications(self) -> bool:
        """Read what arrived; True when a notification says there may be work."""
        conn = self.conn
        assert conn is not None
        control = channel(repository.CONTROL_CHANNEL, self.settings.schema).encode()
        try:
            conn.pgconn.consume_input()
            woken = False
            while (note := conn.pgconn.notifies()) is not None:
                if note.relname == control:
                    self.on_control(note.extra.decode())
                else:
                    woken = True
                    if note.extra == self.selftest_payload.encode():
                        self._selftest_passed()
            if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("LISTEN connection closed")
        except (psycopg.Error, OSError) as exc:
            self._lost(exc)
            return False
        return woken

    def _lost(self, exc: BaseException) -> None:
        log.warning("lost the LISTEN connection (%s); reconnecting", db.first_line(exc))
        try:
            assert self.conn is not None
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass
        self.conn = None
        self.retry_at = time.monotonic() + 0.2

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001
                pass

    # the NOTIFY self-test

    def selftest_send(self, chores: Chores) -> None:
        """Prove that NOTIFY reaches this LISTEN connection: send one on the primary, as a
        producer would, and expect it back within SELFTEST_WAIT. Through a transaction-mode
        pooler it never arrives, and the replica would otherwise wait silently for ticks."""
        payload = self.selftest_payload
        self.selftest_seen = False
        schema = self.settings.schema
        chores.post(
            "selftest",
            lambda: repository.notify_selftest(chores.repo().write, payload, schema=schema),
        )

    def selftest_sent(self, done: Done) -> None:
        if done.error is not None:
            log.warning("NOTIFY self-test not sent: %s", db.first_line(done.error))
        elif not self.selftest_seen:  # the notification may have beaten this news here
            self.selftest_deadline = time.monotonic() + SELFTEST_WAIT

    def _selftest_passed(self) -> None:
        self.selftest_seen = True
        self.selftest_deadline = None
        if not self.notify_reaches:
            log.info("NOTIFY reaches the LISTEN connection again")
        self.notify_reaches = True

    def selftest_failed(self) -> None:
        self.selftest_deadline = None
        self.notify_reaches = False
        log.warning(
            "NOTIFY did not reach the LISTEN connection within %.0fs: this replica runs on "
            "its %s poll. LISTEN through a transaction-mode pooler never hears anything: "
            "point SLOTD_DATABASE_URL_LISTEN at the primary directly (or a session-mode pool)",
            SELFTEST_WAIT,
            format_duration(self.settings.poll_interval),
        )


def _log_pauses(paused: list[dict[str, Any]]) -> None:
    for pause in paused:
        until = pause["until"]
        log.info(
            "task type %s is paused (by %s since %s, %s): not claiming it",
            pause["task_type"],
            pause["paused_by"],
            pause["paused_at"].isoformat(timespec="seconds"),
            f"until {until.isoformat(timespec='seconds')}" if until else "until resumed",
            extra={"task_type": pause["task_type"], "by": pause["paused_by"]},
        )
