"""The Django tasks backend on real PostgreSQL: enqueue in the business transaction, deferral,
results and their state rules under redelivery, retries and dead letters. Delivery goes
through slotd.processor.process, the step the daemon's slot and runner perform."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

pytest.importorskip("django", minversion="6.0")

from django.db import transaction  # noqa: E402
from django.tasks import TaskResultStatus  # noqa: E402
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist  # noqa: E402
from django.tasks.signals import task_enqueued, task_finished, task_started  # noqa: E402
from django.utils import timezone  # noqa: E402

from slotd import outcome as kinds  # noqa: E402
from slotd.contrib.django import results  # noqa: E402
from slotd.contrib.django.backend import SlotdBackend  # noqa: E402
from slotd.lifecycle import Settlement, settle  # noqa: E402
from slotd.outcome import (
    Outcome,  # noqa: E402
    Result,  # noqa: E402
)
from slotd.registry import Registry  # noqa: E402
from slotd.repository import Claimed, Repository  # noqa: E402
from slotd.runner.processor import process  # noqa: E402

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
TABLE = results.Results("default", "public")
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


@pytest.fixture
def repo(slotd_conn: psycopg.Connection[Any]) -> Repository:
    # Zero backoff: a failed task is due again at once, so retries need no waiting.
    return Repository(slotd_conn, backoff_base=timedelta(0), backoff_cap=timedelta(0))


def claim(repo: Repository, registry: Registry) -> Claimed | None:
    return repo.claim(repo.discover(registry.types), registry)


def deliver(repo: Repository, registry: Registry) -> Settlement | None:
    claimed = claim(repo, registry)
    return None if claimed is None else process(repo, registry, claimed)


def queue_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT task_type, attempt_count, max_attempts FROM slotd_tasks ORDER BY id"
    ).fetchall()


def calls(task: str) -> int:
    from django_project.shop.models import Call

    return Call.objects.filter(task=task).count()


class Signals:
    """Records what task_enqueued / task_started / task_finished were sent with."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []
        self._receivers = {
            "enqueued": task_enqueued,
            "started": task_started,
            "finished": task_finished,
        }
        for name, signal in self._receivers.items():
            signal.connect(self._receiver(name), weak=False, dispatch_uid=f"test-{name}")

    def _receiver(self, name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            self.seen.append((name, task_result.status, sender))

        return receive

    def close(self) -> None:
        for name, signal in self._receivers.items():
            signal.disconnect(dispatch_uid=f"test-{name}")


@pytest.fixture
def signals() -> Any:
    recorder = Signals()
    yield recorder
    recorder.close()


# enqueue and the business transaction


def test_enqueue_commits_with_the_business_write(
    slotd_conn: psycopg.Connection[Any], repo: Repository, slotd_registry: Registry, signals: Any
) -> None:
    from django_project.shop.models import Order
    from django_project.shop.tasks import confirm_order

    with transaction.atomic():
        Order.objects.create(number="A-1")
        result = confirm_order.enqueue("A-1")
        # Not yet committed: a worker on its own connection cannot see it.
        assert queue_rows(slotd_conn) == []
        assert repo.discover(slotd_registry.types) == []
        assert signals.seen == []  # task_enqueued waits for the commit
    assert queue_rows(slotd_conn) == [("django.default", 0, 3)]
    assert signals.seen == [("enqueued", READY, SlotdBackend)]
    assert result.status == READY and result.enqueued_at is not None
    stored = confirm_order.get_result(result.id)
    assert stored.status == READY and stored.args == ["A-1"]

    settled = deliver(repo, slotd_registry)
    assert settled is not None and settled.outcome == Outcome.SUCCESS and not settled.dead
    assert queue_rows(slotd_conn) == []
    assert Order.objects.get(number="A-1").confirmations == 1
    result.refresh()
    assert result.status == SUCCESSFUL and result.return_value == 1
    assert result.attempts == 1 and result.errors == []
    assert result.started_at <= result.finished_at
    assert [s[:2] for s in signals.seen[1:]] == [("started", RUNNING), ("finished", SUCCESSFUL)]


def test_enqueue_rolls_back_with_the_business_write(
    slotd_conn: psycopg.Connection[Any], signals: Any
) -> None:
    from django_project.shop.models import Order
    from django_project.shop.tasks import confirm_order

    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(number="B-1")
        result = confirm_order.enqueue("B-1")
        raise RuntimeError("the view failed after enqueueing")
    assert not Order.objects.filter(number="B-1").exists()
    assert queue_rows(slotd_conn) == []
    assert signals.seen == []
    with pytest.raises(TaskResultDoesNotExist):
        confirm_order.get_result(result.id)


def test_enqueue_in_a_savepoint_rolled_back_leaves_the_outer_work(
    slotd_conn: psycopg.Connection[Any],
) -> None:
    from django_project.shop.tasks import add

    with transaction.atomic():
        kept = add.enqueue(1, 2)
        with pytest.raises(RuntimeError), transaction.atomic():
            add.enqueue(3, 4)
            raise RuntimeError
    assert queue_rows(slotd_conn) == [("django.default", 0, 3)]
    assert add.get_result(kept.id).args == [1, 2]


def test_enqueue_in_autocommit_mode_is_visible_at_once(
    slotd_conn: psycopg.Connection[Any],
) -> None:
    from django_project.shop.tasks import add

    add.enqueue(1, 2)
    assert queue_rows(slotd_conn) == [("django.default", 0, 3)]


def test_validation_rejects_before_anything_is_written(
    slotd_conn: psycopg.Connection[Any],
) -> None:
    from django_project.shop.tasks import add

    with pytest.raises(InvalidTask, match="not valid"):
        add.using(queue_name="elsewhere")
    with pytest.raises(TypeError):
        add.enqueue(object(), 1)
    assert queue_rows(slotd_conn) == []


# deferral and queues


def test_run_after_is_the_rows_run_at(
    slotd_conn: psycopg.Connection[Any], repo: Repository, slotd_registry: Registry
) -> None:
    from django_project.shop.tasks import add

    when = timezone.now() + timedelta(hours=1)
    result = add.using(run_after=when).enqueue(2, 3)
    run_at = slotd_conn.execute("SELECT run_at FROM slotd_tasks").fetchone()[0]  # type: ignore[index]
    assert run_at == when
    assert deliver(repo, slotd_registry) is None  # not due
    repo.shift_time(3600)
    assert deliver(repo, slotd_registry) is not None
    assert add.get_result(result.id).return_value == {"sum": 5, "parts": [2, 3]}


def test_each_queue_is_a_task_type_with_its_own_ceiling(
    slotd_conn: psycopg.Connection[Any], repo: Repository, slotd_registry: Registry
) -> None:
    from django_project.shop.tasks import slow_one

    assert slotd_registry.types == ["django.default", "django.slow"]
    assert slotd_registry.ceilings_seconds == [60.0, 600.0]
    slow_one.enqueue()
    assert queue_rows(slotd_conn) == [("django.slow", 0, 1)]
    claimed = claim(repo, slotd_registry)
    assert claimed is not None
    lease = claimed.lease_expires_at - claimed.claimed_at
    assert lease == timedelta(minutes=10) + repo.lease_margin


# results and the state rules under redelivery


def test_results_over_sync_and_async_apis(repo: Repository, slotd_registry: Registry) -> None:
    from django_project.shop.tasks import add, async_double, attempt_number

    summed, doubled, attempt = add.enqueue(4, 5), async_double.enqueue(21), attempt_number.enqueue()
    for _ in range(3):
        deliver(repo, slotd_registry)
    assert add.get_result(summed.id).return_value == {"sum": 9, "parts": [4, 5]}
    fetched = asyncio.run(async_double.aget_result(doubled.id))
    assert fetched.status == SUCCESSFUL and fetched.return_value == 42
    assert attempt_number.get_result(attempt.id).return_value == 1
    assert calls("async_double") == 1
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("not-a-uuid")


def test_a_failing_task_is_not_failed_until_its_last_attempt(
    slotd_conn: psycopg.Connection[Any], repo: Repository, slotd_registry: Registry, signals: Any
) -> None:
    """Django's FAILED is final: `while not result.is_finished` (Django's documented loop)
    must wait through the retries, and task_finished fires once, at the end (#42 item 1).
    started_at stays the first attempt's start (item 3)."""
    from django_project.shop.tasks import explode

    result = explode.enqueue("nope")
    first = deliver(repo, slotd_registry)
    assert first is not None and first.outcome == Outcome.FAILURE and not first.dead, first
    result.refresh()
    assert result.status == READY and not result.is_finished and result.finished_at is None
    assert len(result.errors) == 1 and result.errors[0].exception_class is ValueError
    assert "ValueError: nope" in result.errors[0].traceback
    first_start = result.started_at
    assert first_start is not None and result.last_attempted_at == first_start

    deliver(repo, slotd_registry)
    result.refresh()
    assert result.status == READY and not result.is_finished and len(result.errors) == 2
    assert result.started_at == first_start and result.last_attempted_at > first_start
    assert [name for name, _, _ in signals.seen].count("finished") == 0

    last = deliver(repo, slotd_registry)
    assert last is not None and last.dead
    assert repo.dead_count("django.default") == 1
    result.refresh()
    assert result.status == FAILED and result.is_finished and result.finished_at is not None
    assert result.attempts == 3 and len(result.errors) == 3
    assert result.started_at == first_start
    assert calls("explode") == 3
    started = [status for name, status, _ in signals.seen if name == "started"]
    assert started == [RUNNING, RUNNING, RUNNING]
    finished = [status for name, status, _ in signals.seen if name == "finished"]
    assert finished == [FAILED]


def test_a_retry_that_succeeds_keeps_the_earlier_error(
    repo: Repository, slotd_registry: Registry, signals: Any
) -> None:
    from django_project.shop.tasks import fail_until

    result = fail_until.enqueue("C-1", 2)
    deliver(repo, slotd_registry)
    assert fail_until.get_result(result.id).status == READY

    seen_at_start: list[Any] = []

    def at_start(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen_at_start.append((task_result.status, task_result.finished_at))

    task_started.connect(at_start, weak=False, dispatch_uid="at-start")
    try:
        deliver(repo, slotd_registry)
    finally:
        task_started.disconnect(dispatch_uid="at-start")
    assert seen_at_start == [(RUNNING, None)]
    result.refresh()
    assert result.status == SUCCESSFUL and result.return_value == "ok after 2"
    assert len(result.errors) == 1 and result.attempts == 2
    finished = [status for name, status, _ in signals.seen if name == "finished"]
    assert finished == [SUCCESSFUL]


def run_without_settling(repo: Repository, registry: Registry) -> Claimed:
    """The runner ran the handler but the slot's settlement never happened (crash, lost
    connection): the lease lapses and the task is delivered again."""
    claimed = claim(repo, registry)
    assert claimed is not None
    handler = registry.get(claimed.task_type)
    assert handler is not None
    from slotd.task import Context

    ctx = Context(claimed.task(), claimed.deadline(repo.lease_margin), lambda p: False)
    try:
        handler.fn(claimed.task(), ctx)
    except Exception:  # noqa: BLE001 - the settlement that would record it is the lost part
        pass
    repo.expire_leases()
    return claimed


def test_successful_is_sticky_under_redelivery(repo: Repository, slotd_registry: Registry) -> None:
    from django_project.shop.tasks import add, succeed_then_fail

    done = add.enqueue(1, 1)
    run_without_settling(repo, slotd_registry)
    assert add.get_result(done.id).status == SUCCESSFUL
    settled = deliver(repo, slotd_registry)
    assert settled is not None and settled.outcome == Outcome.SUCCESS
    assert calls("add") == 2  # at least once: the redelivery ran it again
    again = add.get_result(done.id)
    assert again.status == SUCCESSFUL and again.return_value == {"sum": 2, "parts": [1, 1]}
    assert again.attempts == 2

    # A re-run that fails records its error but never moves SUCCESSFUL back, and is not
    # retried: the task has succeeded.
    other = succeed_then_fail.enqueue("D-1")
    run_without_settling(repo, slotd_registry)
    settled = deliver(repo, slotd_registry)
    assert settled is not None and settled.outcome == Outcome.SUCCESS
    after = succeed_then_fail.get_result(other.id)
    assert after.status == SUCCESSFUL and after.return_value == "first"
    assert len(after.errors) == 1 and after.errors[0].exception_class is RuntimeError


def test_attempts_the_handler_never_recorded_read_from_the_queue_row(
    repo: Repository, slotd_registry: Registry
) -> None:
    from django_project.shop.tasks import add, slow_one

    # Killed at the deadline on its only attempt: the result says RUNNING, the queue row is
    # a dead letter, and get_result reports FAILED with the queue's reason.
    killed = slow_one.enqueue()
    claimed = claim(repo, slotd_registry)
    assert claimed is not None
    TABLE.start(killed.id, "host:1")
    settled = settle(repo, claimed, Result(kinds.KILLED, "deadline exceeded"))
    assert settled.dead
    shown = slow_one.get_result(killed.id)
    assert shown.status == FAILED and shown.finished_at is not None
    assert shown.errors[-1].exception_class is results.AttemptFailed
    assert "deadline exceeded" in shown.errors[-1].traceback

    # A runner crash with attempts left: RUNNING is stale once the lease lapsed: READY.
    crashed = add.enqueue(0, 0)
    claimed = claim(repo, slotd_registry)
    assert claimed is not None
    TABLE.start(crashed.id, "host:2")
    assert add.get_result(crashed.id).status == RUNNING
    repo.expire_leases()
    assert add.get_result(crashed.id).status == READY
    # The next attempt records the lost one's error, in the queue row's words (#42 item 8).
    deliver(repo, slotd_registry)
    shown = add.get_result(crashed.id)
    assert shown.status == SUCCESSFUL and shown.attempts == 2
    [lost] = shown.errors
    assert lost.exception_class is results.AttemptFailed and lost.traceback


def test_two_deliveries_take_turns_on_the_result_row(
    django_db_url: str, repo: Repository, slotd_registry: Registry
) -> None:
    """The transitions lock the result row: a second delivery waits for the first's
    transaction instead of interleaving its check-then-act."""
    from django_project.shop.tasks import add

    result = add.enqueue(1, 2)
    assert claim(repo, slotd_registry) is not None
    with psycopg.connect(django_db_url) as holder:
        holder.execute("SELECT 1 FROM slotd_django_results WHERE id = %s FOR UPDATE", (result.id,))
        outcome: list[Any] = []

        def second_delivery() -> None:
            from django.db import connection

            try:
                outcome.append(TABLE.start(result.id, "host:2"))
            finally:
                connection.close()

        thread = threading.Thread(target=second_delivery)
        thread.start()
        with psycopg.connect(django_db_url, autocommit=True) as watcher:
            waiting = 0
            for _ in range(2000):  # waits for a state, not for time
                waiting = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()[0]  # type: ignore[index]
                if waiting:
                    break
                thread.join(0.005)
            assert waiting == 1 and outcome == []
        holder.commit()
        thread.join(30)
    assert outcome == [READY]
    assert add.get_result(result.id).status == RUNNING


def test_retention_prunes_old_finished_results(repo: Repository, slotd_registry: Registry) -> None:
    from django_project.shop.tasks import add

    old, fresh = add.enqueue(1, 0), add.enqueue(2, 0)
    deliver(repo, slotd_registry)
    deliver(repo, slotd_registry)
    with results.cursor("default") as cur:
        cur.execute(
            "UPDATE slotd_django_results SET finished_at = now() - interval '8 days' WHERE id = %s",
            (old.id,),
        )
    assert TABLE.prune(timedelta(days=7)) == 1
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(old.id)
    assert add.get_result(fresh.id).status == SUCCESSFUL


def test_the_worker_registry_needs_a_settings_module(monkeypatch: pytest.MonkeyPatch) -> None:
    from slotd.contrib.django import worker
    from slotd.errors import ConfigError

    monkeypatch.delenv("DJANGO_SETTINGS_MODULE")
    with pytest.raises(ConfigError, match="DJANGO_SETTINGS_MODULE"):
        worker.registry()
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "django_project.settings")
    assert worker.registry().types == ["django.default", "django.slow"]


def test_system_checks_pass_for_the_project() -> None:
    from django.tasks import task_backends

    assert task_backends["default"].check() == []
    bad = SlotdBackend("bad", {"QUEUES": ["Upper"], "OPTIONS": {"CEILING": "soon"}})
    messages = [m.msg for m in bad.check()]
    assert any("Upper" in m for m in messages) and any("CEILING" in m for m in messages)


def test_a_django_results_attempts_outlive_its_queue_row_until_the_result_goes(
    slotd_conn: psycopg.Connection[Any], repo: Repository, slotd_registry: Registry
) -> None:
    """get_result reads errors and worker ids from slotd_attempts (#37 item 4): retention
    keeps a task's attempts while its Django result answers for it, even once its queue row
    is gone (a purged dead letter), and prunes them with the result."""
    from django_project.shop.tasks import explode

    result = explode.enqueue("kept")
    deliver(repo, slotd_registry)
    slotd_conn.execute("DELETE FROM slotd_tasks")  # the dead letter purged
    assert repo.prune_attempts_batch() == 0
    shown = explode.get_result(result.id)
    assert shown.status == FAILED and [e.exception_class for e in shown.errors] == [ValueError]
    assert len(shown.worker_ids) == 1 and shown.worker_ids[0].count(":") >= 1
    slotd_conn.execute("DELETE FROM slotd_django_results")  # Django's retention
    assert repo.prune_attempts_batch() == 1
