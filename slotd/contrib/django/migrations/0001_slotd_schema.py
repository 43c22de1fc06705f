"""`manage.py migrate` creates (or upgrades) slotd's tables in the Django database, the same
way `slotd migrate` does: slotd's own numbered SQL migrations, recorded in its own table, so
running either command first, or both, is fine."""

from typing import Any

from django.db import migrations


def apply_slotd_schema(apps: Any, schema_editor: Any) -> None:
    from slotd.contrib.django.results import raw_connection
    from slotd.repository import migrate

    migrate(raw_connection(schema_editor.connection.alias))


class Migration(migrations.Migration):
    # slotd's migrate takes an advisory lock and commits each step itself, as on the CLI.
    atomic = False
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
