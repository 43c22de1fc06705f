"""Settings for Django's own tests/tasks against slotd (prepare.py, plugin.py): a project
with slotd's app and PostgreSQL; every test class sets its own TASKS."""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["SLOTD_DJANGO_UPSTREAM_DATABASE_URL"])

SECRET_KEY = "slotd-tests-only"
USE_TZ = True
INSTALLED_APPS = ["slotd.contrib.django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db["dbname"],
        "USER": _db.get("user", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
TASKS = {"default": {"BACKEND": "slotd.contrib.django.SlotdBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
