"""The event loop `async def` handlers run on: one per thread for its life (in the daemon,
the runner's main thread), so a handler's async clients (pools, HTTP sessions) stay warm
from task to task just as a sync handler's module-level ones do.

Cancellation arrives in signal handlers (the slot's deadline interrupt, a shutdown). Raising
there would tear the loop's own machinery, so they only schedule a cancel of the handler's
task: its `await` points raise CancelledError, and the call as a whole ends in the
DeadlineExceeded or Cancelled that asked for it. A coroutine stuck in a blocking call never
reaches an await; the slot's kill grace ends it with its runner."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class HandlerLoop:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._why: BaseException | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        # Not installed as the thread's current loop: a sync handler that calls
        # asyncio.run() still gets a loop of its own, as anywhere else.
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run one handler call to its end and return what it returned."""
        if _running_here():
            # Called from async code (an async test in eager mode): this thread's loop is
            # busy, so the handler gets a thread and a loop of its own.
            with ThreadPoolExecutor(1, thread_name_prefix="slotd-handler") as pool:
                return pool.submit(lambda: current().run(coro)).result()
        loop = self.loop
        task = loop.create_task(coro)
        self._task, self._why = task, None
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError as exc:
            why = self._why
            if why is None:  # the handler's own cancellation, not ours: its error
                raise
            raise why from exc
        finally:
            self._task = self._why = None

    def cancel(self, why: BaseException) -> bool:
        """Signal-safe: schedule the running call's cancellation, which will end it in `why`.
        False when no call is running (a sync handler is, or none)."""
        task, loop = self._task, self._loop
        if task is None or loop is None:
            return False
        loop.call_soon_threadsafe(self._cancel, task, why)
        return True

    def _cancel(self, task: asyncio.Task[Any], why: BaseException) -> None:
        # A late callback meets the next task, or none: it must cancel only its own.
        if task is self._task and not task.done():
            self._why = why  # the latest reason: a deadline after an ignored shutdown wins
            task.cancel(str(why))


def _running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


_local = threading.local()


def current() -> HandlerLoop:
    """This thread's handler loop, made on first use and kept for the thread's life."""
    found: HandlerLoop | None = getattr(_local, "loop", None)
    if found is None:
        found = _local.loop = HandlerLoop()
    return found
