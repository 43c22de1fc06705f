"""Django's DATABASES, as slotd reaches them: the base layer of slotd.contrib.django.

The libpq conninfo the worker connects with (so `slotd run` drains the database Django
enqueues into: socket or TCP, user, password, port and the OPTIONS libpq knows), Django's
own psycopg connection for statements that join Django's transaction, and which of slotd's
Django migrations a database lacks. It knows nothing of TASKS: the modules above it
(results, backend, configured, worker) pass it a DATABASES alias and, where a statement
needs one, the schema."""

from __future__ import annotations

from functools import cache
from typing import Any

import psycopg
from psycopg.types.json import JsonbLoader

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


def raw_connection(using: str) -> psycopg.Connection[Any]:
    """Django's own psycopg 3 connection for database `using`: statements on it join
    whatever transaction Django has open there."""
    from django.db import connections

    wrapper = connections[using]
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"slotd needs DATABASES[{using!r}] on django.db.backends.postgresql with "
            f"psycopg 3 installed; found {type(raw).__module__}.{type(raw).__name__}"
        )
    return raw


def cursor(using: str) -> psycopg.Cursor[Any]:
    # A plain server-binding cursor: Django's connection defaults to client-side binding
    # and loads jsonb as text (JSONField decodes itself); slotd's statements want neither.
    cur = psycopg.Cursor(raw_connection(using))
    cur.adapters.register_loader("jsonb", JsonbLoader)
    return cur
