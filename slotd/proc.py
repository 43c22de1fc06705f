"""Process plumbing shared by the supervisor, its slots and their runners: titles, parent
death signals, exit watching, and what a forked child must not touch."""

from __future__ import annotations

import ctypes
import errno
import math
import os
import pickle
import select
import signal
import time
import weakref
from collections.abc import Container
from typing import Any

import setproctitle

_PR_SET_PDEATHSIG = 1
_libc: Any = None

# Every connection slotd opens is tracked here, so a forked child can make sure it never
# uses or closes its parent's sessions (closing one would end the parent's session).
_connections: weakref.WeakSet[Any] = weakref.WeakSet()


def track(conn: Any) -> Any:
    _connections.add(conn)
    return conn


def _blind_inherited_connections() -> None:
    # Point each inherited socket at /dev/null instead of closing it: a closed descriptor
    # number could be reused by the child's own connection, and the parent's libpq object,
    # if ever finalised here, would then write its goodbye into the child's session.
    if not _connections:
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for conn in list(_connections):
            try:
                fd = conn.pgconn.socket
            except Exception:  # noqa: BLE001 - already closed in the parent
                continue
            if fd >= 0:
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    _connections.clear()


os.register_at_fork(after_in_child=_blind_inherited_connections)


_title = ""


def set_title(title: str) -> None:
    # Callers set it on every pass of their loops; the syscall is paid only for a new text.
    global _title
    if title != _title:
        _title = title
        setproctitle.setproctitle(f"slotd: {title}")


def title_is(prefix: str) -> bool:
    """Whether the title set last starts with `prefix`."""
    return _title.startswith(prefix)


def die_with_parent(sig: int, parent: int) -> None:
    """Ask the kernel to send `sig` when our parent exits (Linux), so nothing is orphaned
    by a kill -9 of the supervisor or a slot.

    `parent` is the pid the parent recorded before forking: comparing getppid() with it
    (not with 1) is what tells "my parent died before the prctl" apart from "my parent IS
    pid 1", as the supervisor is in every container."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os.kill(os.getpid(), sig)


# The signals a freshly forked child must not take with the default action before it has
# installed its own handlers: they are blocked across the fork and unblocked by the child.
FORK_BLOCKED = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


def fork_guarded() -> int:
    """os.fork() with FORK_BLOCKED blocked in the child until it calls unblock_forked():
    a SIGTERM that lands between the fork and the child's handlers waits for them instead
    of killing the child with the default action. The parent's mask is restored at once."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORK_BLOCKED)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        raise
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return pid


def unblock_forked() -> None:
    """In a child of fork_guarded(), once its handlers are installed."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORK_BLOCKED)


def reap_orphans(ours: Container[int]) -> int:
    """Reap exited children that are not in `ours`, leaving ours for their own watch.

    PID 1 inherits every orphan in its namespace (a killed runner's subprocesses, a
    double-forked helper) and must reap them, or they stay zombies for the pod's life.
    waitpid(-1) would also steal the exit statuses the slots' ChildWatch waits for, so
    peek first (WNOWAIT) and reap only a stranger. A dead slot at the head of the line
    stops the pass; its own watch reaps it and the next pass goes on."""
    reaped = 0
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid == 0 or info.si_pid in ours:
            return reaped
        try:
            os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            pass
        reaped += 1


class ChildWatch:
    """A readable descriptor that fires when a child exits (pidfd on Linux >= 5.3)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None
        self.status: int | None = None

    def fileno(self) -> int:
        if self.fd is None:
            raise OSError(errno.ENOSYS, "pidfd unavailable")
        return self.fd

    def poll(self) -> int | None:
        """The wait status once the child has exited and been reaped, else None."""
        if self.status is not None:
            return self.status
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.status = 0
            return self.status
        if pid == 0:
            return None
        self.status = status
        return status

    def wait(self, timeout: float | None) -> int | None:
        if self.status is not None:
            return self.status
        if self.fd is not None:
            select.select([self.fd], [], [], timeout)
            return self.poll()
        # No pidfd (an old kernel, a seccomp policy without pidfd_open): poll instead.
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        return status

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def describe_status(status: int | None) -> str:
    if status is None:
        return "still running"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by {name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


def send(pid: int, sig: int) -> None:
    """Signal one process that may already be gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a whole process group: a handler's subprocesses go with it."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        send(pid, sig)


def _group_and_state(pid: int) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Fields after the command's closing parenthesis: state, ppid, pgrp, ...
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[2]), fields[0].decode()


def kill_rest_of_group(attempts: int = 5) -> int:
    """SIGKILL every other live member of our process group, then reap those that are our
    children. What a runner does after an attempt that timed out or was cancelled: the
    handler's frame is gone but a subprocess it started (`Popen(...).wait()` interrupted)
    would otherwise run on beside the retry. Looks again after killing, since a member may
    fork while we look. A member that called setsid() has left the group and is not seen."""
    me, group = os.getpid(), os.getpgrp()
    killed: set[int] = set()
    for _ in range(attempts):
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            info = _group_and_state(int(entry))
            if info is not None and info[0] == group and info[1] not in ("Z", "X"):
                found.append(int(entry))
        if not found:
            break
        for pid in found:
            send(pid, signal.SIGKILL)
        killed.update(found)
    for pid in killed:  # ours to reap (the others' parents, or pid 1, reap theirs)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return len(killed)


class SelfPipe:
    """Signal handlers only record; the loop wakes on this pipe (signal.set_wakeup_fd)."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)

    def fileno(self) -> int:
        return self.r

    def drain(self) -> None:
        try:
            while os.read(self.r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        os.close(self.r)
        os.close(self.w)


class Waiter:
    """multiprocessing.connection.wait() with one poll object kept across calls.

    wait() builds a selector, registers every object and closes it again on each call: in a
    busy supervisor or slot that is once or twice per task, the supervisor's largest cost
    after unpickling (tests/bench/cpu_per_task.py --py-spy). poll() hands the kernel the
    whole fd list on every call, so what is kept here is only the registration: a changed
    list re-registers, and an fd number reused by a new object is polled as that object."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._fds: tuple[int, ...] = ()
        self._at: dict[int, list[int]] = {}

    def wait(self, objects: list[Any], timeout: float | None = None) -> list[Any]:
        fds = tuple(o if isinstance(o, int) else o.fileno() for o in objects)
        if fds != self._fds:
            self._poll = select.poll()
            self._at = {}
            for i, fd in enumerate(fds):
                if fd not in self._at:
                    self._poll.register(fd, select.POLLIN)
                self._at.setdefault(fd, []).append(i)
            self._fds = fds
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        # Any event counts as ready, as in wait(): a hang-up or an error is read as EOF.
        return [objects[i] for fd, _ in self._poll.poll(ms) for i in self._at[fd]]


def ready_now(conn: Any) -> bool:
    """conn.poll() for a multiprocessing Connection without its cost: poll() goes through
    wait() and builds a selector each time, and a reader that drains messages in a loop
    asks once per message. A bare poll(2) with a zero timeout answers the same."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def tell(conn: Any, message: Any) -> None:
    """`conn.send(message)` without multiprocessing's ForkingPickler, which copies the
    copyreg dispatch table on every send (a fifth of a runner's CPU per task): our messages
    carry plain values only, and `conn.recv()` reads them the same."""
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
