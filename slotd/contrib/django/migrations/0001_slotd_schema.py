"""`manage.py migrate` creates (or upgrades) slotd's tables in the Django database, the same
way `slotd migrate` does: slotd's own numbered SQL migrations, recorded in its own table, so
running either command first, or both, is fine."""

from django.db import migrations

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py).
SLOTD_SQL_THROUGH = 3


class Migration(migrations.Migration):
    # slotd's migrate takes an advisory lock and commits each step itself, as on the CLI.
    atomic = False
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop)]
