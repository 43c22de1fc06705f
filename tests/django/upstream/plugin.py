"""pytest plugin running Django's own tests/tasks against slotd (see prepare.py): a
throwaway PostgreSQL (slotd's own test plugin) migrated by `manage.py migrate`, slotd's
tables emptied before each test, and the tests in inapplicable.py skipped with their reason.

    python -m pytest -p tests.django.upstream.plugin "$(python tests/django/upstream/prepare.py)"
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slotd.testing.postgres import throwaway_postgres
from tests.django.upstream.inapplicable import INAPPLICABLE

_stack = ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    pg = _stack.enter_context(throwaway_postgres())
    os.environ["SLOTD_DJANGO_UPSTREAM_DATABASE_URL"] = pg.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.upstream.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def pytest_unconfigure(config: pytest.Config) -> None:
    from django.db import connections

    connections.close_all()
    _stack.close()


def _key(item: pytest.Item) -> str:
    return f"{Path(str(item.fspath)).name}::{item.cls.__name__ if item.cls else ''}::{item.name}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seen = set()
    for item in items:
        key = _key(item)
        seen.add(key)
        if key in INAPPLICABLE:
            item.add_marker(pytest.mark.skip(reason=f"inapplicable: {INAPPLICABLE[key]}"))
    stale = sorted(set(INAPPLICABLE) - seen)
    if stale:
        raise pytest.UsageError(f"inapplicable.py names tests Django's suite lacks: {stale}")


@pytest.fixture(autouse=True)
def _empty_queue() -> Iterator[None]:
    url = os.environ["SLOTD_DJANGO_UPSTREAM_DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE slotd_tasks, slotd_django_results, slotd_attempts")
    yield


def pytest_report_header(config: pytest.Config) -> Any:
    import django

    return f"Django {django.get_version()}'s tests/tasks against slotd.contrib.django"
