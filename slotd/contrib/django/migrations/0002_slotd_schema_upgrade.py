"""Runs slotd's numbered SQL migrations again, for projects that applied 0001 under slotd
0.1 (sql/001-003), before worker-owned attempts, schedules, cancel and pause, priorities
and limits and the dashboard's index existed: Django applies each of its migrations once,
and slotd records its own in its own table, so this is a no-op where they are current.
Every release that adds SQL ships one more of these (tests/test_django_schema.py)."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py).
SLOTD_SQL_THROUGH = 11


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0001_slotd_schema")]
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
