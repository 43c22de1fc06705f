from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("number", models.CharField(max_length=40, unique=True)),
                ("confirmations", models.IntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="Call",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task", models.CharField(max_length=60)),
                ("arg", models.CharField(blank=True, default="", max_length=60)),
            ],
        ),
    ]
