"""The admin's unmanaged model over slotd_django_results (models.Result): Django creates
nothing, the table is slotd's own (sql/002). Runs slotd's numbered SQL migrations again, as
every migration here does (a no-op where they are current, see 0002)."""

from django.db import migrations, models

from slotd.contrib.django.configured import apply_slotd_schema

# The newest sql/ migration this Django migration brings (tests/test_django_schema.py):
# none new; 0015's.
SLOTD_SQL_THROUGH = 81


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("slotd", "0015_slotd_schema_turns")]
    operations = [
        migrations.RunPython(apply_slotd_schema, migrations.RunPython.noop),
        migrations.CreateModel(
            name="Result",
            fields=[
                ("id", models.UUIDField(primary_key=True, serialize=False)),
                ("task_id", models.BigIntegerField(verbose_name="slotd task id")),
                ("backend", models.TextField()),
                ("queue_name", models.TextField()),
                ("task_path", models.TextField(verbose_name="task")),
                ("priority", models.IntegerField()),
                ("status", models.TextField(verbose_name="stored status")),
                ("enqueued_at", models.DateTimeField()),
                ("started_at", models.DateTimeField(null=True)),
                ("finished_at", models.DateTimeField(null=True)),
                ("last_attempted_at", models.DateTimeField(null=True)),
                ("args", models.JSONField()),
                ("kwargs", models.JSONField()),
                ("return_value", models.JSONField(null=True)),
            ],
            options={
                "verbose_name": "task result",
                "db_table": "slotd_django_results",
                "ordering": ["-enqueued_at"],
                "managed": False,
            },
        ),
    ]
