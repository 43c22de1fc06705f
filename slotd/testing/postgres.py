"""A throwaway PostgreSQL for the test session, for users without a test database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from slotd import repository
from slotd.dev import localpg
from slotd.dev.localpg import LocalPostgres
from slotd.repository import migrate


@dataclass
class ThrowawayPostgres:
    """A private PostgreSQL for the test session, with a migrated template database."""

    server: LocalPostgres
    url: str  # a migrated database shared by the session
    _count: int = 0

    def new_database(self) -> str:
        """A fresh migrated database (a copy of the template: milliseconds), its URL."""
        self._count += 1
        name = f"slotd_test_{self._count}"
        with psycopg.connect(self.server.url(), autocommit=True) as conn:
            repository.create_database(conn, name, template="slotd_template")
        return str(self.server.url(name))


@contextmanager
def throwaway_postgres() -> Iterator[ThrowawayPostgres]:
    with localpg.scratch(prefix="slotd-pytest-") as server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            repository.create_database(conn, "slotd_template")
        with psycopg.connect(server.url("slotd_template"), autocommit=True) as conn:
            migrate(conn)
        pg = ThrowawayPostgres(server, "")
        pg.url = pg.new_database()
        yield pg
