"""Django's DATABASES entry as the libpq conninfo the worker connects with, so `slotd run`
drains the database Django enqueues into: socket or TCP, user, password, port and the
OPTIONS libpq knows (sslmode, connect_timeout, options, service, ...)."""

from __future__ import annotations

from functools import cache
from typing import Any

import psycopg

from slotd.config import default_schema
from slotd.errors import ConfigError


@cache
def _libpq_keywords() -> frozenset[str]:
    return frozenset(opt.keyword.decode() for opt in psycopg.pq.Conninfo.get_defaults())


def conninfo_for(wrapper: Any) -> str:
    """The conninfo for a Django DatabaseWrapper, built by Django's own
    get_connection_params() (what Django itself connects with), minus what is not libpq's:
    psycopg objects (cursor_factory, context) and Django-only switches."""
    if wrapper.vendor != "postgresql":
        raise ConfigError(f"DATABASES[{wrapper.alias!r}] is {wrapper.vendor}, not PostgreSQL")
    params = wrapper.get_connection_params()
    known = _libpq_keywords()
    kept = {
        key: str(value)
        for key, value in params.items()
        if key in known and value is not None and isinstance(value, str | int | float)
    }
    return psycopg.conninfo.make_conninfo(**kept)


def conninfo(alias: str) -> str:
    from django.conf import settings
    from django.db import connections

    if alias not in settings.DATABASES:
        raise ConfigError(f"the slotd backend's DATABASE {alias!r} is not in DATABASES")
    return conninfo_for(connections[alias])


def unapplied_migrations(alias: str) -> list[str]:
    """slotd's Django migrations not yet applied to `alias` (its tables come from them)."""
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes("slotd"))
    return [migration.name for migration, _backwards in plan if migration.app_label == "slotd"]


def apply_slotd_schema(apps: Any, schema_editor: Any) -> None:
    """What slotd's Django migrations run: slotd's own numbered SQL migrations on the
    migrated database's connection (idempotent, under slotd's migration lock)."""
    from slotd.contrib.django.results import raw_connection
    from slotd.repository import migrate

    alias = schema_editor.connection.alias
    migrate(raw_connection(alias), schema=schema_of(alias))


def schema_of(alias: str) -> str:
    """The schema slotd's objects live in on database `alias`: the OPTIONS SCHEMA of the
    slotd backends writing there (one; SLOTD_SCHEMA, else public, when none sets it)."""
    from slotd.contrib.django.worker import slotd_backends

    schemas = sorted({b.schema for b in slotd_backends() if b.database == alias})
    if len(schemas) > 1:
        raise ConfigError(
            f"the slotd TASKS backends on database {alias!r} name schemas {schemas}: "
            "one database alias holds one queue, give them the same OPTIONS SCHEMA"
        )
    return schemas[0] if schemas else default_schema()
