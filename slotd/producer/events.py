"""slotd.emit: an event for the tasks waiting on it (ctx.wait_event), written in the
caller's transaction like an enqueue: it wakes them only if that transaction commits, and a
wait that begins after the commit still sees it (kept for SLOTD_RETENTION). From SQL:
`SELECT slotd_emit('approved:order:7', '{"by": "ann"}')`."""

from __future__ import annotations

import json
from typing import Any

from slotd.repository import AsyncExecutor, Executor
from slotd.repository.events import emit_event, emit_event_async


def _encoded(name: str, data: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("emit: an event needs a non-empty name")
    try:
        return json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"emit {name!r}: data is not JSON-serializable: {exc}") from None


def emit(conn: Executor, name: str, data: Any = None, *, schema: str | None = None) -> int:
    """Emit event `name` with JSON `data`, in `conn`'s transaction (never committed here);
    returns how many waiting tasks it will wake when that commits."""
    return emit_event(conn, name, _encoded(name, data), schema=schema)


async def emit_async(
    conn: AsyncExecutor, name: str, data: Any = None, *, schema: str | None = None
) -> int:
    """`emit` on an async connection."""
    return await emit_event_async(conn, name, _encoded(name, data), schema=schema)
