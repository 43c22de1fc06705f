"""The slotd backends a project's TASKS configures, and what follows from them: the one
database a worker drains, the schema slotd's objects live in there, and the step slotd's
Django migrations run.

Above the backend (it lists SlotdBackend instances), below the worker, the app's checks and
`manage.py slotd`. Only what spans the aliases lives here: a backend reads and writes its
own results by its own database and schema, so one TASKS alias that cannot be built never
stops another from working (Django builds backends lazily, alias by alias)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.tasks import task_backends

from slotd.config import default_schema
from slotd.contrib.django.backend import SlotdBackend
from slotd.contrib.django.database import conninfo, raw_connection, unapplied_migrations
from slotd.errors import ConfigError


def slotd_backends() -> list[SlotdBackend]:
    """The TASKS aliases whose backend is a SlotdBackend. An alias naming another backend
    that cannot be built (its module missing, its options wrong) is skipped: reporting it
    is Django's (its own check, the alias's first use), and slotd's aliases still work."""
    found = []
    for alias, params in getattr(settings, "TASKS", {}).items():
        try:
            backend = task_backends[alias]
        except Exception:
            if str(params.get("BACKEND", "")).startswith("slotd."):
                raise
            continue
        if isinstance(backend, SlotdBackend):
            found.append(backend)
    return found


def database_alias(backends: list[SlotdBackend]) -> str:
    """The one DATABASES alias the slotd backends write to; one worker drains one database."""
    aliases = sorted({backend.database for backend in backends})
    if len(aliases) > 1 and len({conninfo(alias) for alias in aliases}) > 1:
        raise ConfigError(
            f"the slotd TASKS backends write to databases {aliases}; one worker drains "
            "one database: give them the same OPTIONS DATABASE"
        )
    return aliases[0]


def require_migrated(alias: str) -> None:
    """ConfigError in Django's words (slotd's own would say "run slotd migrate"): a Django
    project's slotd tables come from its migrations."""
    missing = unapplied_migrations(alias)
    if missing:
        raise ConfigError(
            f"slotd's migrations {missing} are not applied to database {alias!r}: "
            "run manage.py migrate"
        )


def schema_of(alias: str) -> str:
    """The schema slotd's objects live in on database `alias`: the OPTIONS SCHEMA of the
    slotd backends writing there (one; SLOTD_SCHEMA, else public, when none sets it)."""
    schemas = sorted({b.schema for b in slotd_backends() if b.database == alias})
    if len(schemas) > 1:
        raise ConfigError(
            f"the slotd TASKS backends on database {alias!r} name schemas {schemas}: "
            "one database alias holds one queue, give them the same OPTIONS SCHEMA"
        )
    return schemas[0] if schemas else default_schema()


def apply_slotd_schema(apps: Any, schema_editor: Any) -> None:
    """What slotd's Django migrations run: slotd's own numbered SQL migrations on the
    migrated database's connection (idempotent, under slotd's migration lock)."""
    from slotd.repository import migrate

    alias = schema_editor.connection.alias
    migrate(raw_connection(alias), schema=schema_of(alias))
