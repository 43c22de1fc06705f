"""Runs slotd's numbered SQL migrations again, for projects migrated before sql/030 (the
attempts a task ran, #37), which landed after sql/071: a no-op where they are current (see
0002)."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py): 071
# is still the newest number; this one brings 030, numbered from #37's range.
SLOTD_SQL_THROUGH = 71


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0008_slotd_schema_steps")]
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
