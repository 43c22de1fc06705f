"""Django runs each of its migrations once: a database migrated under an older slotd gets
new SQL only from a new Django migration. This pins that the newest Django migration of
slotd.contrib.django brings the newest file in sql/, so a release cannot add SQL that a
`manage.py migrate` deployment never receives. (Read as text: no Django on Python 3.11.)"""

from __future__ import annotations

import re
from pathlib import Path

from slotd.repository import migrations

DJANGO_MIGRATIONS = Path(__file__).resolve().parent.parent / "slotd/contrib/django/migrations"


def test_the_newest_django_migration_brings_the_newest_sql() -> None:
    declared = {}
    for path in sorted(DJANGO_MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py")):
        found = re.search(r"^SLOTD_SQL_THROUGH = (\d+)$", path.read_text(), re.M)
        assert found, f"{path.name} does not say which sql/ migration it brings"
        declared[path.name] = int(found.group(1))
    newest_sql = max(version for version, _, _ in migrations())
    newest_django = max(declared)
    assert declared[newest_django] == newest_sql, (
        f"sql/ goes up to {newest_sql:03d} but {newest_django} brings only up to "
        f"{declared[newest_django]:03d}: add a Django migration running apply_slotd_schema"
    )


def test_every_django_migration_imports_the_step_from_its_layer() -> None:
    # slotd.contrib.django is layered (database < results < backend < configured < worker):
    # the step lives in `configured`, which knows the backends' schema; the old
    # `database.apply_slotd_schema` is gone, so a new migration copied from an old one fails.
    for path in sorted(DJANGO_MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py")):
        assert "from slotd.contrib.django.configured import apply_slotd_schema" in (
            path.read_text()
        ), f"{path.name}: import apply_slotd_schema from slotd.contrib.django.configured"
