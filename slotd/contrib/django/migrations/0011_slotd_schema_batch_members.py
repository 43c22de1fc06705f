"""Runs slotd's numbered SQL migrations again, for projects migrated before sql/065 (the
index the dashboard finds a batch's members by; numbered below 070-072, so a project
already past those still gets it here): a no-op where they are current (see 0002)."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py).
SLOTD_SQL_THROUGH = 72


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0010_slotd_schema_waits")]
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
