"""Runs slotd's numbered SQL migrations again, for projects migrated before sql/091 (a kept
success's key and tags stored beside its result): a no-op where they are current (see
0002)."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py).
SLOTD_SQL_THROUGH = 91


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0017_slotd_schema_task_state")]
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
