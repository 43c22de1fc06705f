"""Runs slotd's numbered SQL migrations again, for projects that applied 0001 before
sql/008 (priorities and limits) existed: Django applies each of its migrations once, and
slotd records its own in its own table, so this is a no-op where they are current."""

from typing import Any

from django.db import migrations


def upgrade_slotd_schema(apps: Any, schema_editor: Any) -> None:
    from slotd.contrib.django.results import raw_connection
    from slotd.repository import migrate

    migrate(raw_connection(schema_editor.connection.alias))


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0001_slotd_schema")]
    operations = [migrations.RunPython(upgrade_slotd_schema, migrations.RunPython.noop)]
