"""Statements about a connection's own session: liveness, its server backend, LISTEN,
NOTIFY, and the sessions waiting for its locks."""

from __future__ import annotations

from typing import Any

import psycopg

from slotd.repository.named import _sql

WAKE_CHANNEL = "slotd_wake"  # public's; named schemas: named.channel


def read_committed_session(conn: psycopg.Connection[Any]) -> None:
    """This direct connection's transactions run at READ COMMITTED, whatever the database's
    or role's default (see read_committed_session in sql/queries.sql)."""
    conn.execute(_sql("read_committed_session"))


def plan_generically(conn: psycopg.Connection[Any]) -> None:
    """This direct session plans each prepared statement once, for any parameters (see
    generic_plans_session in sql/queries.sql)."""
    conn.execute(_sql("generic_plans_session"))


def ping(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_sql("ping"))


def waiting_for(conn: psycopg.Connection[Any], holder: int) -> list[int]:
    """Sessions waiting for a lock held by session `holder`."""
    return [row[0] for row in conn.execute(_sql("waiting_for"), {"holder": holder})]


def cancel_backend(conn: psycopg.Connection[Any], pid: int) -> None:
    conn.execute(_sql("cancel_backend"), {"pid": pid})


def listen(conn: psycopg.Connection[Any], *, schema: str | None = None) -> None:
    conn.execute(_sql("listen", schema))


def listen_control(conn: psycopg.Connection[Any], *, schema: str | None = None) -> None:
    conn.execute(_sql("listen_control", schema))


def notify_selftest(
    conn: psycopg.Connection[Any], payload: str, *, schema: str | None = None
) -> None:
    conn.execute(_sql("notify_selftest", schema), {"payload": payload})


def backend_pid(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute(_sql("backend_pid")).fetchone()[0])  # type: ignore[index]
