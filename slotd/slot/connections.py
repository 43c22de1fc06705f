"""A slot's own connections: the write lane (claims and settlements, on the primary) and
the read lane (discovery, on a replica when one is configured), opened with backoff that a
shutdown cuts short, and reopened when lost."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg

from slotd import db, repository
from slotd.config import Settings
from slotd.logs import Repeats
from slotd.repository import Claimed, Repository
from slotd.slot.voice import SlotsVoice

T = TypeVar("T")


class SlotConnections:
    def __init__(
        self,
        number: int,
        settings: Settings,
        write_url: str,
        read_url: str | None,
        *,
        pause: Callable[[float], None],
        stopping: Callable[[], bool],
        on_reconnect: Callable[[], None],
        log: logging.Logger | logging.LoggerAdapter[Any],
        warm: Callable[[Repository], None] = lambda _repo: None,
        voice: SlotsVoice | None = None,
    ) -> None:
        self.role, self.number = f"slotd slot {number}", number
        self.settings, self.write_url, self.read_url = settings, write_url, read_url
        self.pause, self.stopping, self.on_reconnect, self.log = pause, stopping, on_reconnect, log
        self.warm = warm
        self.repo: Repository | None = None
        # Shared with the replica's other slots: an outage is told once, not once per slot.
        self.voice = voice or SlotsVoice()

    def connect(self) -> Repository:
        backoff = db.Reconnect()
        repeats = Repeats()
        prepare = self.settings.prepare
        while not self.stopping():
            write = None
            try:
                write = db.connect(self.write_url, role=self.role, prepare=prepare)
                read = (
                    db.connect(self.read_url, role=self.role, prepare=prepare)
                    if self.read_url
                    else None
                )
                repo = Repository.from_settings(self.settings, write, read)
                # Its attempts name the replica (host, supervisor's pid) and slot that ran
                # them, as the heartbeat's leases name a running one.
                repo.slot, repo.pid = self.number, os.getppid()
                if db.session_is_ours(write, prepare):
                    repo.bind_session()
                # Both lanes plan once, generically: discovery and claims are index walks
                # whose planning grows with dead entries (generic_plans_session).
                for conn in {write, repo.read}:
                    if db.session_is_ours(conn, prepare):
                        repository.plan_generically(conn)
                self.warm(repo)  # before the first task, not during its start
                self.repo = repo
                if repeats.ok():
                    self.voice.recovered()
                return repo
            except psycopg.OperationalError as exc:
                if write is not None:
                    write.close()
                delay = backoff.next()
                say = repeats.failed() and self.voice.may_say(repeats.count)
                self.log.log(
                    logging.WARNING if say else logging.DEBUG,
                    "database unreachable, retrying in %.1fs: %s",
                    delay,
                    db.first_line(exc),
                )
                self.pause(delay)
        raise SystemExit(0)

    def reconnect(self, exc: Exception) -> None:
        self.log.log(
            logging.WARNING if self.voice.may_say_lost() else logging.DEBUG,
            "lost the database connection: %s",
            db.first_line(exc),
        )
        if self.repo is not None:
            for conn in {self.repo.write, self.repo.read}:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass
        self.repo = None
        self.on_reconnect()
        self.connect()

    def write_while_leased(
        self, write: Callable[[Repository], T], claimed: Claimed, hurry: Callable[[], bool]
    ) -> T | None:
        """A write about a claimed task, retried across reconnects while the lease is still
        ours; past the lease there is nothing left to protect."""
        while True:
            try:
                repo = self.repo if self.repo is not None else self.connect()
                return write(repo)
            except psycopg.OperationalError as exc:
                if datetime.now(UTC) >= claimed.lease_expires_at or hurry():
                    self.log.error("giving up a settlement: the lease has lapsed (%s)", exc)
                    return None
                self.reconnect(exc)
