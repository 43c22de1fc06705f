"""The runner: a child of its slot, in its own process group, that runs handler after handler
(imports, caches and the handler's own connections stay warm) and answers its slot.

It opens no queue connection. The queue writes a handler makes, advance_cursor and a durable
step's value (ctx.step), go to the slot over the pipe; the slot performs them, fenced, and
answers before the handler goes on."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import signal
import sys
import threading
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from slotd import integrations, proc
from slotd.errors import Cancelled, DeadlineExceeded
from slotd.outcome import DONE, ERROR, SHUTDOWN, Result, past
from slotd.registry import Handler, Registry, load_registry
from slotd.runner import aio
from slotd.runner.processor import execute
from slotd.task import Context, Task

if TYPE_CHECKING:
    from slotd.dev.faults import Injector
    from slotd.repository import Claimed

# The slot's signals to its runner.
CANCEL = signal.SIGUSR1  # shutdown: ctx.cancelled becomes true
INTERRUPT = signal.SIGUSR2  # deadline: raise DeadlineExceeded in the handler's frame


INTERRUPTED = "interrupted at the deadline by the slot's watchdog"
# What the result says when the runner must not serve another task: something the attempt
# started (a thread, an asyncio task deaf to its cancel) is still running. The slot kills
# the runner's group before it settles the attempt, and forks a fresh one.
RECYCLE = "recycle"
# How long a timed-out or cancelled attempt's asyncio tasks get to end once cancelled: well
# inside the kill grace (5 s by default), so the runner is replaced by its own word first.
LEFTOVER_GRACE = 1.0

log = logging.getLogger("slotd.runner")
# Asked to exit between tasks, a runner gives its integrations this long to hand over
# what they buffer (a BatchSpanProcessor's spans); the slot waits a little longer.
EXIT_FLUSH = 2.0


class _State:
    cancelled = False
    armed = False
    # An async cursor or step write was cancelled before its answer came: which one.
    owed: str | None = None
    entered = False  # the handler's own code has started, this attempt


def _on_cancel(signum: int, frame: Any) -> None:
    _State.cancelled = True
    # An async handler is cancelled at its next await; a sync one sees ctx.cancelled.
    aio.current().cancel(Cancelled("the replica is shutting down"))


def _on_interrupt(signum: int, frame: Any) -> None:
    if _State.armed:
        _State.armed = False
        handlers = aio.current()
        if handlers.cancel(DeadlineExceeded(INTERRUPTED)) or handlers.returned:
            return  # an async handler: cancelled at its await, or it has returned
        if not _returned(frame):
            raise DeadlineExceeded(INTERRUPTED)


def _returned(frame: Any) -> bool:
    """Whether a sync handler has returned: then the deadline interrupt is ignored, since
    its result, built a moment later, is what the attempt did (a done task raised into here
    would be a failure, and would run again). Not yet entered, or its frame (`_Enter`'s)
    still below the one interrupted: it is running, and is interrupted.

    `_Enter`'s own frame on top is the moment right after the handler returned: between
    setting `entered` and calling the handler no bytecode checks for signals."""
    if not _State.entered:
        return False
    if frame is not None and frame.f_code is _ENTER_CODE:
        return True
    while frame is not None:
        if frame.f_code is _ENTER_CODE:
            return False
        frame = frame.f_back
    return True


class _Enter:
    """A sync handler, marking `entered` as its first act (see _returned)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)  # its name and module, for whoever reports it

    def __call__(self, task: Task, ctx: Context) -> Any:
        _State.entered = True
        return self.fn(task, ctx)


_ENTER_CODE = _Enter.__call__.__code__


def _entering(handler: Handler) -> Handler:
    # An async handler needs no mark: its loop knows whether its call has ended.
    return handler if handler.is_async else dataclasses.replace(handler, fn=_Enter(handler.fn))


def fresh_registry(app: str) -> Registry:
    """Import the application anew (SIGHUP: new code), forgetting the modules it came from."""
    module = app.partition(":")[0]
    # The application's own package, never slotd itself: the runner's code stays loaded.
    prefix = module if module.startswith("slotd.") else module.split(".")[0]
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]
    return load_registry(app)


def serve(
    conn: Connection,
    registry: Registry,
    slot_no: int,
    faults: Injector | None = None,
    *,
    parent: int,
) -> None:
    """The runner's loop; never returns (the process ends with os._exit). `parent` is
    the slot's pid, recorded before the fork."""
    os.setpgid(0, 0)
    proc.die_with_parent(signal.SIGKILL, parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(CANCEL, _on_cancel)
    signal.signal(INTERRUPT, _on_interrupt)
    signal.set_wakeup_fd(-1)
    # One title for the runner's life: its slot's title names the task it runs (a title
    # per task was two system calls per task, prctl).
    proc.set_title(f"runner {slot_no}")
    if faults is not None:  # counted by the supervisor, by way of the slot
        faults.on_fault = lambda kind: conn.send(("fault", kind))
    registry.runner_started()  # after the fork: the application's per-process set-up
    hello = (registry.types, registry.ceilings_seconds, registry.limits)
    limits = (registry.concurrency_limits, registry.rates, registry.order_options())
    conn.send(("hello", *hello, *limits))
    code = 0
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "exit":  # stopped between tasks (slot.Runner.stop)
                integrations.runner_exit(EXIT_FLUSH)
                break
            _, fields, deadline_ts, stale_cancel, steps = message
            task, deadline = _task(fields), datetime.fromtimestamp(deadline_ts, UTC)
            if stale_cancel:  # a cancel meant for the task before this one
                _State.cancelled = False
            result = _run(conn, registry, task, deadline, slot_no, faults, steps)
            proc.tell(conn, ("result", *result.fields()))
    except BaseException:  # noqa: BLE001 - whatever happens, the slot sees a dead runner
        code = 70
    finally:
        os._exit(code)


def run_message(
    task: Task, deadline: datetime, stale_cancel: bool, steps: list[Any] | None = None
) -> tuple[Any, ...]:
    """The slot's "run": plain values, cheaper to pickle than a Task and datetimes (twice
    per task, one way each); `_task` rebuilds the Task in the runner. `steps`: the task's
    stored durable steps, as its claim read them."""
    fields = (
        task.id,
        task.type,
        task.payload,
        task.attempt,
        task.key,
        task.run_at.timestamp(),
        task.trace_context,
        task.parent_results or None,
    )
    return ("run", fields, deadline.timestamp(), stale_cancel, steps)


def claimed_message(claimed: Claimed, deadline: datetime, stale_cancel: bool) -> tuple[Any, ...]:
    """`run_message` for a claim, straight from its fields: the slot sends one per task, and
    building the Task first (to take it apart again) was a tenth of the slot's send."""
    parents = claimed.parent_results
    fields = (
        claimed.id,
        claimed.task_type,
        claimed.payload,
        claimed.attempt,
        claimed.key,
        claimed.run_at.timestamp(),
        claimed.trace_context,
        {int(k): v for k, v in parents.items()} if parents else None,
    )
    return ("run", fields, deadline.timestamp(), stale_cancel, claimed.steps)


def _task(fields: tuple[Any, ...]) -> Task:
    task_id, task_type, payload, attempt, key, run_at, trace, parents = fields
    when = datetime.fromtimestamp(run_at, UTC)
    return Task(
        task_id,
        task_type,
        payload,
        attempt,
        key,
        when,
        trace_context=trace,
        parent_results=parents or {},
    )


def _run(
    conn: Connection,
    registry: Registry,
    task: Task,
    deadline: datetime,
    slot_no: int,
    faults: Injector | None,
    steps: list[Any] | None = None,
) -> Result:
    handler = _entered_handlers.get(task.type)
    if handler is None:
        found = registry.get(task.type)
        if found is None:
            return Result(ERROR, f"no handler registered for {task.type!r} in this runner")
        handler = _entered_handlers[task.type] = _entering(found)

    def exchange(message: tuple[Any, ...]) -> tuple[Any, ...]:
        # The exchange with the slot must not be torn by the deadline interrupt: a pending
        # interrupt is delivered right after, in the handler's frame.
        signal.pthread_sigmask(signal.SIG_BLOCK, {INTERRUPT})
        try:
            conn.send(message)
            reply = conn.recv()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {INTERRUPT})
        _reply(message[0], reply)
        return tuple(reply)

    def ask(message: tuple[Any, ...]) -> bool:
        return bool(exchange(message)[1])

    def wait(i: int, name: str, event: str | None, for_s: float | None) -> tuple[str, Any]:
        reply = exchange(("wait", i, name, event, for_s))  # ("wait_ok", verdict, error, data)
        return reply[1], reply[3]

    async def wait_async(
        i: int, name: str, event: str | None, for_s: float | None
    ) -> tuple[str, Any]:
        # Brief (one statement, or the event's lock): the loop waits for the answer.
        return wait(i, name, event, for_s)

    async def ask_async(message: tuple[Any, ...]) -> bool:
        # The loop keeps running while the slot writes. A cancel meanwhile leaves the
        # answer owed; it is read before the result goes back, so the pipe stays in step.
        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        conn.send(message)
        _State.owed = message[0]
        loop.add_reader(conn.fileno(), lambda: answered.done() or answered.set_result(None))
        try:
            await answered
        finally:
            loop.remove_reader(conn.fileno())
        _State.owed = None
        return _reply(message[0], conn.recv())

    cancelled = lambda: _State.cancelled  # noqa: E731
    ctx = Context(
        task,
        deadline,
        lambda body: ask(("cursor", body)),
        cancelled,
        write_cursor_async=lambda body: ask_async(("cursor", body)),
        steps=steps,
        write_step=lambda i, name, text: ask(("step", i, name, text)),
        write_step_async=lambda i, name, text: ask_async(("step", i, name, text)),
        write_wait=wait,
        write_wait_async=wait_async,
    )
    threads = _threads_before()
    # Not cleared here: a cancel that lands while the task is being received stays (the
    # slot clears a stale one with the "run" message; see slot.Slot._watch).
    _State.entered = False
    _State.armed = True
    try:
        result = execute(handler, ctx, faults.before_handler if faults else None)
    except DeadlineExceeded as exc:  # landed before execute's own try: never started
        result = Result(ERROR, str(exc), ctx.advanced, True)
    finally:
        _State.armed = False
    if _State.owed is not None:
        owed, _State.owed = _State.owed, None
        answer = bool(conn.recv()[1])
        result.advanced = result.advanced or (owed == "cursor" and answer)
    result.past_deadline = result.past_deadline or past(deadline)
    timed_out = result.past_deadline and result.kind != DONE
    ended = timed_out or _State.cancelled or result.kind == SHUTDOWN
    # Nothing an attempt that timed out or was cancelled started may outlive it: the retry
    # would run beside it. Its asyncio tasks are cancelled and awaited, its processes
    # killed, and a thread it started still alive ends with the runner, replaced by the
    # slot before it settles (a thread cannot be stopped from outside). A handler that
    # succeeded keeps what it started: a pool's tasks and threads serve the next attempts.
    all_ended = aio.current().end_attempt(ended, LEFTOVER_GRACE)
    if ended:
        proc.kill_rest_of_group()
        alive = [t.name for t in threading.enumerate() if t not in threads and t.is_alive()]
        if alive or not all_ended:
            what = f"threads {', '.join(alive)}" if alive else "asyncio tasks deaf to cancel"
            log.warning(
                "task %s#%s attempt %s ended, but %s it started still run: replacing its runner",
                task.type,
                task.id,
                task.attempt,
                what,
                extra={"task_id": task.id, "task_type": task.type, "attempt": task.attempt},
            )
            result.extra[RECYCLE] = what
    _State.cancelled = False  # this task's; one that arrives after this is the slot's to clear
    return result


_entered_handlers: dict[str, Handler] = {}  # by type, in this runner's life
_threads: tuple[int, list[threading.Thread]] = (0, [])


def _threads_before() -> list[threading.Thread]:
    """The threads alive before an attempt, which are not its own. Listed again only when
    their number changed (listing them on every task costs more than the rest of the
    check); the same number with one ended and one started makes the new one look like the
    attempt's, which costs a runner replacement at worst, never a thread left running."""
    global _threads
    count = threading.active_count()
    if count != _threads[0]:
        _threads = (count, threading.enumerate())
    return _threads[1]


def _reply(what: str, reply: tuple[Any, ...]) -> bool:
    """The slot's answer: written or refused, or the database's error, which is the
    handler's to see (raised in its frame), never the slot's."""
    if len(reply) > 2 and reply[2]:
        raise ValueError(f"{what} not stored: {reply[2]}")
    return bool(reply[1])
