"""Django 6 on the suite's real PostgreSQL. Django 6 needs Python >= 3.12, the core runs on
3.11: under 3.11 (or without Django 6) every test here is skipped; tests/django/run.sh runs
them in a 3.12 virtualenv. (Each test module calls
pytest.importorskip itself: a skip raised while importing a conftest is an error.)

One database per session, created empty and migrated by `manage.py migrate` (which also
creates slotd's tables through slotd.contrib.django's migration); each test starts from
empty tables. The tests commit for real, as the application does, so there is no
rollback-per-test isolation to lean on."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

# The test project (tests/django_project) is imported as `django_project`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TABLES = (
    "slotd_tasks, slotd_django_results, slotd_attempts, slotd_results, slotd_maintenance, "
    "shop_order, shop_call"
)


@pytest.fixture(scope="session")
def django_db_url(pg_server: Any) -> Iterator[str]:
    name = f"django_{os.getpid()}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    url: str = pg_server.url(name)
    os.environ["SLOTD_DJANGO_TEST_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "django_project.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    yield url
    from django.db import connections

    connections.close_all()


@pytest.fixture(autouse=True)
def clean_tables(django_db_url: str) -> Iterator[None]:
    with psycopg.connect(django_db_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY")  # type: ignore[arg-type]
    yield
    from django.db import connection

    connection.close()


@pytest.fixture
def slotd_conn(django_db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """The queue's own connection, as a worker has: separate from Django's."""
    with psycopg.connect(django_db_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def slotd_registry(django_db_url: str) -> Any:
    from slotd.contrib.django.worker import build_registry

    return build_registry()
