"""sd_notify against real unix datagram sockets, as systemd's manager would receive it."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slotd.supervisor.sdnotify import notify, watchdog_interval


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify.sock")
    sock.bind(address)
    # The datagram is already queued when notify() returns, so a timeout here only bounds a
    # failing test; it is not used to wait for anything.
    sock.settimeout(5)
    with sock:
        yield sock, address


@pytest.fixture
def abstract_socket() -> Iterator[tuple[socket.socket, str]]:
    name = f"slotd-test-{os.getpid()}-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    with sock:
        yield sock, "@" + name


def test_notify_sends_one_datagram_with_all_lines_to_a_path_socket(
    path_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, address = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert notify("READY=1", "STATUS=4 slots serving, 0 in flight") is True
    assert sock.recv(4096) == b"READY=1\nSTATUS=4 slots serving, 0 in flight"


def test_notify_treats_a_leading_at_as_the_abstract_namespace(
    abstract_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, address = abstract_socket
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert notify("WATCHDOG=1") is True
    assert notify("STOPPING=1") is True
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert sock.recv(4096) == b"STOPPING=1"


def test_notify_is_a_no_op_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    assert notify("READY=1") is False


def test_notify_failure_returns_false_and_logs_instead_of_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    with caplog.at_level(logging.DEBUG, logger="slotd.sdnotify"):
        assert notify("READY=1") is False
    assert any("gone.sock" in record.getMessage() for record in caplog.records)


def test_notify_refuses_a_relative_socket_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with sock:
        sock.bind(str(tmp_path / "rel.sock"))
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("NOTIFY_SOCKET", "rel.sock")
        assert notify("READY=1") is False
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(4096)


def test_notify_to_a_stream_socket_fails_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A socket of the wrong type raises EPROTOTYPE deep in sendto; the caller must not see it.
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with stream:
        stream.bind(str(tmp_path / "stream.sock"))
        stream.listen()
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "stream.sock"))
        assert notify("READY=1") is False


def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 15.0


def test_watchdog_interval_ignores_a_watchdog_meant_for_another_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert watchdog_interval() is None


@pytest.mark.parametrize(
    ("usec", "pid"),
    [(None, None), ("", None), ("0", None), ("-5", None), ("soon", None), ("30000000", "me")],
)
def test_watchdog_interval_is_none_when_unset_or_malformed(
    usec: str | None, pid: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert watchdog_interval() is None
