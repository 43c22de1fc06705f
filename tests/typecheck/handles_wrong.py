"""Checked by mypy in tests/test_typed_handles.py: the marked lines are wrong."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

import slotd

registry = slotd.Registry()


@dataclass
class Invoice:
    order: int


@dataclass
class Refund:
    order: int


@registry.handler("send_invoice", ceiling=timedelta(minutes=1), payload=Invoice)
def send_invoice(task: slotd.Task[Invoice], ctx: slotd.Context) -> None: ...


def produce(conn: psycopg.Connection[Any]) -> None:
    send_invoice.enqueue(conn, Refund(order=7))  # WRONG: a Refund is not an Invoice
    send_invoice.enqueue(conn, {"order": 7})  # WRONG: a dict is not an Invoice
