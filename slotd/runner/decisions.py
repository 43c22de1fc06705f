"""What a handler's exception decides about its task (#38), in the runner, where the
exception and the handler's options are: a snooze (`slotd.Snooze`), a dead letter now
(`slotd.Discard`, `discard_on=`, an exception `retry_on=` does not name), or a failure whose
next attempt comes after a delay the handler chose (`slotd.RetryAfter`, `backoff=`). The
decision crosses the pipe as plain values in the Result (its kind and `extra`); the slot
settles it through slotd.lifecycle like any other result."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from slotd import outcome as kinds
from slotd.errors import Discard, RetryAfter, Snooze
from slotd.lifecycle import DISCARD
from slotd.registry import Handler

log = logging.getLogger("slotd.runner")


def decide(handler: Handler, attempt: int, exc: BaseException) -> tuple[str, dict[str, Any]]:
    """The result's kind and its `extra` for a handler that raised `exc` on `attempt`."""
    if isinstance(exc, Snooze):
        return kinds.SNOOZE, {kinds.SNOOZE_S: exc.delay_s}
    if isinstance(exc, (Discard, *handler.discard_on)):
        return kinds.ERROR, {DISCARD: True}
    if isinstance(exc, RetryAfter):
        return kinds.ERROR, {kinds.RETRY_IN_S: exc.delay_s}
    if handler.retry_on is not None and not isinstance(exc, handler.retry_on):
        return kinds.ERROR, {DISCARD: True}
    if handler.backoff is not None:
        delay = _backoff(handler, attempt, exc)
        if delay is not None:
            return kinds.ERROR, {kinds.RETRY_IN_S: delay}
    return kinds.ERROR, {}


def _backoff(handler: Handler, attempt: int, exc: BaseException) -> float | None:
    """The handler's backoff in seconds; a backoff that raises or answers something other
    than a non-negative timedelta is logged and the default backoff used instead."""
    assert handler.backoff is not None
    try:
        delay = handler.backoff(attempt, exc)
    except Exception as err:  # noqa: BLE001 - the task's failure is kept, its delay defaulted
        log.warning("task type %s: backoff raised %r; the default applies", handler.name, err)
        return None
    if not isinstance(delay, timedelta) or delay < timedelta(0):
        log.warning(
            "task type %s: backoff returned %r, not a timedelta >= 0; the default applies",
            handler.name,
            delay,
        )
        return None
    return delay.total_seconds()
