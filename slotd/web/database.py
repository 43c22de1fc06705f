"""The dashboard's connections: two small pools (reads, writes) built by slotd's own
connection code, so what holds for a worker holds here: a pooler in front of PostgreSQL is
noticed and nothing is prepared through it (SLOTD_PREPARE), reads go to
SLOTD_DATABASE_URL_READ when it is set, and every bound is set per transaction.

Why per transaction: behind PgBouncer in transaction mode a session setting stays on
whichever server connection ran it, which the pool then hands to other clients (the
application's queries, a slot's discovery); `set_config(..., true)` ends with our own
transaction wherever it ran."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from slotd import db, repository

ROLE = "slotd dashboard"


class Database:
    def __init__(
        self,
        url: str,
        read_url: str | None = None,
        *,
        prepare: str = "auto",
        statement_timeout: timedelta = timedelta(seconds=5),
        lock_timeout: timedelta = timedelta(seconds=5),
    ) -> None:
        self.url, self.read_url, self.prepare = url, read_url, prepare
        self.bounds = {
            "statement_timeout": f"{int(statement_timeout.total_seconds() * 1000)}ms",
            "lock_timeout": f"{int(lock_timeout.total_seconds() * 1000)}ms",
        }
        self._pools: dict[str, ConnectionPool[Any]] = {}
        self._lock = threading.Lock()

    def _pool(self, lane: str) -> ConnectionPool[Any]:
        """Opened on first use, so a mounted app needs no lifespan hook from its host."""
        url = self.read_url if lane == "read" and self.read_url else self.url
        with self._lock:
            pool = self._pools.get(lane)
            if pool is None:
                prepare = self.prepare
                pool = self._pools[lane] = ConnectionPool(
                    url,
                    min_size=1,
                    max_size=4,
                    kwargs=db.connect_params(f"{ROLE} ({lane})"),
                    configure=lambda conn: db.configure(conn, prepare),
                    open=True,
                    timeout=10,
                )
            return pool

    def bound(self, conn: psycopg.Connection[Any]) -> None:
        """The first statement of a transaction of ours (see the module's docstring)."""
        repository.execute(conn, "dash_bound", self.bounds)

    @contextmanager
    def reading(self) -> Iterator[psycopg.Connection[Any]]:
        """One bounded transaction for a page's reads (one snapshot, too), on the read lane."""
        with self._pool("read").connection() as conn, conn.transaction():
            self.bound(conn)
            yield conn

    @contextmanager
    def changing(self) -> Iterator[psycopg.Connection[Any]]:
        """One bounded transaction on the primary: an operator's cancel, pause or resume,
        committed when the block ends."""
        with self._pool("write").connection() as conn, conn.transaction():
            self.bound(conn)
            yield conn

    @contextmanager
    def primary(self) -> Iterator[psycopg.Connection[Any]]:
        """An autocommit connection to the primary for the repository's own writes (dead
        letter retry and purge in batches), each of which sets its bounds itself."""
        with self._pool("write").connection() as conn:
            yield conn

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
