"""A minimal Django project on the test suite's PostgreSQL (tests/django/conftest.py sets
SLOTD_DJANGO_TEST_DATABASE_URL to a database of the session's server)."""

import json
import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["SLOTD_DJANGO_TEST_DATABASE_URL"])

SECRET_KEY = "slotd-tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["slotd.contrib.django", "django_project.shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db["dbname"],
        "USER": _db.get("user", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
TASKS = {
    "default": {
        "BACKEND": "slotd.contrib.django.SlotdBackend",
        "QUEUES": ["default", "slow"],
        "OPTIONS": {
            "CEILING": "1m",
            "MAX_ATTEMPTS": 3,
            "QUEUE_OPTIONS": {"slow": {"CEILING": "10m", "MAX_ATTEMPTS": 1}},
            "RESULT_RETENTION": "7d",
            # tests/django/test_django_schema_option.py runs the project in a schema.
            **(
                {"SCHEMA": os.environ["SLOTD_DJANGO_TEST_SCHEMA"]}
                if os.environ.get("SLOTD_DJANGO_TEST_SCHEMA")
                else {}
            ),
        },
    }
}
# tests/django/test_django_contract.py runs manage.py with other TASKS (JSON).
if os.environ.get("SLOTD_DJANGO_TEST_TASKS"):
    TASKS = json.loads(os.environ["SLOTD_DJANGO_TEST_TASKS"])
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None
