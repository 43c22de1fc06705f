"""The event loop `async def` handlers run on: one per thread for its life (in the daemon,
the runner's main thread), so a handler's async clients (pools, HTTP sessions) stay warm
from task to task just as a sync handler's module-level ones do.

Cancellation arrives in signal handlers (the slot's deadline interrupt, a shutdown). Raising
there would tear the loop's own machinery, so they only schedule a cancel of the handler's
task: its `await` points raise CancelledError, and the call as a whole ends in the
DeadlineExceeded or Cancelled that asked for it. A coroutine stuck in a blocking call never
reaches an await; the slot's kill grace ends it with its runner.

An attempt owns the asyncio tasks it starts, and the tasks those start: each task is
attributed, as it is created, to the attempt whose context it was created in (the loop's
task factory reads a context variable the handler's task carries). When an attempt ends by
its deadline or a cancel, its tasks are cancelled and awaited before its result goes back
(`end_attempt`), so none of them runs on during a later handler. A successful attempt's are
left running: a pool or client a handler keeps at module level starts its background tasks
in whichever attempt first used it, and must keep working for the attempts after it."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
import weakref
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class _Attempt:
    """One handler call's asyncio tasks but its own: none made until it starts one."""

    __slots__ = ("tasks",)

    def __init__(self) -> None:
        self.tasks: weakref.WeakSet[asyncio.Task[Any]] | None = None


# The attempt a task was created in (directly, or by a task of that attempt's).
_ATTEMPT: contextvars.ContextVar[_Attempt] = contextvars.ContextVar("slotd_attempt")


class HandlerLoop:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._why: BaseException | None = None
        self._attempt: _Attempt | None = None  # the last call's, until end_attempt

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        # Not installed as the thread's current loop: a sync handler that calls
        # asyncio.run() still gets a loop of its own, as anywhere else.
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
            self._loop.set_task_factory(_attributed)
        return self._loop

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run one handler call to its end and return what it returned."""
        if _running_here():
            # Called from async code (an async test in eager mode): this thread's loop is
            # busy, so the handler gets a thread and a loop of its own, in this context (a
            # middleware's contextvars, the attempt's span), as it would on this loop.
            here = contextvars.copy_context()
            with ThreadPoolExecutor(1, thread_name_prefix="slotd-handler") as pool:
                return pool.submit(here.run, lambda: current().run(coro)).result()
        loop, attempt = self.loop, _Attempt()
        # The handler's task carries its attempt in its context (a copy of this one), and
        # so does every task created from it; it is made past the factory: not its own.
        token = _ATTEMPT.set(attempt)
        try:
            task = asyncio.Task(coro, loop=loop)
        finally:
            _ATTEMPT.reset(token)
        self._task, self._why, self._attempt = task, None, attempt
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError as exc:
            why = self._why
            if why is None:  # the handler's own cancellation, not ours: its error
                raise
            raise why from exc
        finally:
            self._task = self._why = None

    def end_attempt(self, stop: bool, grace: float) -> bool:
        """The last call's attempt is over. `stop` (it ended by its deadline or a cancel):
        cancel every task it started and await them up to `grace` seconds, and True only if
        all of them ended. Otherwise its tasks are left running, and True."""
        attempt, self._attempt = self._attempt, None
        if not stop or attempt is None or attempt.tasks is None or self._loop is None:
            return True
        loop, until, tasks = self._loop, time.monotonic() + grace, attempt.tasks
        # A task may start another as it unwinds (a finally that spawns): look again.
        while left := [t for t in tasks if not t.done()]:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return False
            for t in left:
                t.cancel("the attempt that started it has ended")
            loop.run_until_complete(asyncio.wait(left, timeout=remaining))
        for t in tasks:  # their errors died with the attempt: no "never retrieved" noise
            if not t.cancelled():
                t.exception()
        return True

    @property
    def returned(self) -> bool:
        """This attempt's call has come to its end (returned, raised, was cancelled), and
        the attempt is not yet over: a deadline interrupt now is too late to matter."""
        return self._task is None and self._attempt is not None

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


def _attributed(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    """The loop's task factory: an asyncio.Task, recorded as its creator's attempt's."""
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
    context = kwargs.get("context")
    attempt = _ATTEMPT.get(None) if context is None else context.get(_ATTEMPT)
    if attempt is not None:
        if attempt.tasks is None:
            attempt.tasks = weakref.WeakSet()
        attempt.tasks.add(task)
    return task


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
