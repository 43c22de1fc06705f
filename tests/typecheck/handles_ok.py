"""Checked by mypy in tests/test_typed_handles.py: every call here is correct."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

import psycopg

import slotd

registry = slotd.Registry()


@dataclass
class Invoice:
    order: int


class Ping(TypedDict):
    host: str


@registry.handler("send_invoice", ceiling=timedelta(minutes=1), payload=Invoice)
def send_invoice(task: slotd.Task[Invoice], ctx: slotd.Context) -> None:
    order: int = task.payload.order
    del order


@registry.handler("ping", ceiling=timedelta(minutes=1), payload=Ping)
def ping(task: slotd.Task[Ping], ctx: slotd.Context) -> None:
    host: str = task.payload["host"]
    del host


@registry.handler("plain", ceiling=timedelta(minutes=1))
def plain(task: slotd.Task, ctx: slotd.Context) -> bool:
    return bool(task.payload)


def produce(conn: psycopg.Connection[Any]) -> int:
    tid = send_invoice.enqueue(conn, Invoice(order=7), key="order:7")
    created: bool = tid.created
    ping.enqueue(conn, {"host": "db"})
    send_invoice.enqueue_many(conn, [Invoice(order=1), Invoice(order=2)])
    plain_id: int = slotd.enqueue(conn, "plain", {"x": 1})
    ok: bool = plain(slotd.Task(1, "plain", {}, 1, None, _now()), _ctx())
    return tid + plain_id + int(created) + int(ok)


async def produce_async(conn: psycopg.AsyncConnection[Any]) -> int:
    return await send_invoice.enqueue_async(conn, Invoice(order=8))


def _now() -> Any: ...
def _ctx() -> Any: ...
