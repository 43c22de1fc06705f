"""What a Django user meets when a task cannot run as written: a task path the worker cannot
import, a return value JSON cannot carry, per-task retry options, the system check, and
slotd's eager mode running Django tasks."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

pytest.importorskip("django", minversion="6.0")

from django.tasks import TaskResultStatus  # noqa: E402
from django.test import override_settings  # noqa: E402

from slotd.contrib.django import results  # noqa: E402
from slotd.contrib.django.backend import DEFAULT_MAX_ATTEMPTS, SlotdBackend  # noqa: E402
from slotd.outcome import Outcome  # noqa: E402
from slotd.registry import Registry  # noqa: E402
from slotd.repository import Repository  # noqa: E402
from slotd.runner.processor import process  # noqa: E402
from slotd.testing import TaskFailed  # noqa: E402

SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


@pytest.fixture
def repo(slotd_conn: psycopg.Connection[Any]) -> Repository:
    return Repository(slotd_conn)


def deliver(repo: Repository, registry: Registry) -> Any:
    claimed = repo.claim(repo.discover(registry.types), registry)
    assert claimed is not None
    return process(repo, registry, claimed)


def queue_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT task_type, max_attempts FROM slotd_tasks ORDER BY id").fetchall()


def calls(task: str) -> int:
    from django_project.shop.models import Call

    return Call.objects.filter(task=task).count()


@pytest.mark.parametrize(
    "path", ["django_project.shop.tasks.vanished", "django_project.gone.tasks.add"]
)
def test_a_task_the_worker_cannot_import_is_failed_at_once_with_the_import_error(
    path: str, repo: Repository, slotd_registry: Registry, slotd_conn: psycopg.Connection[Any]
) -> None:
    from django_project.shop.tasks import add

    result = add.enqueue(1, 2)
    slotd_conn.execute(
        "UPDATE slotd_django_results SET task_path = %s WHERE id = %s", (path, result.id)
    )
    settled = deliver(repo, slotd_registry)
    assert settled.outcome is Outcome.SUCCESS  # the queue is done with it: no retries
    assert queue_rows(slotd_conn) == []
    from django.tasks import task_backends

    # Readable by id although its task no longer imports (add.get_result() would refuse:
    # the stored task is no longer `add`).
    shown = task_backends["default"].get_result(result.id)
    assert shown.status == FAILED and shown.attempts == 1
    [error] = shown.errors
    assert issubclass(error.exception_class, ImportError)
    assert path.rpartition(".")[0] in error.traceback
    assert shown.task.module_path == path
    assert calls("add") == 0


def test_a_return_value_that_is_not_json_names_itself_and_is_not_retried(
    repo: Repository, slotd_registry: Registry, slotd_conn: psycopg.Connection[Any]
) -> None:
    from django_project.shop.tasks import returns_datetime

    result = returns_datetime.enqueue()
    deliver(repo, slotd_registry)
    assert queue_rows(slotd_conn) == []
    shown = returns_datetime.get_result(result.id)
    assert shown.status == FAILED
    [error] = shown.errors
    assert error.exception_class is results.ReturnValueNotJSON
    assert "returned datetime.datetime(2026, 12, 1, 9, 0) (datetime)" in error.traceback
    assert "returns_datetime" in error.traceback
    assert calls("returns_datetime") == 1  # ran once: its side effects are not repeated


def test_per_task_max_attempts_from_the_decorator_wins_over_the_queue(
    slotd_conn: psycopg.Connection[Any],
) -> None:
    from django_project.shop.tasks import add, seven_tries

    add.enqueue(1, 1)
    seven_tries.enqueue()
    assert queue_rows(slotd_conn) == [("django.default", 3), ("django.default", 7)]


def test_the_default_is_three_attempts_and_bad_options_are_refused() -> None:
    from slotd.contrib.django import task_options

    plain = SlotdBackend("plain", {"QUEUES": ["default"]})
    assert DEFAULT_MAX_ATTEMPTS == 3
    assert [c.max_attempts for c in plain.queue_configs()] == [3]
    for bad in (0, "5", True):
        with pytest.raises(ValueError, match="max_attempts"):
            task_options(max_attempts=bad)  # type: ignore[arg-type]


def test_the_system_check_says_when_the_app_is_not_installed() -> None:
    from django.tasks import task_backends

    with override_settings(INSTALLED_APPS=["django_project.shop"]):
        messages = [m.msg for m in task_backends["default"].check()]
    assert any("slotd.contrib.django is not in INSTALLED_APPS" in m for m in messages)
    assert task_backends["default"].check() == []


def test_slotd_eager_runs_django_tasks_with_their_result_row(slotd_eager: Any) -> None:
    from django_project.shop.tasks import add

    result = add.enqueue(2, 3)
    assert [s.outcome for _, s in slotd_eager.settlements] == [Outcome.SUCCESS]
    # What enqueue returns is already finished, as with Django's ImmediateBackend (#42 item 7).
    assert result.status == SUCCESSFUL and result.return_value == {"sum": 5, "parts": [2, 3]}
    shown = add.get_result(result.id)
    assert shown.status == SUCCESSFUL and shown.return_value == {"sum": 5, "parts": [2, 3]}
    assert calls("add") == 1


@pytest.mark.slotd_eager(propagate=True)
def test_slotd_eager_propagates_a_django_task_failure(slotd_eager: Any) -> None:
    from django_project.shop.tasks import explode

    with pytest.raises(TaskFailed, match="ValueError: boom") as failed:
        explode.enqueue("boom")
    assert isinstance(failed.value.__cause__, ValueError)
