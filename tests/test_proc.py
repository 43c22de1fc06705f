"""Process plumbing that the PID-1 shape depends on, pinned on real forks."""

from __future__ import annotations

import os
import signal

from slotd import proc


def _child(code: int) -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(code)
    return pid


def _until_exited(pid: int) -> None:
    # waitid with WNOWAIT peeks without reaping: the status stays for the real waiter.
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT) is None:
        pass


def test_reaping_orphans_leaves_the_exit_status_of_our_own_children() -> None:
    stranger = _child(3)
    ours = _child(7)
    _until_exited(stranger)
    _until_exited(ours)
    assert proc.reap_orphans({ours}) == 1
    # The stranger is gone; ours is still waiting, with its status, for its ChildWatch.
    status = proc.ChildWatch(ours).poll()
    assert status is not None and os.waitstatus_to_exitcode(status) == 7
    assert proc.reap_orphans(set()) == 0  # nothing left but what ChildWatch just reaped


def test_a_child_of_pid_1_is_not_mistaken_for_an_orphan() -> None:
    # The check compares with the parent recorded before the fork, so a parent that is
    # pid 1 (every container) and a live parent elsewhere are told apart from a dead one.
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            proc.die_with_parent(signal.SIGKILL, parent)
            proc.die_with_parent(signal.SIGKILL, os.getppid())
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    pid = os.fork()
    if pid == 0:
        try:
            proc.die_with_parent(signal.SIGKILL, parent + 1)  # "my parent already died"
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_waiter_answers_as_multiprocessing_wait_across_changing_lists() -> None:
    from multiprocessing import Pipe

    waiter = proc.Waiter()
    a_in, a_out = Pipe(duplex=False)
    b_in, b_out = Pipe(duplex=False)
    assert waiter.wait([a_in, b_in], timeout=0) == []
    b_out.send("x")
    assert waiter.wait([a_in, b_in], timeout=5) == [b_in]
    assert waiter.wait([a_in], timeout=0) == []  # a smaller list: b is no longer watched
    a_out.send("y")
    assert set(map(id, waiter.wait([b_in, a_in], timeout=5))) == {id(a_in), id(b_in)}
    a_in.recv(), b_in.recv()
    r, w = os.pipe()  # a raw fd, as the supervisor watches its LISTEN socket
    os.close(w)  # the writer's end closed: an EOF is ready, as in wait()
    assert waiter.wait([a_in, r], timeout=5) == [r]
    os.close(r)


def test_ready_now_is_connection_poll() -> None:
    from multiprocessing import Pipe

    reader, writer = Pipe(duplex=False)
    assert not proc.ready_now(reader) and not reader.poll()
    writer.send(("settled", 1))
    assert proc.ready_now(reader) and reader.poll()
    reader.recv()
    assert not proc.ready_now(reader)
    writer.close()  # EOF is ready, as for poll(): the reader's recv() then raises EOFError
    assert proc.ready_now(reader) and reader.poll()
