"""Handlers that misbehave on purpose, for the runtime tests. Each records its start and end
in `executions` on its own connection, as an application's handler would write its own data."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg

import slotd

registry = slotd.Registry()
SHORT = timedelta(seconds=1)


def _record(task: slotd.Task, phase: str, **extra: Any) -> None:
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (%s,%s,%s,%s,%s)",
            (task.id, task.attempt, phase, os.getpid(), extra.get("note")),
        )


@registry.handler("rt.noop", ceiling=timedelta(seconds=30))
def noop(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    _record(task, "end")


_tally_conn: list[psycopg.Connection[Any]] = []  # one per runner: a short handler (#43)


@registry.handler("rt.tally", ceiling=timedelta(seconds=30))
def tally(task: slotd.Task, ctx: slotd.Context) -> None:
    """A short handler (one statement on a connection its runner keeps) that records the
    lease it runs under, as the database has it: the claim's stamp, its token and the
    lease's length. {"stop_in_batch": "kill" | "term"}: see below."""
    if not _tally_conn:
        _tally_conn.append(psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True))
    _tally_conn[0].execute(
        "INSERT INTO executions (task_id, attempt, phase, pid, note)"
        " SELECT t.id, %s, 'start', %s, concat_ws('|', t.last_attempted_at, t.lease_token,"
        " extract(epoch FROM t.lease_expires_at - t.last_attempted_at))"
        " FROM slotd_tasks t WHERE t.id = %s",
        (task.attempt, os.getpid(), task.id),
    )
    stop = task.payload.get("stop_in_batch")  # "kill" its slot, or "term" its replica
    if stop and task.attempt == 1:
        # The first such task that runs while its slot holds a prefetched batch (rows leased
        # that never started) records them, then stops its slot or replica and hangs.
        held = (
            _tally_conn[0]
            .execute(
                "INSERT INTO executions (task_id, attempt, phase, pid, note)"
                " SELECT %s, 1, 'blocked', %s, string_agg(t.id::text, ',')"
                " FROM slotd_tasks t WHERE t.lease_token IS NOT NULL AND t.id <> %s"
                " AND NOT EXISTS (SELECT 1 FROM executions e WHERE e.task_id = t.id)"
                " HAVING count(*) > 0 AND NOT EXISTS"
                " (SELECT 1 FROM executions b WHERE b.phase = 'blocked') RETURNING 1",
                (task.id, os.getpid(), task.id),
            )
            .fetchone()
        )
        if held:
            slot = os.getppid()
            if stop == "kill":
                os.kill(slot, signal.SIGKILL)
            else:
                with open(f"/proc/{slot}/stat") as stat:  # the slot's parent
                    supervisor = int(stat.read().rsplit(")", 1)[1].split()[1])
                os.kill(supervisor, signal.SIGTERM)
            time.sleep(3600)


@registry.handler("rt.quick", ceiling=timedelta(seconds=30))
def quick(task: slotd.Task, ctx: slotd.Context) -> None:
    pass


@registry.handler("rt.spin", ceiling=SHORT)
def spin(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    while True:  # ignores its context entirely
        pass


@registry.handler("rt.sleep", ceiling=SHORT)
def sleep(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    time.sleep(3600)


@registry.handler("rt.recv", ceiling=SHORT)
def recv(task: slotd.Task, ctx: slotd.Context) -> None:
    a, b = socket.socketpair()
    _record(task, "start")
    a.recv(1)


@registry.handler("rt.gil", ceiling=SHORT)
def gil(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    # One C call that never releases the GIL: no Python signal handler can run inside it.
    sum(range(10**14))


@registry.handler("rt.grandchild", ceiling=SHORT)
def grandchild(task: slotd.Task, ctx: slotd.Context) -> None:
    child = subprocess.Popen(["sleep", "3600"])
    _record(task, "start", note=str(child.pid))
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # dodge the interrupt: only a kill ends it
    child.wait()


@registry.handler("rt.crash", ceiling=timedelta(seconds=30))
def crash(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    os._exit(3)


@registry.handler("rt.segv", ceiling=timedelta(seconds=30))
def segv(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    os.kill(os.getpid(), signal.SIGSEGV)


@registry.handler("rt.polite", ceiling=timedelta(seconds=60))
def polite(task: slotd.Task, ctx: slotd.Context) -> None:
    """Runs until cancelled; checks its context like a well-behaved handler."""
    _record(task, "start")
    while not ctx.cancelled:
        time.sleep(0.02)
    _record(task, "end", note="cancelled")
    ctx.check()


@registry.handler("rt.stubborn_long", ceiling=timedelta(seconds=60))
def stubborn_long(task: slotd.Task, ctx: slotd.Context) -> None:
    """Ignores shutdown too: only the shutdown grace's kill ends it."""
    _record(task, "start")
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    time.sleep(3600)


@registry.handler("rt.sliced", ceiling=timedelta(seconds=30))
def sliced(task: slotd.Task, ctx: slotd.Context) -> bool:
    cursor = task.payload.get("cursor", 0)
    _record(task, "start", note=str(cursor))
    if cursor >= 3:
        return True
    ctx.advance_cursor({"cursor": cursor + 1})
    return False


@registry.handler("rt.version", ceiling=timedelta(seconds=30))
def version(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start", note=os.environ.get("RT_VERSION_NOTE", "v1"))


@registry.handler("rt.work", ceiling=timedelta(seconds=60))
def work(task: slotd.Task, ctx: slotd.Context) -> None:
    """A cooperative task of some length: stops when its replica shuts down."""
    _record(task, "start")
    until = time.monotonic() + task.payload.get("ms", 200) / 1000
    while time.monotonic() < until:
        ctx.check()
        time.sleep(0.01)
    _record(task, "end", note="done")


@registry.handler("rt.orphans", ceiling=timedelta(seconds=30))
def orphans(task: slotd.Task, ctx: slotd.Context) -> None:
    """Leaves a double-forked helper behind: the shell exits at once, so its `sleep` is
    re-parented to the namespace's pid 1 and, when it exits, is that process's to reap."""
    subprocess.run(["sh", "-c", "sleep 0.3 & exit 0"], check=True)
    _record(task, "start")


# async def handlers: the runner's one event loop runs them.


async def _arecord(task: slotd.Task, phase: str, note: str | None = None) -> None:
    url = os.environ["SLOTD_DATABASE_URL"]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (%s,%s,%s,%s,%s)",
            (task.id, task.attempt, phase, os.getpid(), note),
        )


@registry.handler("rt.async_noop", ceiling=timedelta(seconds=30))
async def async_noop(task: slotd.Task, ctx: slotd.Context) -> None:
    # The loop's identity: the same loop serves every task of one runner.
    await _arecord(task, "start", note=str(id(asyncio.get_running_loop())))
    await asyncio.sleep(0)
    await _arecord(task, "end")


@registry.handler("rt.async_sleep", ceiling=SHORT)
async def async_sleep(task: slotd.Task, ctx: slotd.Context) -> None:
    await _arecord(task, "start")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await _arecord(task, "cancelled", note=str(ctx.cancelled))
        raise


@registry.handler("rt.async_block", ceiling=SHORT)
async def async_block(task: slotd.Task, ctx: slotd.Context) -> None:
    await _arecord(task, "start")
    time.sleep(3600)  # a blocking call: the loop never gets control back


@registry.handler("rt.async_polite", ceiling=timedelta(seconds=60))
async def async_polite(task: slotd.Task, ctx: slotd.Context) -> None:
    try:
        # Inside the try: the test sees the start row as soon as it commits, and its SIGTERM
        # can land while this call is still closing its connection.
        await _arecord(task, "start")
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await _arecord(task, "end", note=f"cancelled {ctx.cancelled}")
        raise


@registry.handler("rt.async_sliced", ceiling=timedelta(seconds=30))
async def async_sliced(task: slotd.Task, ctx: slotd.Context) -> bool:
    cursor = task.payload.get("cursor", 0)
    await _arecord(task, "start", note=str(cursor))
    if cursor >= 3:
        return True
    await ctx.advance_cursor_async({"cursor": cursor + 1})
    return False


async def _never_awaited() -> None:
    raise AssertionError("a coroutine a sync handler returned must never run")


@registry.handler("rt.returns_coroutine", ceiling=timedelta(seconds=30))
def returns_coroutine(task: slotd.Task, ctx: slotd.Context) -> Any:
    _record(task, "start")
    return _never_awaited()


# Bad data: each is the handler's error, never its slot's.


@registry.handler("rt.bad_cursor", ceiling=timedelta(seconds=30))
def bad_cursor(task: slotd.Task, ctx: slotd.Context) -> bool:
    _record(task, "start")
    kind = task.payload.get("kind")
    if kind == "datetime":
        ctx.advance_cursor({"at": datetime.now()})
    elif kind == "nul":
        ctx.advance_cursor({"name": "a\x00b"})
    elif kind == "refused":
        ctx.advance_cursor({"refuse": True})  # a trigger in the test refuses this one
    return False


@registry.handler("rt.popen_wait", ceiling=SHORT)
def popen_wait(task: slotd.Task, ctx: slotd.Context) -> None:
    """Interruptible (it waits in Python), so the runner survives its deadline; the `sleep`
    it started must not."""
    child = subprocess.Popen(["sleep", "3600"])
    _record(task, "start", note=str(child.pid))
    child.wait()


@registry.handler("rt.popen_polite", ceiling=timedelta(seconds=60))
def popen_polite(task: slotd.Task, ctx: slotd.Context) -> None:
    """Starts a subprocess, then stops when cancelled, leaving it behind."""
    child = subprocess.Popen(["sleep", "3600"])
    _record(task, "start", note=str(child.pid))
    while not ctx.cancelled:
        time.sleep(0.02)
    ctx.check()


# Limits the worker owns.


@registry.handler("rt.fail", ceiling=timedelta(seconds=30))
def fail(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    raise RuntimeError(f"attempt {task.attempt} failed")


@registry.handler(
    "rt.fail_limited",
    ceiling=timedelta(seconds=30),
    max_attempts=2,
    backoff_base=timedelta(milliseconds=10),
    backoff_cap=timedelta(milliseconds=20),
)
def fail_limited(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    raise RuntimeError(f"attempt {task.attempt} failed")


def _runner_fork_probe() -> None:
    """RT_RUNNER_FORK_PROBE=1: a runner, as it is forked, records whether its slot had
    already settled the task before it (no row leased) or not (waiting up to 5 s)."""
    import setproctitle

    if not setproctitle.getproctitle().startswith("slotd: slot"):
        return  # a slot forked by the supervisor, or a handler's own fork
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        until = time.monotonic() + 5
        leased = True
        while leased and time.monotonic() < until:
            query = "SELECT count(*) FROM slotd_tasks WHERE lease_token IS NOT NULL"
            leased = conn.execute(query).fetchone() != (0,)
            time.sleep(0.05) if leased else None
        conn.execute(
            "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (0,0,%s,%s,%s)",
            ("runner_boot", os.getpid(), "leased" if leased else "settled"),
        )


if os.environ.get("RT_RUNNER_FORK_PROBE"):
    os.register_at_fork(after_in_child=_runner_fork_probe)


@registry.handler("rt.die_after", ceiling=timedelta(seconds=30))
def die_after(task: slotd.Task, ctx: slotd.Context) -> None:
    """Returns, and its runner dies 0.3 s later, once the test holds the row locked (so the
    slot's settlement waits and the next task goes to a dead runner)."""
    _record(task, "start")
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        until = time.monotonic() + 20
        while time.monotonic() < until:
            marker = "SELECT 1 FROM executions WHERE task_id = %s AND phase = 'locked'"
            if conn.execute(marker, (task.id,)).fetchone():
                break
            time.sleep(0.02)
    threading.Timer(0.3, os._exit, args=(0,)).start()


@registry.handler("rt.loud_error", ceiling=timedelta(seconds=30))
def loud_error(task: slotd.Task, ctx: slotd.Context) -> None:
    _record(task, "start")
    raise RuntimeError("nul\x00here " + "x" * 50_000 + " lone \ud800 surrogate, the end")


@registry.handler("rt.stuck_continue", ceiling=timedelta(seconds=30))
def stuck_continue(task: slotd.Task, ctx: slotd.Context) -> bool:
    _record(task, "start")
    return False  # "continue", having saved nothing


@registry.handler("rt.flaky", ceiling=timedelta(seconds=30))
def flaky(task: slotd.Task, ctx: slotd.Context) -> None:
    """Fails its attempts up to payload["fail_until"], then succeeds; each attempt recorded,
    so a test can see every run of a task in order and check that none overlap."""
    _record(task, "start")
    if task.attempt <= task.payload.get("fail_until", 0):
        _record(task, "fail")
        raise RuntimeError(f"planned failure on attempt {task.attempt}")
    _record(task, "end")


# What an attempt leaves running: its own background work, and a handler's module-level pools.


def _tick_forever(task_id: int, phase: str, every: float = 0.02) -> None:
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        while True:
            conn.execute(
                "INSERT INTO executions (task_id, attempt, phase, pid) VALUES (%s, 0, %s, %s)",
                (task_id, phase, os.getpid()),
            )
            time.sleep(every)


@registry.handler("rt.thread_ticker", ceiling=SHORT)
def thread_ticker(task: slotd.Task, ctx: slotd.Context) -> None:
    """Starts a thread that writes for ever, then waits past its deadline."""
    threading.Thread(target=_tick_forever, args=(task.id, "tick"), daemon=True).start()
    _record(task, "start")
    time.sleep(3600)


@registry.handler("rt.async_ticker", ceiling=SHORT)
async def async_ticker(task: slotd.Task, ctx: slotd.Context) -> None:
    """Starts an asyncio task that writes for ever (a tick per loop turn of 20 ms), then
    waits past its deadline."""

    async def tick() -> None:
        with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
            sql = "INSERT INTO executions (task_id, attempt, phase, pid) VALUES (%s, 0, %s, %s)"
            try:
                while True:
                    conn.execute(sql, (task.id, "tick", os.getpid()))
                    await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                conn.execute(sql, (task.id, "ticker_cancelled", os.getpid()))
                raise

    asyncio.get_running_loop().create_task(tick())
    await _arecord(task, "start")
    await asyncio.sleep(3600)


# The same, for an operator's cancel to end rather than its deadline.
registry.register("rt.async_ticker_long", async_ticker, ceiling=timedelta(seconds=60))


@registry.handler("rt.async_nap", ceiling=timedelta(seconds=30))
async def async_nap(task: slotd.Task, ctx: slotd.Context) -> None:
    """Gives the loop to whatever else runs on it for a while."""
    await _arecord(task, "start")
    await asyncio.sleep(task.payload.get("seconds", 0.5))
    await _arecord(task, "end")


_pool: Any = None
_executor: Any = None
_beats = 0


async def _heartbeat() -> None:
    global _beats
    while True:
        _beats += 1
        await asyncio.sleep(0.005)


@registry.handler("rt.async_pooled", ceiling=timedelta(seconds=30))
async def async_pooled(task: slotd.Task, ctx: slotd.Context) -> None:
    """Keeps a connection pool, a thread pool and a background task at module level, made in
    the first attempt that needs them (as an application's handler would): each attempt
    notes which pool connection and worker thread served it and whether the heartbeat the
    first one started still beats."""
    global _pool, _executor
    from concurrent.futures import ThreadPoolExecutor

    from psycopg_pool import AsyncConnectionPool

    if _pool is None:
        url = os.environ["SLOTD_DATABASE_URL"]
        _pool = AsyncConnectionPool(url, min_size=1, max_size=1, open=False)
        await _pool.open(wait=True)
        _executor = ThreadPoolExecutor(1)
        asyncio.get_running_loop().create_task(_heartbeat())
    before = _beats
    await asyncio.sleep(0.05)
    beating = _beats > before
    thread = await asyncio.get_running_loop().run_in_executor(_executor, threading.get_ident)
    async with _pool.connection() as conn:
        backend = conn.info.backend_pid
        await conn.execute(
            "INSERT INTO executions (task_id, attempt, phase, pid, note) VALUES (%s,%s,%s,%s,%s)",
            (task.id, task.attempt, "start", os.getpid(), f"{backend} {thread} {beating}"),
        )


class _SlowToInspect:
    """A return value whose inspection outlasts the deadline: the runner looks at what a
    handler returned (is it awaitable?) before it builds the result, so the slot's deadline
    interrupt lands in that window, after the handler returned. Waits for the interrupt to
    have arrived (the runner disarms it), records that, and lets the inspection finish."""

    def __init__(self, task: slotd.Task) -> None:
        self.task, self.waited = task, False

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: PLE0307 - isinstance() asks for it
        if not self.waited:
            self.waited = True
            from slotd.runner import child as runner

            until = time.monotonic() + 20
            while runner._State.armed and time.monotonic() < until:
                time.sleep(0.005)
            _record(self.task, "interrupted_after_return", note=str(not runner._State.armed))
        return _SlowToInspect


@registry.handler("rt.slow_return", ceiling=SHORT)
def slow_return(task: slotd.Task, ctx: slotd.Context) -> Any:
    _record(task, "start")
    return _SlowToInspect(task)


@registry.handler("rt.logged_pages", ceiling=timedelta(seconds=30))
def logged_pages(task: slotd.Task, ctx: slotd.Context) -> bool:
    """A sliced handler that logs each page it works on, as the README's would."""
    cursor = task.payload.get("cursor", 0)
    logging.getLogger("tests.pages").info("task %s page %s", task.id, cursor)
    if cursor >= 3:
        return True
    ctx.advance_cursor({"cursor": cursor + 1})
    return False
