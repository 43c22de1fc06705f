"""Typed handlers for tests/test_typed_handles.py: a dataclass, a TypedDict and a pydantic
model as payloads. Each returns what it was handed (kept), so a test reads what the handler
saw: the model's class and fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypedDict

import pydantic

import slotd

registry = slotd.Registry()
KEEP = timedelta(hours=1)


@dataclass
class Line:
    sku: str
    qty: int = 1


@dataclass
class Invoice:
    order: int
    currency: Literal["EUR", "USD"] = "EUR"
    lines: list[Line] = field(default_factory=list)
    note: str | None = None


class Ping(TypedDict):
    host: str
    port: int


class Refund(pydantic.BaseModel):
    order: int
    amount: float = pydantic.Field(gt=0)


@registry.handler("typed.invoice", ceiling=timedelta(seconds=30), payload=Invoice, keep_result=KEEP)
def invoice(task: slotd.Task[Invoice], ctx: slotd.Context) -> dict[str, Any]:
    p = task.payload
    return {
        "class": type(p).__name__,
        "order": p.order,
        "currency": p.currency,
        "lines": [[type(line).__name__, line.sku, line.qty] for line in p.lines],
    }


@registry.handler("typed.ping", ceiling=timedelta(seconds=30), payload=Ping, keep_result=KEEP)
async def ping(task: slotd.Task[Ping], ctx: slotd.Context) -> dict[str, Any]:
    return {"class": type(task.payload).__name__, "host": task.payload["host"]}


@registry.handler("typed.refund", ceiling=timedelta(seconds=30), payload=Refund, keep_result=KEEP)
def refund(task: slotd.Task[Refund], ctx: slotd.Context) -> dict[str, Any]:
    return {"class": type(task.payload).__name__, "amount": task.payload.amount}


@registry.handler("typed.plain", ceiling=timedelta(seconds=30), keep_result=KEEP)
def plain(task: slotd.Task, ctx: slotd.Context) -> dict[str, Any]:
    return {"class": type(task.payload).__name__, **task.payload}


@registry.handler("typed.tick", ceiling=timedelta(seconds=30), keep_result=KEEP)
def tick(task: slotd.Task, ctx: slotd.Context) -> dict[str, Any]:
    """A runtime schedule's task: its fire time (run_at) and key, kept."""
    return {"fire": task.run_at.isoformat(), "key": task.key, **task.payload}
