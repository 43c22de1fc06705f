"""Django tests without a worker (#42 item 7): slotd.contrib.django.testing.EagerBackend
writes the real rows and runs the task inside enque(), as Django's ImmediateBackend does,
under Django's own test runner (no pytest needed). Django's own tests/tasks for
ImmediateBackend run against it too (tests/django/upstream)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("django", minversion="6.0")

from django.db import transaction  # noqa: E402
from django.tasks import TaskResultStatus  # noqa: E402
from django.test import override_settings  # noqa: E402

from slotd.contrib.django.results import AttemptFailed  # noqa: E402

SUCCESSFUL, FAILED, READY = (
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
    TaskResultStatus.READY,
)
EAGER = {
    "default": {
        "BACKEND": "slotd.contrib.django.testing.EagerBackend",
        "QUEUES": ["default", "slow"],
    }
}
ROOT = Path(__file__).resolve().parent.parent.parent


@override_settings(TASKS=EAGER)
def test_enqueue_runs_the_task_and_returns_it_finished(
    slotd_conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    from django_project.shop.tasks import add

    with caplog.at_level(logging.DEBUG, logger="django.tasks"):
        result = add.enqueue(2, 3)
    assert result.status == SUCCESSFUL and result.return_value == {"sum": 5, "parts": [2, 3]}
    assert result.is_finished and len(result.worker_ids) == 1
    # Logged in the order ImmediateBackend logs: enqueued (after the commit), then the run.
    said = [r.getMessage().split(" ")[-1] for r in caplog.records if result.id in r.getMessage()]
    assert said == ["backend=default", "state=RUNNING", "state=SUCCESSFUL"]
    # The real rows: the queue row is gone (done), the result row stays.
    assert slotd_conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,)
    assert add.get_result(result.id).status == SUCCESSFUL


@override_settings(TASKS=EAGER)
def test_a_failure_is_failed_at_once_and_inside_a_transaction_it_rolls_back(
    slotd_conn: psycopg.Connection[Any],
) -> None:
    from django_project.shop.tasks import add, explode

    result = explode.enqueue("boom")
    assert result.status == FAILED and result.finished_at is not None
    assert [e.exception_class for e in result.errors] == [ValueError]
    assert result.errors[0].traceback.endswith("ValueError: boom\n")
    assert result.errors[0].exception_class is not AttemptFailed

    with pytest.raises(RuntimeError), transaction.atomic():
        inside = add.enqueue(1, 1)
        assert inside.status == SUCCESSFUL  # ran in the transaction...
        raise RuntimeError("roll back")
    # ...and went with it.
    count = "SELECT count(*) FROM slotd_django_results WHERE id = %s"
    assert slotd_conn.execute(count, (inside.id,)).fetchone() == (0,)


@override_settings(
    TASKS={"default": {**EAGER["default"], "OPTIONS": {"MAX_ATTEMPTS": 2}}},
)
def test_with_attempts_left_a_failure_is_ready_and_not_run_again() -> None:
    from django_project.shop.tasks import explode

    result = explode.enqueue("once")
    assert result.status == READY and len(result.errors) == 1


def test_slotd_testing_imports_without_pytest() -> None:
    """slotd[django] does not install pytest: the test modes must not need it."""
    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "import slotd.testing, slotd.contrib.django.testing\n"
        "print(slotd.testing.eager.__name__)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": ""}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "eager"
