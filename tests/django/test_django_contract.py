"""Django's documented `django.tasks` contract where slotd broke it (issue 42): a broken
TASKS alias beside slotd's, `QUEUES: []`, misspelt OPTIONS, `manage.py check` in a fresh
project, and `enqueued_at` in a long transaction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("django", minversion="6.0")

from django.db import connection, transaction  # noqa: E402
from django.tasks import TaskResultStatus, task_backends  # noqa: E402
from django.test import override_settings  # noqa: E402

from slotd.contrib.django import configured  # noqa: E402
from slotd.contrib.django.backend import ANY_QUEUE_TYPE, SlotdBackend  # noqa: E402
from slotd.contrib.django.worker import build_registry  # noqa: E402
from slotd.repository import Repository  # noqa: E402
from slotd.runner.processor import process  # noqa: E402

TESTS = Path(__file__).resolve().parent.parent
MANAGE = TESTS / "django_project" / "manage.py"
SUCCESSFUL = TaskResultStatus.SUCCESSFUL
SLOTD = {"BACKEND": "slotd.contrib.django.SlotdBackend", "QUEUES": ["default"]}


def manage_py(*args: str, tasks: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLOTD_DATABASE_URL",)}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "django_project.settings",
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
            "SLOTD_DJANGO_TEST_TASKS": json.dumps(tasks),
        }
    )
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def drain(conn: psycopg.Connection[Any]) -> int:
    registry = build_registry()
    repo = Repository(conn)
    done = 0
    while (claimed := repo.claim(repo.discover(registry.types), registry)) is not None:
        process(repo, registry, claimed)
        done += 1
    return done


def test_a_broken_alias_beside_slotds_does_not_stop_it(
    slotd_conn: psycopg.Connection[Any],
) -> None:
    """Item 2: reading a result built every TASKS backend (schema_of), so any other alias
    that cannot be imported broke get_result, refresh and `slotd status`."""
    from django_project.shop.tasks import add

    tasks = {"default": SLOTD, "other": {"BACKEND": "does_not_exist.Backend"}}
    with override_settings(TASKS=tasks):
        result = add.enqueue(1, 2)
        assert [b.alias for b in configured.slotd_backends()] == ["default"]
        assert drain(slotd_conn) == 1
        result.refresh()
        assert result.status == SUCCESSFUL
        assert add.get_result(result.id).return_value == {"sum": 3, "parts": [1, 2]}
    # Django's own check of every alias (registered once django.tasks is imported, as
    # slotd's app does) refuses the broken one: that is Django's to say. Past it, slotd's
    # command works.
    status = manage_py("slotd", "--skip-checks", "status", "--json", tasks=tasks)
    assert status.returncode == 0, status
    checked = manage_py("check", tasks=tasks)
    assert "Could not find backend 'does_not_exist.Backend'" in checked.stderr
    # A broken alias that names slotd is slotd's to report.
    broken = {"default": {**SLOTD, "BACKEND": "slotd.contrib.django.Nope"}}
    with override_settings(TASKS=broken), pytest.raises(Exception, match="Nope"):
        configured.slotd_backends()


def test_queues_empty_means_any_queue_name(slotd_conn: psycopg.Connection[Any]) -> None:
    """Item 5: Django's `QUEUES: []` accepts every queue name; the worker serves them all
    through one task type, and a queue in QUEUE_OPTIONS keeps a type of its own."""
    from django_project.shop.tasks import add

    options = {"MAX_ATTEMPTS": 1, "QUEUE_OPTIONS": {"mail": {"CEILING": "2m"}}}
    tasks = {"default": {**SLOTD, "QUEUES": [], "OPTIONS": options}}
    with override_settings(TASKS=tasks):
        assert task_backends["default"].check() == []
        assert build_registry().types == ["django.mail", ANY_QUEUE_TYPE]
        results = [
            add.enqueue(1, 1),
            add.using(queue_name="Reports Weekly").enqueue(2, 2),
            add.using(queue_name="mail").enqueue(3, 3),
        ]
        rows = slotd_conn.execute("SELECT task_type FROM slotd_tasks ORDER BY id").fetchall()
        assert rows == [(ANY_QUEUE_TYPE,), (ANY_QUEUE_TYPE,), ("django.mail",)]
        assert drain(slotd_conn) == 3
        for result in results:
            result.refresh()
            assert result.status == SUCCESSFUL and result.task.queue_name in (
                "default",
                "Reports Weekly",
                "mail",
            )


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"CEILNG": "1m"}, "unknown key 'CEILNG' (did you mean 'CEILING'?)"),
        ({"MAX_ATEMPTS": 5}, "unknown key 'MAX_ATEMPTS' (did you mean 'MAX_ATTEMPTS'?)"),
        ({"max_attempts": 5}, "unknown key 'max_attempts' (did you mean 'MAX_ATTEMPTS'?)"),
        ({"CONCURRENCY": 4}, "unknown key 'CONCURRENCY'; known: CEILING, MAX_ATTEMPTS"),
        (
            {"QUEUE_OPTIONS": {"default": {"CEILING": "1m", "RETRIES": 2}}},
            "QUEUE_OPTIONS['default'] has an unknown key 'RETRIES'",
        ),
    ],
)
def test_misspelt_options_are_refused(options: dict[str, Any], said: str) -> None:
    """Item 6: a misspelt key was a silently ignored setting."""
    backend = SlotdBackend("default", {"QUEUES": ["default"], "OPTIONS": options})
    assert any(said in m.msg for m in backend.check()), [m.msg for m in backend.check()]
    with pytest.raises(ValueError, match="unknown key"):
        backend.queue_configs()


def test_manage_py_check_reports_a_bad_tasks_setting_in_a_fresh_project() -> None:
    """Item 4: nothing imported django.tasks before the checks ran, so its backends' checks
    were never registered; slotd's app imports it."""
    bad = {"default": {**SLOTD, "QUEUES": ["Upper"], "OPTIONS": {"CEILNG": "1m"}}}
    checked = manage_py("check", tasks=bad)
    assert checked.returncode == 1, checked
    assert "queue name 'Upper' cannot be a slotd task type" in checked.stderr
    assert "did you mean 'CEILING'?" in checked.stderr
    assert manage_py("check", tasks={"default": SLOTD}).returncode == 0


def test_enqueued_at_is_the_enqueue_not_the_transaction_start() -> None:
    """Item 8: the result row took now(), the start of the caller's transaction."""
    from django_project.shop.tasks import add

    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SELECT now(), clock_timestamp()")
            began, before = cur.fetchone()
        result = add.enqueue(1, 1)
    assert result.enqueued_at >= before > began
    assert add.get_result(result.id).enqueued_at == result.enqueued_at


def test_a_worker_for_some_queues_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`manage.py slotd run --queue NAME` (django-tasks' `db_worker --queue-name`): the
    worker registers those queues' task types only; a name no backend has is refused."""
    from slotd.contrib.django.management.commands.slotd import _queues
    from slotd.contrib.django.worker import QUEUES_ENV

    assert _queues(["--queue", "slow", "--slots", "2", "--queue=default"]) == (
        ["--slots", "2"],
        ["slow", "default"],
    )
    monkeypatch.setenv(QUEUES_ENV, "slow")
    assert build_registry().types == ["django.slow"]
    monkeypatch.setenv(QUEUES_ENV, "emails")
    with pytest.raises(ValueError, match="--queue 'emails' is not a queue"):
        build_registry()
