"""Log lines for humans (text) or machines (json), never carrying a database password.

One line per record: time, level, role (supervisor, slot-2, runner ...), message, then the
record's extras (task_id task_type attempt slot outcome duration first, the rest sorted).
Redaction happens in the formatter, after the message is rendered, so a URL that arrives
through %-arguments, an extra or an exception's text is caught the same way."""

from __future__ import annotations

import json
import logging
import mmap
import os
import re
import signal
import sys
import time
from datetime import UTC, datetime
from typing import IO, Any

from slotd.db import redact

FORMATS = ("text", "json")
# The fields an operator filters on, in the order they read best; an attempt's trace ids
# (slotd.tracing, when it ran in a span) right after them, where a log search joins a trace.
FIRST_FIELDS = ("task_id", "task_type", "attempt", "slot", "outcome", "duration")
TRACE_FIELDS = ("trace_id", "span_id")
_FIRST = frozenset(FIRST_FIELDS)
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_MARK = "_slotd_handler"


class FieldsAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger that adds its fields (e.g. the slot number) to every line while keeping the
    per-call `extra` (task id, outcome, error...). logging.LoggerAdapter replaces the
    call's extra with its own, which dropped the task's fields from every settlement line;
    `merge_extra` only arrives in Python 3.13."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


class Repeats:
    """Which failures of a run of them a component logs: its 1st, 2nd, 4th, 8th, 16th...
    (about one line per back-off step of a reconnect loop) and at least one a minute while
    the run lasts; the others go to DEBUG. A database gone for 40 s was 95 warnings from one
    replica of four slots, each component repeating itself every couple of seconds."""

    REMIND_EVERY = 60.0

    def __init__(self) -> None:
        self.count = 0
        self._said_at = float("-inf")

    def failed(self) -> bool:
        """Count a failure; True when it is one to log."""
        self.count += 1
        now = time.monotonic()
        if self.count & (self.count - 1) == 0 or now - self._said_at >= self.REMIND_EVERY:
            self._said_at = now
            return True
        return False

    def level(self) -> int:
        """`failed()` as the level to log this failure at."""
        return logging.WARNING if self.failed() else logging.DEBUG

    def ok(self) -> bool:
        """The run has ended; True when there was one (a failure since the last success)."""
        ended, self.count = self.count > 0, 0
        self._said_at = float("-inf")
        return ended


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    found = {k: v for k, v in record.__dict__.items() if k not in _STANDARD and k[:1] != "_"}
    found.pop("role", None)
    return _ordered(found)


def _ordered(found: dict[str, Any]) -> dict[str, Any]:
    ordered = {k: found.pop(k) for k in FIRST_FIELDS if k in found}
    if found:
        if "trace_id" in found:
            ordered.update((k, found.pop(k)) for k in TRACE_FIELDS if k in found)
        ordered.update(sorted(found.items()))
    return ordered


def _clean(value: Any) -> Any:
    if type(value) is int or value is None:  # most fields: ids, attempts
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


_second: tuple[int, str] = (-1, "")  # the last whole second, formatted: lines come in runs


def _timestamp(record: logging.LogRecord) -> str:
    return _stamp(record.created)


def _stamp(created: float) -> str:
    global _second
    whole = int(created)
    if whole != _second[0]:
        _second = (whole, datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{_second[1]}.{int((created - whole) * 1000):03d}Z"


class _Base(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def _parts(self, record: logging.LogRecord) -> tuple[str, dict[str, Any], str | None]:
        message = redact(record.getMessage())
        extras = {k: _clean(v) for k, v in _extras(record).items()}
        exc = None
        if record.exc_info:
            exc = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            exc = redact(record.exc_text)
        return message, extras, exc


class TextFormatter(_Base):
    def format(self, record: logging.LogRecord) -> str:
        message, extras, exc = self._parts(record)
        role = getattr(record, "role", None) or self.role
        return self.line(record.created, record.levelname, role, record.name, message, extras, exc)

    def line(
        self,
        created: float,
        levelname: str,
        role: str,
        name: str,
        message: str,
        extras: dict[str, Any],
        exc: str | None = None,
    ) -> str:
        fields = " ".join(f"{k}={_text_value(v)}" for k, v in extras.items() if v is not None)
        line = f"{_stamp(created)} {levelname:<7} {role} {message}"
        if fields:
            line = f"{line}  {fields}"
        if exc:
            line = f"{line}\n{exc}"
        return line

    def quick(self, created: float, levelname: str, message: str, fields: dict[str, Any]) -> str:
        """`line` for `logs.line`'s raw fields, in one pass: the same text (the fields in
        `_ordered`'s order, `_`-names and `role` left out, each `_text_value(_clean(v))`,
        None left out). A busy slot writes one per task; the passes of `_ordered`, `_clean`
        and `line` were a tenth of its CPU per no-op task (#43 item 2)."""
        parts = []
        for k in FIRST_FIELDS:
            v = fields.get(k)
            if v is not None:
                parts.append(f"{k}={v}" if type(v) is int else f"{k}={_text_value(_clean(v))}")
        if len(fields) > len(parts):
            rest = {
                k: v
                for k, v in fields.items()
                if k not in _FIRST and k[:1] != "_" and k != "role" and v is not None
            }
            parts.extend(f"{k}={_text_value(_clean(v))}" for k, v in _ordered(rest).items())
        line = f"{_stamp(created)} {levelname:<7} {self.role} {message}"
        return f"{line}  {' '.join(parts)}" if parts else line


def _text_value(value: Any) -> str:
    if type(value) is int:
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, default=_redacted_str, separators=(",", ":"))
    text = redact(str(value))
    # Quote only what would otherwise break key=value splitting.
    if not text or _BREAKS_FIELD.search(text):
        return json.dumps(text)
    return text


_BREAKS_FIELD = re.compile(r'[ "=\n\t]')


class JsonFormatter(_Base):
    def format(self, record: logging.LogRecord) -> str:
        message, extras, exc = self._parts(record)
        role = getattr(record, "role", None) or self.role
        return self.line(record.created, record.levelname, role, record.name, message, extras, exc)

    def line(
        self,
        created: float,
        levelname: str,
        role: str,
        name: str,
        message: str,
        extras: dict[str, Any],
        exc: str | None = None,
    ) -> str:
        obj: dict[str, Any] = {
            "time": _stamp(created),
            "level": levelname.lower(),
            "role": role,
            "logger": name,
            "message": message,
        }
        for key, value in extras.items():
            obj.setdefault(key, value)
        if exc:
            obj["exc"] = exc
        # An extra that is not JSON (a datetime, a UUID) still makes a line, redacted as
        # text; redacting the finished line instead could cut through its quoting.
        return json.dumps(obj, default=_redacted_str, ensure_ascii=False)


def _redacted_str(value: Any) -> str:
    return redact(str(value))


def line(
    logger: logging.Logger | logging.LoggerAdapter[Any],
    level: int,
    msg: str,
    args: tuple[Any, ...],
    fields: dict[str, Any],
) -> None:
    """`logger.log(level, msg, *args, extra=fields)`, for the lines a busy process writes per
    task (a settlement's), without building a LogRecord when slotd's handler is the only one
    the record would reach (no handler or filter of an application's on its way): the line
    is formatted from its parts and handed to that handler directly. The LogRecord and its
    route were a seventh of a slot's CPU per no-op task (tests/bench/cpu_per_task.py).
    Anything else takes the ordinary call, so an application's handler sees the record."""
    base = logger.logger if isinstance(logger, logging.LoggerAdapter) else logger
    if base.disabled or not base.isEnabledFor(level):
        return
    handler = _installed
    if handler is None or not _only_ours(base, handler, level):
        logger.log(level, msg, *args, extra=fields)
        return
    if isinstance(logger, logging.LoggerAdapter) and logger.extra:
        fields = {**logger.extra, **fields}  # as FieldsAdapter merges them
    formatter = handler.formatter
    if not isinstance(formatter, TextFormatter | JsonFormatter):
        logger.log(level, msg, *args, extra=fields)
        return
    message = redact(msg % args if args else msg)
    if type(formatter) is TextFormatter:
        text = formatter.quick(time.time(), logging.getLevelName(level), message, fields)
    else:
        own = {k: v for k, v in fields.items() if k[:1] != "_" and k != "role"}
        extras = {k: _clean(v) for k, v in _ordered(own).items()}
        text = formatter.line(
            time.time(), logging.getLevelName(level), formatter.role, base.name, message, extras
        )
    with handler.lock:  # type: ignore[union-attr]
        handler.take(text, level)


def _only_ours(logger: logging.Logger, handler: logging.Handler, level: int) -> bool:
    """Whether a record of `logger` at `level` would reach `handler` alone, unfiltered (the
    walk logging.Logger.callHandlers makes)."""
    reached = 0
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters:
            return False
        for other in node.handlers:
            if other is not handler:
                return False
            reached += 1
        if not node.propagate:
            break
        node = node.parent
    return reached == 1 and not handler.filters and level >= handler.level


# A follower asks the process holding lines before it to write them out with this signal.
FLUSH_SIGNAL = signal.SIGRTMIN
# How long a follower waits for them before it writes its own line anyway: a holder busy in a
# blocking call may answer late, and a follower's logging must not hang with it.
FOLLOWER_WAIT = 0.25


class HoldingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """slotd's one handler. Holding (`hold` > 0, a slot's): INFO lines wait up to `hold`
    seconds and leave together, one write per batch instead of one per settlement (each
    write wakes whatever reads the stream, journald or a container runtime: a quarter of a
    busy slot's CPU per no-op task went to its line). A WARNING or worse goes at once, after
    the lines held before it. The holder flushes before it blocks (`due_in` says when).

    Lines stay in time order across the processes a holder forks (a slot's runner, and what
    the handler forks): those follow it. A holder shows whether it holds lines in a byte of
    shared memory (written twice per batch, so the batching costs nothing more); a follower
    about to write while it does asks the holder to write them first (FLUSH_SIGNAL) and
    waits for the byte to clear, so the `continued` a slot holds comes out before the
    `page 2` its runner logs next. What a follower's children print past logging, and the
    supervisor's lines, are not ordered with a slot's held ones."""

    def __init__(self, stream: IO[str], hold: float = 0.0) -> None:
        super().__init__(stream)
        self.hold = hold
        self.held: list[str] = []
        self.since = 0.0
        self.bytes = 0
        # The holder's bytes: 1 while it holds lines; the number of its batches, mod 256.
        self.holding: mmap.mmap | None = None
        self.holder_pid = 0
        self.leader: mmap.mmap | None = None  # a follower's: the bytes of the holder it follows
        self.leader_fd: int | None = None  # a pidfd of it (the pid when there is none)
        # The batch (its number mod 256) the holder did not write when asked (stopped, or
        # busy in a blocking call): the follower's next lines do not wait for it again.
        self.late_for: int | None = None
        self.writing = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)
            return
        self.take(line, record.levelno)

    def take(self, line: str, levelno: int) -> None:
        """A formatted line: held, or written with the ones held before it."""
        if self.leader is not None and self.leader[0] and self.leader[1] != self.late_for:
            self._wait_for_leader()
        if not self.held:
            self.since = time.monotonic()
            if self.holding is not None:
                self.holding[0] = 1
        self.held.append(line)
        self.bytes += len(line)
        if (
            levelno > logging.INFO
            or self.hold <= 0
            or self.bytes >= HOLD_BYTES
            or time.monotonic() - self.since >= self.hold
        ):
            self._write()

    def _write(self) -> None:
        if self.held:
            self.writing = True  # a flush asked for by signal meanwhile would tear this one
            text = "\n".join(self.held) + "\n"
            self.held, self.bytes = [], 0
            try:
                self.stream.write(text)
                self.stream.flush()
            except Exception:  # noqa: BLE001 - a closed stderr must not take the process down
                pass
            self.writing = False
        if self.holding is not None and self.holding[0]:
            self.holding[1] = (self.holding[1] + 1) & 0xFF
            self.holding[0] = 0  # written: a follower waiting on it writes its own now

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write()

    def due_in(self) -> float | None:
        """Seconds until the held lines must go out; None when none are held."""
        if not self.held:
            return None
        return self.since + self.hold - time.monotonic()

    def lead(self) -> None:
        """This process holds lines: the processes it forks from now on follow it."""
        if self.holding is None or self.holder_pid != os.getpid():
            self.holding, self.holder_pid = mmap.mmap(-1, 2), os.getpid()
            self.leader = None
        signal.signal(FLUSH_SIGNAL, _flush_on_signal)

    def follow(self) -> None:
        """In a process forked from a holder: write after the lines it holds."""
        if self.holding is None or self.holder_pid == os.getpid():
            return
        self.leader, self.holding = self.holding, None
        try:
            self.leader_fd = os.pidfd_open(self.holder_pid)
        except (AttributeError, OSError):  # no pidfd (old kernel, seccomp): its pid, below
            self.leader_fd = None

    def _wait_for_leader(self) -> None:
        assert self.leader is not None
        try:
            if self.leader_fd is not None:
                signal.pidfd_send_signal(self.leader_fd, FLUSH_SIGNAL)
            elif os.getppid() == self.holder_pid:  # alive, so its pid is still its own
                os.kill(self.holder_pid, FLUSH_SIGNAL)
            else:
                raise ProcessLookupError
        except OSError:  # it is gone, and its lines with it
            self.leader = None
            return
        until = time.monotonic() + FOLLOWER_WAIT
        while self.leader[0]:
            if time.monotonic() >= until:
                self.late_for = self.leader[1]
                return
            time.sleep(0.0002)


def _flush_on_signal(signum: int, frame: Any) -> None:
    # Runs in the main thread between two bytecodes of whatever it was doing; a write of
    # held lines already under way clears the byte itself when it is done.
    handler = _installed
    if handler is not None and not handler.writing:
        handler.flush()


# What logging computes for every record (the caller's file and line by walking the stack,
# thread, process and asyncio task names) and slotd's formatters never print: the logging
# HOWTO's "Optimization" switches. Off in a slot (a sixth of a settlement's CPU went to
# its log line), back on in the runner it forks, whose handler's own logging may use them.
_RECORD_SWITCHES = ("logThreads", "logProcesses", "logMultiprocessing", "logAsyncioTasks")
_RECORD_DEFAULTS = {
    n: getattr(logging, n) for n in ("_srcfile", *_RECORD_SWITCHES) if hasattr(logging, n)
}


def lean_records(lean: bool) -> None:
    for name, default in _RECORD_DEFAULTS.items():
        setattr(logging, name, (None if name == "_srcfile" else False) if lean else default)


HOLD_BYTES = 32 * 1024  # well under a pipe's 64 KiB: a batch never blocks half-written
_installed: HoldingHandler | None = None


def hold(seconds: float) -> None:
    """Hold INFO lines up to `seconds` (0: every line at once) in this process. Called in a
    process forked from a holder, 0 makes it a follower (see HoldingHandler); in the main
    thread, since a holder takes FLUSH_SIGNAL."""
    if _installed is not None:
        _installed.flush()
        _installed.hold = seconds
        if seconds > 0:
            _installed.lead()
        else:
            _installed.follow()


def flush() -> None:
    """Write the held lines now: before blocking, forking or exiting."""
    if _installed is not None:
        _installed.flush()


def due_in() -> float | None:
    return _installed.due_in() if _installed is not None else None


def configure(
    fmt: str = "text",
    level: int | str = logging.INFO,
    role: str = "supervisor",
    *,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Install slotd's one handler on the root logger (replacing one installed before, so a
    forked slot can call it again with its own role) and return it."""
    if fmt not in FORMATS:
        raise ValueError(f"bad log format {fmt!r}: use text or json")
    formatter: logging.Formatter = JsonFormatter(role) if fmt == "json" else TextFormatter(role)
    global _installed
    handler = HoldingHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    setattr(handler, _MARK, True)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _MARK, False):
            root.removeHandler(old)
            old.close()
    root.addHandler(handler)
    root.setLevel(level)
    _installed = handler
    return handler
