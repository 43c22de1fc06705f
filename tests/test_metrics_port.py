"""Two `slotd run` on one host with no settings (two replicas, or `slotd examples demo` beside
a worker): the default metrics address is taken by the first, so the second serves on a free
port and says which in one warning. An address someone chose that is taken is a one-line
refusal, exit 2: a scraper or a probe points there."""

from __future__ import annotations

import re
import socket
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from slotd.config import DEFAULT_METRICS_ADDR
from tests.daemon import Daemon

FELL_BACK = re.compile(
    r"metrics: (\S+) is in use .*; serving /metrics, /healthz and /readyz on 127\.0\.0\.1:(\d+)"
)


def _listening(host: str, port: int) -> socket.socket | None:
    sock = socket.socket()
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


@pytest.fixture
def default_port_taken() -> Iterator[None]:
    """Whoever else holds 127.0.0.1:9464 on this machine, it is held for the test's length
    (by the test itself when it was free), so the replicas below meet a taken default."""
    host, port = DEFAULT_METRICS_ADDR.rsplit(":", 1)
    held = _listening(host, int(port))
    try:
        yield
    finally:
        if held is not None:
            held.close()


def _metrics(port: int) -> str:
    # /metrics, not /healthz: health may say 503 for a moment on a loaded machine (a slot
    # still starting), and what is asserted here is only that the port is this replica's.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_two_replicas_without_settings_both_run_and_say_where_metrics_went(
    db_url: str, daemons: list[Daemon], default_port_taken: None
) -> None:
    ports = []
    for _ in range(2):
        daemon = Daemon(db_url, slots=1)
        daemon.env.pop("SLOTD_METRICS_ADDR")  # no settings, as a new user runs it
        daemons.append(daemon.start())
        warnings = [line for line in daemon.lines if FELL_BACK.search(line)]
        assert len(warnings) == 1, daemon.lines
        match = FELL_BACK.search(warnings[0])
        assert match is not None and match.group(1) == DEFAULT_METRICS_ADDR
        assert "WARNING" in warnings[0]
        ports.append(int(match.group(2)))
        assert not any("Traceback" in line for line in daemon.lines)
    assert len(set(ports)) == 2 and DEFAULT_METRICS_ADDR.endswith(":9464")
    for port in ports:
        assert "slotd_tasks_pending" in _metrics(port)
    for daemon in daemons:
        assert daemon.proc is not None and daemon.proc.poll() is None


def test_a_chosen_address_that_is_taken_is_one_line_exit_2(db_url: str) -> None:
    held = _listening("127.0.0.1", 0)
    assert held is not None
    try:
        port = held.getsockname()[1]
        daemon = Daemon(db_url, slots=1, env={"SLOTD_METRICS_ADDR": f"127.0.0.1:{port}"})
        done = subprocess.run(
            daemon.cmd, env=daemon.env, cwd=daemon.cwd, capture_output=True, text=True, timeout=60
        )
    finally:
        held.close()
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"slotd: cannot serve metrics on 127.0.0.1:{port}: Address already in use; set "
        "SLOTD_METRICS_ADDR (or --metrics-addr) to a free host:port, port 0 for any free one, "
        "or off"
    ]
    # The flag is a choice too.
    flagged = subprocess.run(
        [*daemon.cmd, "--metrics-addr", "256.0.0.1:9"],
        env={**daemon.env, "SLOTD_METRICS_ADDR": "off"},
        cwd=daemon.cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert flagged.returncode == 2, flagged.stderr
    assert len(flagged.stderr.splitlines()) == 1
    assert flagged.stderr.startswith("slotd: cannot serve metrics on 256.0.0.1:9: ")
