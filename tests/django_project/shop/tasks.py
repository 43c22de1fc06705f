"""Task functions the Django tests enqueue."""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.tasks import TaskContext, task
from django_project.shop.models import Call, Order

from slotd.contrib.django import task_options


@task
def confirm_order(number: str) -> int:
    Call.objects.create(task="confirm_order", arg=number)
    Order.objects.filter(number=number).update(confirmations=F("confirmations") + 1)
    return Order.objects.get(number=number).confirmations


@task
def add(a: int, b: int) -> dict[str, Any]:
    Call.objects.create(task="add", arg=f"{a}+{b}")
    return {"sum": a + b, "parts": [a, b]}


@task
def explode(message: str) -> None:
    Call.objects.create(task="explode", arg=message)
    raise ValueError(message)


@task
def fail_until(number: str, succeed_on: int) -> str:
    """Fails until it has been called `succeed_on` times for this order."""
    Call.objects.create(task="fail_until", arg=number)
    calls = Call.objects.filter(task="fail_until", arg=number).count()
    if calls < succeed_on:
        raise RuntimeError(f"call {calls} of {number} fails")
    return f"ok after {calls}"


@task
async def async_double(x: int) -> int:
    await Call.objects.acreate(task="async_double", arg=str(x))
    return 2 * x


@task
async def async_where() -> str:
    """Which thread an async task's coroutine runs on (the worker's own loop: MainThread)."""
    import threading

    await Call.objects.acreate(task="async_where")
    return threading.current_thread().name


@task
async def async_wait_forever() -> None:
    """Awaits until cancelled; records that it saw the cancellation."""
    import asyncio

    await Call.objects.acreate(task="async_wait_forever", arg="start")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await Call.objects.acreate(task="async_wait_forever", arg="cancelled")
        raise


@task(takes_context=True)
def attempt_number(context: TaskContext) -> int:
    Call.objects.create(task="attempt_number")
    return context.attempt


@task(queue_name="slow")
def slow_one() -> str:
    Call.objects.create(task="slow_one")
    return "slow"


@task
def succeed_then_fail(number: str) -> str:
    """Succeeds on its first run only: a re-run after success fails."""
    Call.objects.create(task="succeed_then_fail", arg=number)
    if Call.objects.filter(task="succeed_then_fail", arg=number).count() > 1:
        raise RuntimeError("second run")
    return "first"


@task
def returns_datetime() -> Any:
    Call.objects.create(task="returns_datetime")
    from datetime import datetime

    return datetime(2026, 12, 1, 9, 0)


@task
@task_options(max_attempts=7)
def seven_tries() -> None:
    Call.objects.create(task="seven_tries")
    raise RuntimeError("again")
