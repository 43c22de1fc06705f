"""Runs slotd's numbered SQL migrations again, for projects migrated before sql/040-042
(task tags, slotd_enqueue() for enqueue from SQL, runtime schedules): a no-op where they are
current (see 0002). apply_slotd_schema applies every step not yet recorded, whatever its
number, so steps numbered below the newest one applied still land."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py).
SLOTD_SQL_THROUGH = 72


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0011_slotd_schema_batch_members")]
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
