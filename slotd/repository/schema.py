"""The schema: the numbered migrations in sql/, applied under one lock, and the databases
the embedded server and the throwaway test servers create."""

from __future__ import annotations

from typing import Any

import psycopg

from slotd.repository.named import _sql, sql_dir


def migrations() -> list[tuple[int, str, str]]:
    found = []
    for path in sorted(sql_dir().glob("[0-9][0-9][0-9]_*.sql")):
        found.append((int(path.name[:3]), path.stem, path.read_text()))
    return found


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply the numbered migrations not yet recorded, all in one transaction that first
    takes a transaction-scoped advisory lock and reads what is applied under it: two hosts
    migrating at once take turns, the second finds nothing to do, and a failing migration
    leaves the schema as it was. Transaction-scoped, not a session lock: behind a
    transaction-mode pooler a session lock and its unlock can land on different server
    sessions and the lock stays held in the pool; this one ends with its COMMIT."""
    applied_now: list[str] = []
    with conn.transaction():
        conn.execute(_sql("migrate_lock"))
        conn.execute(_sql("migrate_init"))
        done = {row[0] for row in conn.execute(_sql("migrate_applied"))}
        for version, name, body in migrations():
            if version in done:
                continue
            conn.execute(body)  # type: ignore[arg-type]
            conn.execute(_sql("migrate_record"), {"version": version, "name": name})
            applied_now.append(name)
    return applied_now


def schema_present(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(_sql("schema_present")).fetchone()
    return bool(row and row[0])


def create_database(conn: psycopg.Connection[Any], name: str, template: str | None = None) -> bool:
    """CREATE DATABASE (a copy of `template` when given) unless it exists; True if created.
    For the embedded server and the throwaway test servers, on an autocommit connection."""
    if conn.execute(_sql("database_exists"), {"name": name}).fetchone():
        return False
    from psycopg import sql

    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    conn.execute(statement)
    return True
