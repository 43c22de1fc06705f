"""Runs slotd's numbered SQL migrations again, for projects migrated before sql/090 (a
task's state defined in the database: slotd_task_state): a no-op where they are current
(see 0002)."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py).
SLOTD_SQL_THROUGH = 90


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0016_result_admin_model")]
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
