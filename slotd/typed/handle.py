"""Typed task handles: what `@registry.handler(..., payload=Model)` returns.

A handle is still the handler function (calling it calls the function) and knows its task
type and payload model, so enqueueing through it needs neither the type's name as a string
nor a dict: `send_invoice.enqueue(conn, Invoice(order=7), key="order:7")`. The payload is
validated and turned into its JSON object before anything is written (slotd.typed.models), then
written by slotd.enqueue itself: same statement, same options, same transaction rules."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import update_wrapper
from typing import Any, Generic

from slotd.typed.ids import EnqueuedId
from slotd.typed.models import P, PayloadModel


class TaskHandle(Generic[P]):
    """A task type with a typed payload. `options` are slotd.enqueue's (delay, key,
    priority, group, unique, run_at, tags, after, expires_in, schema, ...)."""

    def __init__(self, name: str, fn: Callable[..., Any], model: PayloadModel[P]) -> None:
        self.name = name
        self.fn = fn
        self.model = model
        update_wrapper(self, fn)  # type: ignore[arg-type]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<slotd task handle {self.name!r} payload={self.model.name}>"

    def payload_of(self, payload: P) -> dict[str, Any]:
        """The JSON object `payload` is written as (TypeError/ValueError naming the field)."""
        return self.model.dump(payload, f"task {self.name!r}")

    def enqueue(self, conn: Any, payload: P, **options: Any) -> EnqueuedId:
        """One task in the caller's transaction; see slotd.enqueue."""
        from slotd import enqueue

        return enqueue(conn, self.name, self.payload_of(payload), **options)

    async def enqueue_async(self, conn: Any, payload: P, **options: Any) -> EnqueuedId:
        """enqueue from asyncio; see slotd.enqueue_async."""
        from slotd import enqueue_async

        return await enqueue_async(conn, self.name, self.payload_of(payload), **options)

    def enqueue_many(self, conn: Any, payloads: Iterable[P], **options: Any) -> list[EnqueuedId]:
        """One task per payload, one statement; every payload is validated before any is
        written. `options`: slotd.enqueue_many's (max_attempts, unique, after, ...)."""
        from slotd import enqueue_many

        rows = [(self.name, self.payload_of(p)) for p in payloads]
        return enqueue_many(conn, rows, **options)

    async def enqueue_many_async(
        self, conn: Any, payloads: Iterable[P], **options: Any
    ) -> list[EnqueuedId]:
        from slotd import enqueue_many_async

        rows = [(self.name, self.payload_of(p)) for p in payloads]
        return await enqueue_many_async(conn, rows, **options)
