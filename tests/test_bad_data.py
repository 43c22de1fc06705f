"""Bad data is the handler's error, never its slot's: through a real `slotd run`, the stored
error says what was wrong, the outcome is a failure, and the slot process is the same."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import slotd
from tests.daemon import Daemon, wait_for
from tests.test_runtime import settled, start, starts


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


def test_an_error_message_postgres_cannot_store_is_stored_escaped_and_bounded(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1)
    before = slot_pid(daemon)
    task_id = slotd.enqueue(qconn, "rt.loud_error")
    row = wait_for(lambda: settled(qconn, task_id), what="the failure")
    error = row["last_error"]
    assert "nul\\x00here" in error  # escaped, not lost
    assert error.rstrip().endswith("lone \\ud800 surrogate, the end")  # the tail is kept
    assert "characters cut" in error and len(error) <= 8000
    assert error.startswith("Traceback")  # and the head
    daemon.wait_line(rf"rt.loud_error#{task_id} attempt 1: failure")
    assert slot_pid(daemon) == before


REFUSE_DELETE = """
CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.payload ? 'refuse' THEN RAISE EXCEPTION 'deletes refused by a trigger'; END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER refuse_delete BEFORE DELETE ON slotd_tasks
    FOR EACH ROW EXECUTE FUNCTION refuse_delete();
"""


def test_a_settlement_the_database_refuses_is_recorded_as_the_tasks_failure(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    qconn.execute(REFUSE_DELETE)
    daemon = start(daemons, db_url, slots=1)
    before = slot_pid(daemon)
    task_id = slotd.enqueue(qconn, "rt.noop", {"refuse": True})
    row = wait_for(lambda: settled(qconn, task_id), what="the failure")
    assert "slotd could not settle this attempt (done)" in row["last_error"]
    assert "deletes refused by a trigger" in row["last_error"]
    assert row["attempt_count"] == 1 and row["run_at"] > row["last_attempted_at"]  # backed off
    daemon.wait_line(rf"rt.noop#{task_id} attempt 1: failure")
    assert slot_pid(daemon) == before
    # The slot goes on serving, on the same connection.
    follow = slotd.enqueue(qconn, "rt.noop")
    wait_for(lambda: qconn.execute("SELECT count(*) FROM slotd_tasks WHERE id = %s",
                                   (follow,)).fetchone() == (0,), what="the next task")  # fmt: skip
    assert slot_pid(daemon) == before


def test_continue_without_advancing_is_backed_off_not_spun(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1)  # backoff 30 s (tests.daemon.FAST)
    task_id = slotd.enqueue(qconn, "rt.stuck_continue")
    row = wait_for(lambda: settled(qconn, task_id), what="the backed-off continue")
    assert row["attempt_count"] == 1  # the attempt is kept
    assert (row["run_at"] - row["last_attempted_at"]).total_seconds() > 20  # backed off
    assert "continued without advancing" in row["last_error"]
    daemon.wait_line(rf"rt.stuck_continue#{task_id} attempt 1: continued")
    daemon.wait_line("slice advanced nothing; backed off like a failure")
    assert len(starts(qconn, task_id)) == 1  # not 20 attempts in 150 ms


REFUSE_CURSOR = """
CREATE FUNCTION refuse_cursor() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.payload ? 'refuse' THEN RAISE EXCEPTION 'cursor refused by a trigger'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_cursor BEFORE UPDATE ON slotd_tasks
    FOR EACH ROW EXECUTE FUNCTION refuse_cursor();
"""


def test_a_cursor_the_database_refuses_raises_value_error_in_the_handler(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    qconn.execute(REFUSE_CURSOR)
    daemon = start(daemons, db_url, slots=1)
    before = slot_pid(daemon)
    task_id = slotd.enqueue(qconn, "rt.bad_cursor", {"kind": "refused"})
    row = wait_for(lambda: settled(qconn, task_id), what="the failure")
    assert "ValueError: cursor not stored: cursor refused by a trigger" in row["last_error"]
    assert "bad_cursor" in row["last_error"]  # raised in the handler's frame
    assert row["payload"] == {"kind": "refused"}
    daemon.wait_line(rf"rt.bad_cursor#{task_id} attempt 1: failure")
    assert slot_pid(daemon) == before
