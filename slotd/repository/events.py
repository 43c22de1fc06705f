"""Durable events (#38): an emit, in the caller's transaction (sql/072 slotd_emit)."""

from __future__ import annotations

from slotd.repository.named import AsyncExecutor, Executor, _sql


def emit_event(target: Executor, name: str, data: str, *, schema: str | None = None) -> int:
    """Emit `name` with `data` (JSON text); how many waiting tasks it woke."""
    row = target.execute(_sql("emit", schema), {"name": name, "data": data}).fetchone()
    return int(row[0]) if row else 0


async def emit_event_async(
    target: AsyncExecutor, name: str, data: str, *, schema: str | None = None
) -> int:
    cur = await target.execute(_sql("emit", schema), {"name": name, "data": data})
    row = await cur.fetchone()
    return int(row[0]) if row else 0
