"""Log lines: the text and JSON shapes, the task fields, and no database password ever."""

from __future__ import annotations

import io
import json
import logging
import os
import shlex
import signal
from collections.abc import Iterator
from typing import Any

import pytest

import slotd
from slotd import logs
from tests.daemon import Daemon, wait_for

URL = "postgresql://slotd:hunter2@db.internal:5432/jobs"


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def emit(fmt: str, role: str = "supervisor") -> tuple[io.StringIO, logging.Logger]:
    stream = io.StringIO()
    logs.configure(fmt, role=role, stream=stream)
    return stream, logging.getLogger("slotd.test")


OUTCOME_FIELDS = {
    "task_id": 42,
    "task_type": "prefix_delete",
    "attempt": 3,
    "slot": 1,
    "outcome": "success",
    "duration": 0.01234567,
}


def test_text_line_has_time_level_role_message_and_fields(root_restored: None) -> None:
    stream, log = emit("text", role="slot-1")
    log.info("task prefix_delete#42 attempt 3: success", extra=OUTCOME_FIELDS)
    (line,) = stream.getvalue().splitlines()
    stamp, level, role, rest = line.split(None, 3)
    assert stamp.endswith("Z") and "T" in stamp
    assert (level, role) == ("INFO", "slot-1")
    assert rest.startswith("task prefix_delete#42 attempt 3: success  ")
    assert rest.endswith(
        "task_id=42 task_type=prefix_delete attempt=3 slot=1 outcome=success duration=0.0123457"
    )


def test_text_quotes_values_that_would_break_key_value(root_restored: None) -> None:
    stream, log = emit("text")
    log.warning("slice stopped early on a page read", extra={"cursor": "org 7", "pages_read": 2})
    assert stream.getvalue().rstrip().endswith('cursor="org 7" pages_read=2')


def test_json_is_one_object_per_line_with_the_same_fields(root_restored: None) -> None:
    stream, log = emit("json", role="runner")
    log.info("first", extra=OUTCOME_FIELDS)
    log.warning("second")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "info" and first["role"] == "runner" and first["message"] == "first"
    assert {k: first[k] for k in OUTCOME_FIELDS} == OUTCOME_FIELDS
    assert first["time"].endswith("Z")
    assert second["level"] == "warning" and "task_id" not in second


def test_level_filters(root_restored: None) -> None:
    stream = io.StringIO()
    logs.configure("text", level=logging.WARNING, stream=stream)
    logging.getLogger("slotd.test").info("hidden")
    logging.getLogger("slotd.test").warning("shown")
    assert stream.getvalue().count("\n") == 1 and "shown" in stream.getvalue()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_url_password_never_reaches_a_line(fmt: str, root_restored: None) -> None:
    stream, log = emit(fmt)
    log.error("cannot connect to %s", URL, extra={"url": URL, "nested": {"dsn": URL}})
    log.warning("conninfo host=db password=hunter2 user=slotd")
    try:
        raise ConnectionError(f"connection to {URL} refused")
    except ConnectionError:
        log.exception("database gone")
    out = stream.getvalue()
    assert "hunter2" not in out
    assert "slotd:***@db.internal" in out
    if fmt == "json":
        lines = [json.loads(line) for line in out.splitlines()]
        assert len(lines) == 3 and "ConnectionError" in lines[2]["exc"]


def test_configure_twice_replaces_its_own_handler_only(root_restored: None) -> None:
    other = logging.NullHandler()
    logging.getLogger().addHandler(other)
    first = io.StringIO()
    logs.configure("text", stream=first)
    stream, log = emit("json", role="slot-2")
    log.info("once")
    assert first.getvalue() == ""
    assert len(stream.getvalue().splitlines()) == 1
    assert other in logging.getLogger().handlers
    logging.getLogger().removeHandler(other)


def test_bad_format_is_refused() -> None:
    with pytest.raises(ValueError):
        logs.configure("yaml")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_daemons_settlement_line_carries_the_task_fields(
    fmt: str, qconn: Any, db_url: str, daemons: list[Daemon]
) -> None:
    """As an operator reads it: a real `slotd run`, a failing handler, its one line."""
    daemon = Daemon(db_url, slots=1, env={"SLOTD_LOG_FORMAT": fmt})
    daemons.append(daemon)
    daemon.start(wait_ready=False)
    task_id = slotd.enqueue(qconn, "rt.fail")
    line = daemon.wait_line(rf"rt\.fail#{task_id} attempt 1: failure")
    if fmt == "json":
        fields = json.loads(line)
    else:
        fields = dict(
            part.split("=", 1) for part in shlex.split(line.split("  ", 1)[1]) if "=" in part
        )
    assert str(fields["task_id"]) == str(task_id)
    assert fields["task_type"] == "rt.fail"
    assert str(fields["attempt"]) == "1"
    assert fields["outcome"] == "failure"
    assert float(fields["duration"]) >= 0
    assert fields["error"] == "RuntimeError: attempt 1 failed"
    assert str(fields["slot"]) == "0"


def test_a_holding_handler_writes_info_lines_in_batches_and_warnings_at_once(
    root_restored: None,
) -> None:
    """A busy slot's settlement lines leave together (one write per batch): every line
    arrives, in order, no later than the hold, at the holder's flush, or with the first
    warning, which never waits."""

    class Writes(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writes = 0

        def write(self, text: str) -> int:
            self.writes += 1
            return super().write(text)

    stream = Writes()
    handler = logs.configure("text", role="slot 0", stream=stream)
    log = logging.getLogger("slotd.test")
    logs.hold(3600.0)
    for n in range(5):
        log.info("task t#%d attempt 1: success", n)
    assert stream.getvalue() == "" and logs.due_in() is not None
    log.warning("task t#5 attempt 1: failure")  # at once, after the lines before it
    lines = stream.getvalue().splitlines()
    assert [line.split()[-4] for line in lines] == [f"t#{n}" for n in range(6)]
    assert stream.writes == 1 and logs.due_in() is None
    log.info("task t#6 attempt 1: success")
    logs.flush()  # what a slot does before it blocks, forks or exits
    assert stream.getvalue().splitlines()[-1].endswith("t#6 attempt 1: success")
    assert stream.writes == 2
    for n in range(2000):  # a batch never grows past HOLD_BYTES: a pipe takes it whole
        log.info("task t#%d attempt 1: success", n)
    assert 2000 * 60 // logs.HOLD_BYTES <= stream.writes - 2 <= 2000 * 100 // logs.HOLD_BYTES
    logs.hold(0)  # a runner's: every line as it is logged
    before = stream.writes
    log.info("from a handler")
    assert stream.writes >= before + 1 and stream.getvalue().endswith("from a handler\n")
    assert isinstance(handler, logs.HoldingHandler)


def test_every_settlement_line_arrives_once_from_slots_that_hold_them(
    qconn: Any, db_url: str, daemons: list[Daemon]
) -> None:
    """Held lines are not lost when the slot goes idle and not repeated by the runners it
    forks (a fork copies what is held): one line per task, runner recycling included."""
    daemon = Daemon(db_url, slots=2, env={"SLOTD_RUNNER_MAX_TASKS": "7"})
    daemons.append(daemon)
    daemon.start()
    ids = slotd.enqueue_many(qconn, [("rt.noop", {"n": n}) for n in range(60)])

    def settled() -> list[str]:
        return [line for line in daemon.lines if ": success" in line and "task rt.noop#" in line]

    wait_for(lambda: len(settled()) >= 60, timeout=60, what="60 settlement lines")
    daemon.signal(signal.SIGTERM)  # every process writes what it holds on its way out
    assert daemon.wait() == 0
    daemon.wait_line(r"INFO +supervisor stopped")  # the last line: the reader has them all
    seen = sorted(int(line.split("task rt.noop#")[1].split()[0]) for line in settled())
    assert seen == sorted(ids)


def test_a_slot_skips_the_record_fields_it_never_prints_and_a_runner_gets_them_back(
    root_restored: None,
) -> None:
    """The slot's lines need no caller, thread or process (slotd's formatters print none of
    them, and finding the caller walks the stack per line); a runner's handler logging
    through its own formatter gets them all, as in any Python process."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logging.getLogger("slotd.test.lean")
    log.addHandler(Keep())
    log.propagate = False
    try:
        logs.lean_records(True)
        log.warning("in a slot")
        logs.lean_records(False)  # what the runner does after the fork
        log.warning("in a runner")
    finally:
        logs.lean_records(False)
    slot, runner = records
    assert (slot.funcName, slot.lineno, slot.process, slot.threadName) == (
        "(unknown function)",
        0,
        None,
        None,
    )
    assert (
        runner.funcName
        == "test_a_slot_skips_the_record_fields_it_never_prints_and_a_runner_gets_them_back"
    )
    assert runner.lineno > 0 and runner.process == os.getpid() and runner.threadName


def test_log_lines_from_a_slot_and_its_runner_come_out_in_time_order(
    qconn: Any, db_url: str, daemons: list[Daemon]
) -> None:
    """The slot holds its settlement lines (batches); the runner's handler logs at once. A
    sliced handler's `page N` comes after the `continued` of the slice before it, as the
    operator reads the log."""
    daemon = Daemon(db_url, slots=1)
    daemons.append(daemon)
    daemon.start()
    task_id = slotd.enqueue(qconn, "rt.logged_pages")
    daemon.wait_line(rf"rt\.logged_pages#{task_id} attempt \d+: success")
    ours = [
        line
        for line in daemon.lines
        if f"task {task_id} page" in line or f"rt.logged_pages#{task_id} attempt" in line
    ]
    said = ["page" if " page " in line else line.split(": ", 1)[1].split()[0] for line in ours]
    assert said == ["page", "continued"] * 3 + ["page", "success"], "\n".join(ours)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_settlement_line_without_a_record_reads_as_the_record_would(
    fmt: str, root_restored: None
) -> None:
    # logs.line builds the line from its parts when slotd's handler is the only one: it must
    # print exactly what logger.log prints (the time aside), password redaction included.
    stream, logger = emit(fmt, role="slot 2")
    adapter = logs.FieldsAdapter(logger, {"slot": 2})
    fields = {**OUTCOME_FIELDS, "error": f"connect to {URL} failed", "_private": 1}
    args = ("email.send", 42, 3, "failure", " in 1.5ms", "")
    adapter.log(logging.WARNING, "task %s#%s attempt %s: %s%s%s", *args, extra=fields)
    logs.line(adapter, logging.WARNING, "task %s#%s attempt %s: %s%s%s", args, fields)
    logs.flush()
    by_record, by_parts = stream.getvalue().splitlines()
    if fmt == "json":
        one, two = json.loads(by_record), json.loads(by_parts)
        assert one.pop("time") and two.pop("time")
        assert one == two and "hunter2" not in by_parts
    else:
        assert by_record.split(" ", 1)[1] == by_parts.split(" ", 1)[1]
        assert "hunter2" not in by_parts and "_private" not in by_parts


def test_a_settlement_line_reaches_an_applications_handler_as_a_record(
    root_restored: None,
) -> None:
    # An application that adds its own handler (an error reporter) gets the record itself.
    stream, logger = emit("text")
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logging.getLogger().addHandler(keep := Keep())
    try:
        logs.line(logger, logging.INFO, "task %s#%s: %s", ("a", 1, "success"), {"task_id": 1})
    finally:
        logging.getLogger().removeHandler(keep)
    logs.flush()
    [record] = seen
    assert (record.getMessage(), record.task_id) == ("task a#1: success", 1)  # type: ignore[attr-defined]
    assert stream.getvalue().count("task a#1: success") == 1
    # Below the level: nothing, either way.
    logging.getLogger().setLevel(logging.WARNING)
    logs.line(logger, logging.INFO, "quiet %s", ("x",), {})
    logs.flush()
    assert "quiet" not in stream.getvalue()


def test_a_run_of_failures_is_told_at_its_powers_of_two_then_once_a_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slotd import logs

    now = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: now[0])
    repeats = logs.Repeats()
    told = []
    for n in range(1, 41):
        now[0] += 2.0  # a try every 2 s, as a reconnect at its cap
        if repeats.failed():
            told.append(n)
    # Every 2 s, the 32nd comes 32 s after the 16th: no reminder needed in between.
    assert told == [1, 2, 4, 8, 16, 32]
    now[0] += 61
    assert repeats.failed()  # a minute of silence: a reminder
    assert repeats.ok() is True and repeats.ok() is False
    assert repeats.failed()  # a new run starts at its first
