"""A slot's runner, from the slot's side: forked with the registry view it reports, replaced
only between tasks (recycled when it served enough or grew too big, reloaded on SIGHUP with
the new one started before the old one goes), killed by group (the watchdog's kill, a death),
and the ones SIGKILL did not end kept aside until they die."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import psutil

from slotd import logs, proc
from slotd.config import Settings
from slotd.outcome import CRASHED, Result
from slotd.registry import Registry
from slotd.runner import child as runner

CRASH_LOOP_FLOOR = 5.0  # a runner that dies younger than this counts toward the backoff
# SIGKILL ends any process but one in uninterruptible sleep (a hung NFS read, a stuck
# device): waiting longer than this for such a runner would hang the slot with it.
RUNNER_STOP_TIMEOUT = 10.0
BOOT_TIMEOUT = 120.0  # importing a large application can take a while


@dataclass
class Runner:
    pid: int
    conn: Connection
    watch: proc.ChildWatch
    started: float = field(default_factory=time.monotonic)
    tasks: int = 0

    def stop(self, timeout: float = RUNNER_STOP_TIMEOUT, *, polite: bool = False) -> int | None:
        """Kill the runner's group and reap it; None when it has not died within `timeout`
        (uninterruptible sleep): the caller keeps its watch and reports it stuck.

        `polite` (an idle runner: recycled, reloaded, shut down): ask it to exit first, so it
        hands over what it buffers (a tracer's queued spans; it exits with os._exit, which
        runs no atexit), then kill what is left of its group."""
        if polite and self._asked_to_exit():
            try:
                os.killpg(self.pid, signal.SIGKILL)  # what its handlers left behind
            except OSError:
                pass
        else:
            proc.kill_group(self.pid, signal.SIGKILL)
        status = self.watch.wait(timeout)
        self.conn.close()
        if status is not None:
            self.watch.close()
        return status

    def _asked_to_exit(self) -> bool:
        try:
            proc.tell(self.conn, ("exit",))
        except OSError:
            return False
        return self.watch.wait(runner.EXIT_FLUSH + 0.5) is not None


class RunnerKeeper:
    def __init__(
        self,
        number: int,
        app: str,
        registry: Registry,
        settings: Settings,
        faults: Any,
        *,
        report: Callable[..., None],
        pause: Callable[[float], None],
        close_in_child: Callable[[], None],
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.number, self.app, self.settings, self.faults = number, app, settings, faults
        self.code = registry  # the handlers the slot was forked with
        # What the current runner can run, with each type's ceiling and limits: the claim's
        # type list, its concurrency limits and the settlement's backoff. New code (a
        # reload) brings its own view.
        self.registry = registry
        self.report, self.pause, self.close_in_child, self.log = report, pause, close_in_child, log
        self.current: Runner | None = None
        self.stuck: list[Runner] = []  # killed but not dead: uninterruptible sleep
        self.crashes = 0
        self.fresh_code = False

    @property
    def pid(self) -> int | None:
        return self.current.pid if self.current is not None else None

    def spawn(self, stopping: Callable[[], bool]) -> None:
        if self.crashes:
            self.pause(min(0.1 * 2 ** (self.crashes - 1), 10.0))
        if stopping():
            return
        self.current = self._fork(self.fresh_code)
        if self.current is None:
            self.crashes += 1
            self.report("restart", "runner_boot_failed")
        else:
            # The supervisor kills this runner's group if the slot dies: it must know the
            # current one after a recycle, a reload or an idle respawn, not the last claim's.
            self.report("runner", self.current.pid)

    def may_serve_again(self) -> bool:
        """Whether the current runner may take another task without being replaced first."""
        if self.current is None:
            return False
        limit = self.settings.runner_max_tasks
        return not (limit and self.current.tasks >= limit) and not self.settings.runner_max_rss_mib

    def between_tasks(self, reload: bool, stopping: Callable[[], bool]) -> None:
        """Runner replacement happens here only, never mid-task: on SIGHUP (new code) or
        when recycling is configured and the runner has served enough or grown too big."""
        self.reap_stuck()
        current = self.current
        if current is None:
            return
        if reload:
            self._reload(current)
            return
        if not self._worn_out(current):
            return
        self.stop(current, polite=True)
        self.current = None
        self.spawn(stopping)
        self.report("restart", "runner_recycled")

    def died(self, result: Result, idle: bool = False) -> None:
        """The runner is gone, or is to be killed now (the watchdog): kill its group."""
        current = self.current
        if current is None:
            return
        status = self.stop(current)
        self.current = None
        self.report("runner", None)
        if result.kind == CRASHED:
            # Only crashes feed the backoff: a watchdog kill is the system working.
            young = time.monotonic() - current.started < CRASH_LOOP_FLOOR
            self.crashes = self.crashes + 1 if (young or idle) else 0
            result.error = f"{result.error}: {proc.describe_status(status)}"
        self.report("restart", "runner_killed" if result.kind != CRASHED else "runner_crashed")

    def stop(self, current: Runner, *, polite: bool = False) -> int | None:
        """Stop a runner; one that does not die is kept aside, reported stuck (the
        supervisor's /healthz fails, so an orchestrator replaces the replica) and reaped
        here if it ever dies."""
        status = current.stop(polite=polite)
        if status is None:
            self.log.error(
                "runner %s did not die after SIGKILL within %ss (uninterruptible sleep?)",
                current.pid,
                RUNNER_STOP_TIMEOUT,
            )
            self.stuck.append(current)
            self.report("stuck", len(self.stuck))
        return status

    def reap_stuck(self) -> None:
        if not self.stuck:
            return
        alive = [r for r in self.stuck if r.watch.poll() is None]
        if len(alive) < len(self.stuck):
            for r in self.stuck:
                if r not in alive:
                    r.watch.close()
            self.stuck = alive
            self.report("stuck", len(alive))

    def _worn_out(self, current: Runner) -> bool:
        if self.settings.runner_max_tasks and current.tasks >= self.settings.runner_max_tasks:
            return True
        if self.settings.runner_max_rss_mib:
            try:
                rss = psutil.Process(current.pid).memory_info().rss / 2**20
            except psutil.Error:
                rss = 0
            return rss > self.settings.runner_max_rss_mib
        return False

    def _reload(self, current: Runner) -> None:
        """New code: the new runner must start before the old one goes, so a broken deploy
        leaves this slot serving the code it had rather than no code at all."""
        fresh = self._fork(fresh_code=True)
        if fresh is None:
            self.log.error("reload failed: the new code does not start; keeping the old runner")
            self.report("reload_failed")
            return
        self.stop(current, polite=True)
        self.fresh_code = True
        self.current = fresh
        self.report("runner", fresh.pid)
        self.report("restart", "reload")
        self.report("reloaded")

    def _fork(self, fresh_code: bool) -> Runner | None:
        ours, theirs = socket.socketpair()
        parent = os.getpid()
        logs.flush()  # else the runner inherits the held lines and writes them again
        pid = os.fork()
        if pid == 0:  # the runner; it never returns into the slot's stack
            try:
                logs.hold(0)  # a handler's own lines go out as they are logged
                logs.lean_records(False)
                ours.close()
                self.close_in_child()
                if self.current is not None:
                    self.current.conn.close()
                    self.current.watch.close()
                registry = runner.fresh_registry(self.app) if fresh_code else self.code
                runner.serve(
                    Connection(theirs.detach()), registry, self.number, self.faults, parent=parent
                )
            except BaseException:  # noqa: BLE001 - the slot sees the EOF and backs off
                traceback.print_exc()
            finally:
                os._exit(78)
        theirs.close()
        try:
            os.setpgid(pid, pid)  # also done by the child: whoever runs first wins the race
        except OSError:
            pass
        handle = Runner(pid, Connection(ours.detach()), proc.ChildWatch(pid))
        if not handle.conn.poll(BOOT_TIMEOUT):
            handle.stop()
            self.log.error("runner did not start within %ss", BOOT_TIMEOUT)
            return None
        try:
            _, types, ceilings, limits, concurrency, rates, order = handle.conn.recv()
        except (EOFError, OSError):
            status = handle.stop()
            self.log.error("runner failed to start: %s", proc.describe_status(status))
            return None
        if fresh_code:
            self.registry = _registry_view(types, ceilings, limits, concurrency, rates, order)
        return handle


def _registry_view(
    types: list[str],
    ceilings: list[float],
    limits: list[tuple[Any, ...]],
    concurrency: dict[str, tuple[int | None, int | None]],
    rates: dict[str, tuple[Any, Any]],
    order: dict[str, Any],
) -> Registry:
    """What the runner (possibly with new code) can run, with each type's ceiling and
    limits: the claim's type list, its concurrency limits and rates, and the settlement's
    backoff."""

    def span(seconds: float | None) -> timedelta | None:
        return None if seconds is None else timedelta(seconds=seconds)

    view = Registry()
    for limit, (most, per_group, rate) in order["limits"].items():
        view.limit(limit, max_running=most, max_running_per_group=per_group, rate=rate)
    for name, ceiling, (attempts, base, cap) in zip(types, ceilings, limits, strict=True):
        most, per_group = concurrency.get(name, (None, None))
        rate, rate_per_group = rates.get(name, (None, None))
        view.register(
            name,
            _unreachable,
            ceiling=timedelta(seconds=ceiling),
            max_attempts=attempts,
            backoff_base=span(base),
            backoff_cap=span(cap),
            max_running=most,
            max_running_per_group=per_group,
            rate=rate,
            rate_per_group=rate_per_group,
            **order["handlers"].get(name, {}),
        )
    return view


def _unreachable(task: Any, ctx: Any) -> None:
    raise AssertionError("the slot never runs handlers itself")
