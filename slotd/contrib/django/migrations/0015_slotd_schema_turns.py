"""Runs slotd's numbered SQL migrations again, for projects migrated before sql/081
(fair turns: the groups' last starts): a no-op where they are current (see 0002)."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py).
SLOTD_SQL_THROUGH = 81


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0014_slotd_schema_django_results_task")]
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
