"""The schema: the numbered migrations in sql/, applied under one lock, and the databases
the embedded server and the throwaway test servers create."""

from __future__ import annotations

from datetime import timedelta
from functools import cache
from typing import Any

import psycopg

from slotd.errors import MigrationLockTimeout, UnsafeMigration
from slotd.repository.named import (
    DEFAULT_SCHEMA,
    _dicts,
    _interval,
    _sql,
    resolve_schema,
    rewrite,
    sql_dir,
)
from slotd.upgrade import guard as upgrades


def migrations() -> list[tuple[int, str, str]]:
    return [(m.version, m.name, m.body) for m in upgrades.read(sql_dir())]


@cache
def newest_migration() -> int:
    """The newest migration this code carries: what its replicas heartbeat, so that
    `slotd migrate` can tell which of them a contract step would break."""
    return max(m.version for m in upgrades.read(sql_dir()))


def migrate(
    conn: psycopg.Connection[Any],
    *,
    force: bool = False,
    schema: str | None = None,
    lock_timeout: timedelta | None = None,
) -> list[str]:
    """Apply the numbered migrations not yet recorded, all in one transaction that first
    takes a transaction-scoped advisory lock and reads what is applied under it: two hosts
    migrating at once take turns, the second finds nothing to do, and a failing migration
    leaves the schema as it was. Transaction-scoped, not a session lock: behind a
    transaction-mode pooler a session lock and its unlock can land on different server
    sessions and the lock stays held in the pool; this one ends with its COMMIT.

    A contract step (slotd.upgrades) is applied only while no live replica runs code older
    than it allows, unless `force`: the steps before it are committed, and UnsafeMigration
    names the replicas.

    `schema` (None: SLOTD_SCHEMA, else public): a named schema is created if missing and
    every step runs rewritten to name it (slotd.repository.named), with the transaction's
    search_path set to that schema alone as well, so that what a step creates lands there
    and a name the rewrite missed fails here instead of resolving in public. The
    search_path is put back before the transaction (or the caller's savepoint) ends:
    nothing after the migration may lean on it.

    `lock_timeout` bounds each step's wait for a table lock (sql migrate_lock_timeout_set
    says why): past it the whole transaction rolls back, nothing applied, and
    MigrationLockTimeout names the step. slotd.live_migrate retries it."""
    schema = resolve_schema(schema)
    applied_now: list[str] = []
    refused: str | None = None
    current = "the migration bookkeeping"
    try:
        with conn.transaction():
            conn.execute(_sql("migrate_lock", schema))
            if lock_timeout is not None:
                conn.execute(
                    _sql("migrate_lock_timeout_set", schema),
                    {"lock_timeout": _interval(lock_timeout)},
                )
            if schema != DEFAULT_SCHEMA:
                conn.execute(_sql("migrate_schema_create", schema))
                was = conn.execute(_sql("migrate_search_path_set", schema)).fetchone()[0]  # type: ignore[index]
            conn.execute(_sql("migrate_init", schema))
            done = {row[0] for row in conn.execute(_sql("migrate_applied", schema))}
            for step in upgrades.read(sql_dir()):
                if step.version in done:
                    continue
                current = step.name
                if step.contract_of is not None and not force:
                    # Read under the lock, after the steps before it: any columns will do
                    # (a replica of a release before sql/013 has no version to show).
                    fleet = [row[0] for row in conn.execute(_sql("migrate_fleet", schema))]
                    older = upgrades.too_old(fleet, step.contract_of)
                    if older:
                        refused = upgrades.refusal(step, older)
                        break
                conn.execute(rewrite(step.body, schema))  # type: ignore[arg-type]
                conn.execute(
                    _sql("migrate_record", schema), {"version": step.version, "name": step.name}
                )
                applied_now.append(step.name)
            if schema != DEFAULT_SCHEMA:
                conn.execute(_sql("migrate_search_path_reset"), {"was": was})
    except psycopg.errors.LockNotAvailable as exc:
        raise MigrationLockTimeout(current) from exc
    if refused is not None:
        done_part = f"applied {', '.join(applied_now)}; " if applied_now else ""
        raise UnsafeMigration(done_part + refused)
    return applied_now


def migrate_lock_holders(
    conn: psycopg.Connection[Any], *, schema: str | None = None
) -> list[dict[str, Any]]:
    """Sessions holding locks on slotd's tables, oldest transaction first (at most 5)."""
    schema = resolve_schema(schema)
    return _dicts(conn.execute(_sql("migrate_lock_holders", schema), {"schema": schema}))


def unapplied_migrations(conn: psycopg.Connection[Any], *, schema: str | None = None) -> list[str]:
    """What this code needs that the database lacks (all of it on an empty database)."""
    if not schema_present(conn, schema=schema):
        return [m.name for m in upgrades.read(sql_dir())]
    done = {row[0] for row in conn.execute(_sql("migrate_applied", schema))}
    return upgrades.missing(upgrades.read(sql_dir()), done)


def schema_present(conn: psycopg.Connection[Any], *, schema: str | None = None) -> bool:
    row = conn.execute(_sql("schema_present", schema)).fetchone()
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
