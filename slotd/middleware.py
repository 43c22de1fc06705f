"""Middleware around every attempt: `fn(task, ctx, call_next)`, outermost first in
registration order, slotd's own integrations (tracing) outermost of all. `call_next()` runs
the rest of the chain and the handler and returns the handler's value; whatever the
outermost returns is the attempt's value (None/True done, False continue, ...).

Exceptions pass through untouched: the deadline's DeadlineExceeded and a cancel's Cancelled
reach every middleware on their way out, and whatever leaves the outermost one is the
attempt's failure (processor.execute classifies it), never the slot's.

Plain and async middleware meet async handlers like this:
- A plain `def` middleware wraps every handler. Around an `async def` handler it runs in the
  runner's thread, outside the event loop, and its call_next() runs the rest of the chain
  and the handler on the loop to their end: the handler's asyncio task copies the context,
  so a contextvar the middleware set (a tenant, the current span) is seen by the handler.
- An `async def` middleware wraps `async def` handlers only (`return await call_next()`);
  sync handlers run without it. Awaiting a sync handler would run it on the loop, where the
  deadline can only cancel the loop's task instead of raising in the handler's frame.
- So, around an async handler, every plain middleware is outside every async one, and
  registration order must agree: a plain `def` registered after an `async def` one is
  refused with a ValueError (it would have to run inside it, blocking on a loop that is
  already running)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slotd.task import Context, Task

Middleware = Callable[["Task", "Context", Callable[[], Any]], Any]


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class Chain:
    """One registry's middleware, in registration order, plain and async apart."""

    def __init__(self) -> None:
        self._plain: list[Middleware] = []
        self._async: list[Middleware] = []
        self._resolved: tuple[tuple[Middleware, ...], tuple[Middleware, ...]] | None = None

    def add(self, fn: Middleware, is_async: bool) -> None:
        if not callable(fn):
            raise ValueError(f"middleware {fn!r} is not callable")
        try:
            inspect.signature(fn).bind(None, None, None)
        except TypeError:
            raise ValueError(
                f"middleware {_name(fn)} must take three arguments: (task, ctx, call_next)"
            ) from None
        except ValueError:  # no signature to read (a builtin): trust it
            pass
        if not is_async and self._async:
            raise ValueError(
                f"middleware {_name(fn)} is a plain def registered after the async def "
                f"middleware {_name(self._async[0])}: around async handlers it would have to "
                "run inside it; register plain def middleware before async def middleware"
            )
        (self._async if is_async else self._plain).append(fn)
        self._resolved = None

    def resolved(self) -> tuple[tuple[Middleware, ...], tuple[Middleware, ...]]:
        """(plain, async), as tuples made once per registration."""
        if self._resolved is None:
            self._resolved = (tuple(self._plain), tuple(self._async))
        return self._resolved
