"""Drive a real `slotd run` from tests: a child process in its own session, its log lines
awaited as events, and every process it ever made reaped at the end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent

# Handlers in tests/apps/runtime.py record each start and end here, on their own connection.
EXECUTIONS = """
CREATE TABLE executions (
    task_id bigint, attempt int, phase text, pid int, note text,
    at timestamptz DEFAULT clock_timestamp()
)"""

FAST = {
    "SLOTD_POLL_INTERVAL": "1s",
    "SLOTD_LEASE_MARGIN": "3s",
    "SLOTD_KILL_GRACE": "500ms",
    "SLOTD_SHUTDOWN_GRACE": "3s",
    "SLOTD_BACKOFF_BASE": "30s",
    "SLOTD_BACKOFF_CAP": "60s",
    "SLOTD_METRICS_ADDR": "off",
}


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Await a state of the world (a row, a process) by looking at it; fails loudly."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def gone(pid: int) -> bool:
    """The process has exited (a zombie awaiting its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Daemon:
    def __init__(
        self,
        db_url: str,
        *,
        slots: int = 2,
        app: str = "tests.apps.runtime:registry",
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.cwd = cwd  # another release's tree: `python -m` puts the cwd first on sys.path
        self.env = {
            **os.environ,
            **FAST,
            "SLOTD_DATABASE_URL": db_url,
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        self.cmd = [sys.executable, "-m", "slotd", "run", "--app", app, "--slots", str(slots)]
        self.cmd += args or []
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None
        self.known: set[int] = set()

    def start(self, wait_ready: bool = True) -> Daemon:
        self.proc = subprocess.Popen(
            self.cmd,
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        if wait_ready:
            self.wait_line(r"serving ")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_line(self, pattern: str, timeout: float = 30.0, after: int = 0) -> str:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[after:]:
                    if regex.search(line):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (
                    self.proc
                    and self.proc.poll() is not None
                    and not any(regex.search(x) for x in self.lines[after:])
                ):
                    if remaining > 0:
                        self._cond.wait(0.2)  # let the reader drain what is left
                        if any(regex.search(x) for x in self.lines[after:]):
                            continue
                    log = "\n".join(self.lines[-40:])
                    raise AssertionError(f"no log line matching {pattern!r}; last lines:\n{log}")
                self._cond.wait(remaining)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def tree(self) -> list[psutil.Process]:
        try:
            found = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.known.update(p.pid for p in found)
        return found

    def titled(self, fragment: str) -> list[psutil.Process]:
        out = []
        for p in self.tree():
            try:
                if fragment in " ".join(p.cmdline()):
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc is None:
            return
        self.tree()
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        for pid in self.known:  # runners live in their own process groups
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
