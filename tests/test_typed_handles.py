"""Typed task handles through a real `slotd run`: `@registry.handler(..., payload=Model)`
returns a handle that validates before anything is written and enqueues by the type's own
name; the handler is handed the model; a payload its model refuses (enqueued untyped) is
discarded once, never retried. A type checker (mypy) run over tests/typecheck/ accepts the
correct calls and rejects a wrong payload type."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import slotd
from tests.apps import typed
from tests.apps.typed import Invoice, Line, Refund
from tests.daemon import ROOT, Daemon

APP = "tests.apps.typed:registry"


@dataclasses.dataclass
class When:
    at: datetime


def _count(conn: psycopg.Connection[Any]) -> int:
    return conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()[0]


def test_a_typed_handle_enqueues_and_its_handler_is_handed_the_model(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    inv = typed.invoice.enqueue(conn, Invoice(order=7, lines=[Line("a", 2)]), key="order:7")
    assert inv.created
    again = typed.invoice.enqueue(conn, Invoice(order=7), key="order:7")
    assert again == inv and not again.created  # deduped onto the live task
    ping = typed.ping.enqueue(conn, {"host": "db", "port": 5432})
    [refund] = typed.refund.enqueue_many(conn, [Refund(order=7, amount=2.5)])

    async def from_asyncio() -> int:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            return await typed.invoice.enqueue_async(aconn, Invoice(order=8, currency="USD"))

    inv_async = asyncio.run(from_asyncio())
    # The wire stays JSON: the row holds the model's JSON object.
    stored = conn.execute("SELECT payload FROM slotd_tasks WHERE id = %s", (inv,)).fetchone()[0]
    assert stored == {
        "order": 7,
        "currency": "EUR",
        "lines": [{"sku": "a", "qty": 2}],
        "note": None,
    }
    daemons.append(Daemon(db_url, app=APP).start())

    assert slotd.wait_result(conn, inv, timeout=60).value == {
        "class": "Invoice",
        "order": 7,
        "currency": "EUR",
        "lines": [["Line", "a", 2]],
    }
    assert slotd.wait_result(conn, inv_async, timeout=60).value["currency"] == "USD"
    assert slotd.wait_result(conn, ping, timeout=60).value == {"class": "dict", "host": "db"}
    assert slotd.wait_result(conn, refund, timeout=60).value == {"class": "Refund", "amount": 2.5}
    # The handle is still the function.
    assert typed.invoice.__name__ == "invoice" and typed.invoice.fn is not None


def test_a_bad_payload_is_refused_naming_the_field_before_anything_is_written(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(TypeError, match=r"task 'typed.invoice': field 'order': expected an int"):
        typed.invoice.enqueue(conn, Invoice(order="7"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"field 'lines\[0\].qty'"):
        typed.invoice.enqueue(conn, Invoice(order=7, lines=[Line("a", "2")]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"field 'currency': 'GBP' is not one of"):
        typed.invoice.enqueue(conn, Invoice(order=7, currency="GBP"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expected a Invoice, got dict"):
        typed.invoice.enqueue(conn, {"order": 7})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"field 'port': missing"):
        typed.ping.enqueue(conn, {"host": "db"})  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match=r"field 'amount'"):
        typed.refund.enqueue(conn, Refund.model_construct(order=1, amount=-1.0))
    # one bad payload among good ones: none is written
    with pytest.raises(TypeError, match=r"field 'order'"):
        typed.invoice.enqueue_many(conn, [Invoice(order=1), Invoice(order=None)])  # type: ignore[arg-type]
    assert _count(conn) == 0


def test_a_field_type_that_is_not_json_is_refused_at_declaration() -> None:
    registry = slotd.Registry()
    with pytest.raises(TypeError, match=r"task type 'w': field 'at': type datetime is not a JSON"):
        registry.handler("w", ceiling=timedelta(seconds=1), payload=When)(lambda t, c: None)
    with pytest.raises(TypeError, match=r"use a dataclass, a TypedDict or a pydantic model"):
        registry.handler("x", ceiling=timedelta(seconds=1), payload=int)(lambda t, c: None)
    assert "w" not in registry and "x" not in registry


def test_a_payload_its_model_refuses_is_discarded_once_never_retried(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = Daemon(db_url, app=APP).start()
    daemons.append(daemon)
    bad = slotd.enqueue(conn, "typed.invoice", {"order": "seven"}, max_attempts=5)
    unknown = slotd.enqueue(conn, "typed.refund", {"order": 1, "amount": 3, "extra": 1})
    plain = slotd.enqueue(conn, "typed.plain", {"anything": 1})  # untyped: unchanged
    got = slotd.wait_result(conn, bad, timeout=60)
    assert got.state == "failed"
    assert "invalid payload: field 'order': expected an integer, got str 'seven'" in got.error
    assert "discarded, not retried" in got.error
    row = conn.execute(
        "SELECT dead_reason, dead_attempts, attempt_count FROM slotd_tasks WHERE id = %s", (bad,)
    ).fetchone()
    assert row == ("discarded", 1, 1)  # one attempt of five, and a dead letter at once
    # pydantic's own rules (extra fields are ignored by default): the model decides
    assert slotd.wait_result(conn, unknown, timeout=60).value == {"class": "Refund", "amount": 3.0}
    assert slotd.wait_result(conn, plain, timeout=60).value == {"class": "dict", "anything": 1}
    line = daemon.wait_line(rf"typed.invoice#{bad}\b.*discarded")
    assert "attempt 1" in line
    listed = subprocess.run(
        [sys.executable, "-m", "slotd", "dead", "list", "--json"],
        env={**daemon.env},
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    assert '"discarded"' in listed


def test_mypy_accepts_correct_calls_and_rejects_a_wrong_payload_type() -> None:
    # mypy is in the `test` extra: a missing one fails here, never skips the check.
    checked = ROOT / "tests" / "typecheck"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--follow-imports=silent",
            "--cache-dir=/dev/null",
            str(checked / "handles_ok.py"),
            str(checked / "handles_wrong.py"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 1, run.stdout + run.stderr  # 1: type errors found (2: mypy failed)
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    wrong = (checked / "handles_wrong.py").read_text().splitlines()
    expected = {n + 1 for n, text in enumerate(wrong) if "# WRONG" in text}
    found = {int(m.group(1)) for e in errors if (m := re.search(r"handles_wrong.py:(\d+):", e))}
    assert not [e for e in errors if "handles_ok.py" in e], run.stdout
    assert found == expected, run.stdout
    assert all("incompatible type" in e and 'expected "Invoice"' in e for e in errors), run.stdout


def test_pydantic_is_never_imported_by_dataclass_or_typeddict_handles(db_url: str) -> None:
    # pydantic is optional: a project of dataclasses and TypedDicts never loads it, neither
    # declaring, enqueueing, nor building the model a handler is handed.
    code = f"""
import sys, dataclasses, typing
from datetime import timedelta
import psycopg, slotd
from slotd.typed.models import PayloadModel

@dataclasses.dataclass
class A:
    n: int

class B(typing.TypedDict):
    s: str

registry = slotd.Registry()
a = registry.handler("a", ceiling=timedelta(seconds=1), payload=A)(lambda t, c: None)
b = registry.handler("b", ceiling=timedelta(seconds=1), payload=B)(lambda t, c: None)
with psycopg.connect({db_url!r}, autocommit=True) as conn:
    a.enqueue(conn, A(n=1))
    b.enqueue_many(conn, [{{"s": "x"}}])
assert PayloadModel(A).load({{"n": 2}}, "a") == A(n=2)
print("pydantic" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
