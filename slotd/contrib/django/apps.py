from django.apps import AppConfig


class SlotdConfig(AppConfig):
    """Only there so `manage.py migrate` can create slotd's tables (migrations/0001)."""

    name = "slotd.contrib.django"
    label = "slotd"
    verbose_name = "slotd task queue"
    default_auto_field = "django.db.models.BigAutoField"
