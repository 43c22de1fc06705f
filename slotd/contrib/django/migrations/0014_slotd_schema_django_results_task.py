"""Runs slotd's numbered SQL migrations again, for projects migrated before sql/055 (Django
results by their slotd task, for the attempts get_result reads): a no-op where they are
current (see 0002)."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py).
# sql/055 came after sql/080 was numbered; slotd migrate applies whatever is unrecorded.
SLOTD_SQL_THROUGH = 80


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0013_slotd_schema_sequences")]
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
