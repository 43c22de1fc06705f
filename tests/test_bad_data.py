"""Bad data is the handler's error, never its slot's: through a real `slotd run`, the stored
error says what was wrong, the outcome is a failure, and the slot process is the same."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import slotd
from tests.daemon import Daemon, wait_for
from tests.test_runtime import settled, start


def slot_pid(daemon: Daemon) -> int:
    found = wait_for(lambda: daemon.titled("slot 0"), what="slot 0")
    return found[0].pid


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("datetime", "TypeError: task {id} cursor: payload is not JSON-serializable"),
        ("nul", "TypeError: task {id} cursor: payload contains a NUL character"),
    ],
)
def test_a_cursor_postgres_cannot_store_raises_in_the_handler(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], kind: str, error: str
) -> None:
    daemon = start(daemons, db_url, slots=1)
    before = slot_pid(daemon)
    task_id = slotd.enqueue(qconn, "rt.bad_cursor", {"kind": kind})
    row = wait_for(lambda: settled(qconn, task_id), what="the failure")
    assert error.format(id=task_id) in row["last_error"]
    assert "bad_cursor" in row["last_error"]  # the traceback runs through the handler
    assert row["payload"] == {"kind": kind}  # nothing half-written
    daemon.wait_line(rf"rt.bad_cursor#{task_id} attempt 1: failure")
    assert slot_pid(daemon) == before


def test_enqueue_refuses_a_nul_character_before_writing(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        with pytest.raises(TypeError, match="NUL character"):
            slotd.enqueue(conn, "rt.noop", {"name": "a\x00b"})
        # The caller's transaction is untouched and still usable.
        assert slotd.enqueue(conn, "rt.noop", {"name": "a\\u0000b"}) > 0
        conn.commit()
