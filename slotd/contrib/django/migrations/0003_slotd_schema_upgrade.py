"""Runs slotd's numbered SQL migrations again for projects migrated under slotd 0.1.0
(through sql/011): the next release's SQL (schedule edges, uniqueness by state, the
rollout refund, ...). A no-op where they are current; an unreleased line bumps
SLOTD_SQL_THROUGH here rather than adding a migration per SQL file."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py).
SLOTD_SQL_THROUGH = 17


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0002_slotd_schema_upgrade")]
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
