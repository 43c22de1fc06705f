"""One attempt's chain: the registry's middleware (slotd.middleware) around one handler call,
slotd's own integrations outermost. Composed here, in the runner, at each attempt: the
registry only records what was registered, so it needs nothing of what runs it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from slotd import integrations

if TYPE_CHECKING:
    from slotd.middleware import Middleware
    from slotd.registry import Handler
    from slotd.task import Context, Task

Call = Callable[["Handler", "Context"], Any]


def run(handler: Handler, ctx: Context, call: Call) -> Any:
    """`call(handler, ctx)` (the bare handler call, processor's) inside the chain, slotd's
    own middleware (integrations) outermost. With nothing in it, the bare call: each
    level costs a closure per attempt, which is not free on the runner's hot path."""
    chain = handler.chain
    if chain is None:
        return call(handler, ctx)
    plain, awaited = chain._resolved or chain.resolved()
    own = integrations.middleware()
    if own:
        plain = own + plain
    if awaited and handler.is_async:
        handler = _through(handler, awaited)
    if not plain:
        return call(handler, ctx)
    return _next(plain, 0, ctx.task, ctx, lambda: call(handler, ctx))


def _next(
    chain: tuple[Middleware, ...], i: int, task: Task, ctx: Context, last: Callable[[], Any]
) -> Any:
    if i == len(chain):
        return last()
    return chain[i](task, ctx, lambda: _next(chain, i + 1, task, ctx, last))


def _through(handler: Handler, chain: tuple[Middleware, ...]) -> Handler:
    """The async handler as one coroutine function with the async middleware around it."""
    fn = handler.fn

    async def wrapped(task: Task, ctx: Context) -> Any:
        return await _anext(chain, 0, task, ctx, fn)

    return replace(handler, fn=wrapped)


async def _anext(
    chain: tuple[Middleware, ...], i: int, task: Task, ctx: Context, fn: Callable[..., Any]
) -> Any:
    if i == len(chain):
        return await fn(task, ctx)
    return await chain[i](task, ctx, lambda: _anext(chain, i + 1, task, ctx, fn))
