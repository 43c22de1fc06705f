from typing import Any

from django.apps import AppConfig
from django.core import checks


class SlotdConfig(AppConfig):
    """There so `manage.py migrate` can create slotd's tables (migrations/0001) and
    `manage.py slotd ...` exists."""

    name = "slotd.contrib.django"
    label = "slotd"
    verbose_name = "slotd task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(check_migrated, checks.Tags.database)
        # Django registers the TASKS backends' checks (bad QUEUES, misspelt OPTIONS, this
        # app missing beside another installed app) only when django.tasks is imported,
        # which a fresh project's `manage.py check` never does: import it here.
        import django.tasks  # noqa: F401


def check_migrated(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """`manage.py check --database ALIAS` (and `migrate`, before it migrates): slotd's
    tables exist where the backends write. A warning, so that `migrate` itself can run."""
    from django.db import DatabaseError

    from slotd.contrib.django import configured, database

    messages: list[checks.CheckMessage] = []
    wanted = set(databases or ())
    for alias in sorted({backend.database for backend in configured.slotd_backends()} & wanted):
        try:
            missing = database.unapplied_migrations(alias)
        except DatabaseError:
            continue  # a database that is down is reported by Django's own checks
        if missing:
            messages.append(
                checks.Warning(
                    f"slotd's migrations {missing} are not applied to database {alias!r}: "
                    "enqueueing a task there fails",
                    hint="Run manage.py migrate.",
                    id="slotd.W001",
                )
            )
    return messages
