"""slotd's manual mode (the `task_queue` fixture) driving Django tasks: the test scripts
adverse deliveries and the results follow the same state rules as under the daemon."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

pytest.importorskip("django", minversion="6.0")

from django.db import transaction  # noqa: E402
from django.tasks import TaskResultStatus  # noqa: E402

from slotd.contrib.django import results  # noqa: E402
from slotd.outcome import Outcome  # noqa: E402
from slotd.registry import Registry  # noqa: E402
from slotd.testing import ManualQueue  # noqa: E402

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def calls(task: str) -> int:
    from django_project.shop.models import Call

    return Call.objects.filter(task=task).count()


def test_capture_and_deliver_all(task_queue: ManualQueue) -> None:
    from django_project.shop.models import Order
    from django_project.shop.tasks import add, confirm_order

    with task_queue.capture() as ids, transaction.atomic():
        Order.objects.create(number="M-1")
        confirmed = confirm_order.enqueue("M-1")
        summed = add.enqueue(2, 2)
    assert len(ids) == 2
    assert [t.type for t in task_queue.pending()] == ["django.default", "django.default"]
    settled = task_queue.deliver_all()
    assert [s.outcome for s in settled] == [Outcome.SUCCESS, Outcome.SUCCESS]
    assert confirm_order.get_result(confirmed.id).return_value == 1
    assert add.get_result(summed.id).return_value == {"sum": 4, "parts": [2, 2]}
    assert task_queue.pending() == []


def test_redeliver_last_reruns_a_successful_task_and_it_stays_successful(
    task_queue: ManualQueue,
) -> None:
    from django_project.shop.models import Order
    from django_project.shop.tasks import confirm_order

    Order.objects.create(number="M-2")
    result = confirm_order.enqueue("M-2")
    task_queue.deliver_all()
    assert task_queue.redeliver_last().outcome == Outcome.SUCCESS
    assert calls("confirm_order") == 2
    # confirm_order is not idempotent, and the duplicate shows it: the test found a bug
    # at-least-once delivery would cause in production.
    assert Order.objects.get(number="M-2").confirmations == 2
    result.refresh()
    assert result.status == SUCCESSFUL and result.return_value == 1
    assert result.attempts == 2


def test_fail_next_then_retry_then_dead_letter(task_queue: ManualQueue) -> None:
    from django_project.shop.tasks import add

    result = add.enqueue(1, 2)
    task_queue.fail_next(ConnectionError("broker down"))
    assert task_queue.deliver_next().outcome == Outcome.FAILURE  # type: ignore[union-attr]
    assert calls("add") == 0  # the injected failure ran in the handler's place
    assert add.get_result(result.id).status == READY  # owed another attempt
    assert task_queue.deliver_all() == []  # backing off
    task_queue.advance_time(3600)
    task_queue.fail_next()
    task_queue.fail_next()
    task_queue.deliver_next()
    task_queue.advance_time(3600)
    last = task_queue.deliver_next()
    assert last is not None and last.dead
    assert [d.type for d in task_queue.dead()] == ["django.default"]
    shown = add.get_result(result.id)
    assert shown.status == FAILED
    assert shown.errors[-1].exception_class is results.AttemptFailed
    assert "failure injected" in shown.errors[-1].traceback


def test_a_task_failing_on_every_attempt_is_failed(task_queue: ManualQueue) -> None:
    from django_project.shop.tasks import explode

    result = explode.enqueue("again")
    for _ in range(3):
        task_queue.deliver_all()
        task_queue.advance_time(3600)
    assert len(task_queue.dead()) == 1
    result.refresh()
    assert result.status == FAILED and result.attempts == 3
    assert [e.exception_class for e in result.errors] == [ValueError] * 3


def test_drop_next_then_redelivery(task_queue: ManualQueue) -> None:
    from django_project.shop.tasks import add

    result = add.enqueue(5, 5)
    dropped = task_queue.drop_next()
    assert dropped is not None and dropped.attempt == 1
    assert [t.id for t in task_queue.running()] == [dropped.id]
    assert task_queue.deliver_all() == []  # leased by the vanished worker
    task_queue.expire_leases()
    assert [s.outcome for s in task_queue.deliver_all()] == [Outcome.SUCCESS]
    result.refresh()
    assert result.status == SUCCESSFUL and result.attempts == 1  # the drop never ran it


@pytest.fixture
def in_transaction_queue(slotd_registry: Registry) -> Iterator[tuple[ManualQueue, Any]]:
    """As a Django TestCase runs: everything inside one transaction that is rolled back,
    the queue driven on Django's own connection so it sees the uncommitted rows."""
    with transaction.atomic():
        raw: psycopg.Connection[Any] = results.raw_connection("default")
        yield ManualQueue(raw, slotd_registry), raw
        transaction.set_rollback(True)


def test_manual_mode_inside_the_tests_own_transaction(
    in_transaction_queue: tuple[ManualQueue, Any], slotd_conn: psycopg.Connection[Any]
) -> None:
    from django_project.shop.models import Order
    from django_project.shop.tasks import confirm_order

    queue, _ = in_transaction_queue
    Order.objects.create(number="T-1")
    result = confirm_order.enqueue("T-1")
    assert [s.outcome for s in queue.deliver_all()] == [Outcome.SUCCESS]
    assert confirm_order.get_result(result.id).status == SUCCESSFUL
    # Nothing of it is visible outside the test's transaction.
    assert slotd_conn.execute("SELECT count(*) FROM slotd_django_results").fetchone() == (0,)
