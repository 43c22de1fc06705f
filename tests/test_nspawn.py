"""The systemd shape: the units in systemd/ under a real systemd as PID 1.

`systemd-nspawn --boot` boots this machine's own systemd in a container whose root is an
overlay of the host's `/` with a tmpfs upper layer, inside a private mount namespace, so
nothing is built and nothing on the host changes (see ../shared/FIELD-NOTES.md, systemd).
The container gets the units exactly as shipped, a `slotd` user, an environment file, this
checkout (read-only, at /opt/slotd) and this Python (read-only, at /opt/python), and reaches
the test's PostgreSQL through its unix socket. A heavy group: run with --systemd
(tests/systemd/run.sh, from .ci/run, installs systemd-container first)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

import slotd
from tests.daemon import ROOT, wait_for

pytestmark = pytest.mark.systemd

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PG_SOCKET = "/run/slotd-pg"
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
# The container runs this interpreter. One under /root, /home or /tmp (pyenv, say) would be
# hidden from the service by ProtectHome= and PrivateTmp=, so it is bound at /opt/python.
HIDDEN = sys.base_prefix.startswith(("/root", "/home", "/tmp"))
PY_HOME = "/opt/python" if HIDDEN else sys.base_prefix
PYTHON = f"{PY_HOME}/bin/{VERSION}"


class Container:
    """One booted container; `run` executes a command in all its namespaces."""

    def __init__(self, workdir: Path, stage: Path, binds: list[str]) -> None:
        self.workdir = workdir
        self.stage = stage
        self.binds = binds
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid1 = 0
        self.booted_in = 0.0

    def boot(self) -> Container:
        root = self.workdir / "root"
        script = self.workdir / "boot.sh"
        nspawn = [
            "systemd-nspawn",
            "--quiet",
            "--boot",
            f"--directory={root}/merged",
            "--register=no",  # the host's PID 1 is not systemd: no machined to register with
            "--keep-unit",
            "--private-network",  # no port clashes with the host or other containers
            *self.binds,
        ]
        script.write_text(
            "set -e\n"
            f"mkdir -p {root}\n"
            f"mount -t tmpfs tmpfs {root}\n"
            f"mkdir -p {root}/upper {root}/work {root}/merged\n"
            f"mount -t overlay overlay -o lowerdir=/,upperdir={root}/upper,workdir={root}/work"
            f" {root}/merged\n"
            f"cp -a {self.stage}/. {root}/merged/\n"
            f"chroot {root}/merged sh -c 'id slotd >/dev/null 2>&1 || "
            "useradd --system --no-create-home --home-dir /var/lib/slotd slotd'\n"
            # Pure cgroup v2: on the legacy hierarchy every `systemctl stop` waits its timeout.
            "export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1\n"
            f"exec {shlex.join(nspawn)}\n"
        )
        began = time.monotonic()
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", str(script)],
            stdin=subprocess.DEVNULL,
            stdout=open(self.workdir / "console.log", "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid1 = wait_for(self._find_pid1, timeout=60, what="the container's systemd")
        wait_for(self._booted, timeout=90, what="the container to finish booting")
        self.booted_in = time.monotonic() - began
        return self

    def _booted(self) -> bool:
        state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
        assert state not in ("maintenance", "stopping"), f"{state}\n{self.console()}"
        return state in ("running", "degraded")

    def _find_pid1(self) -> int | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"systemd-nspawn exited:\n{self.console()}")
        nspawn = psutil.Process(self.proc.pid)
        for p in nspawn.children(recursive=True):
            try:  # the container's PID 1, once the inner child has become systemd
                if p.exe().endswith("/systemd") and p.parent().exe().endswith("systemd-nspawn"):
                    return p.pid
            except psutil.Error:
                continue
        return None

    def run(
        self, *cmd: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        # env -i: the host's environment (PIP_*, PYTHONPATH...) stays out of the container.
        done = subprocess.run(
            ["nsenter", "-t", str(self.pid1), "-a", "env", "-i", f"PATH={PATH}", *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            journal = self.run("journalctl", "--no-pager", "-n", "40", check=False).stdout
            raise AssertionError(
                f"{cmd} exited {done.returncode}:\n{done.stdout}{done.stderr}\n{journal}"
            )
        return done

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str) -> str:
        return self.run("journalctl", "-u", unit, "--no-pager", "-n", "60", check=False).stdout

    def console(self) -> str:
        path = self.workdir / "console.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def close(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # nspawn asks the container to power off
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _nspawn_missing() -> str | None:
    for tool in ("systemd-nspawn", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install systemd-container util-linux)"
    if os.geteuid() != 0:
        return "booting a container needs root"
    return None


@pytest.fixture
def container(db_url: str, tmp_path: Path) -> Iterator[Container]:
    reason = _nspawn_missing()
    if reason:
        pytest.skip(reason)
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    stage = tmp_path / "stage"
    units = stage / "etc/systemd/system"
    units.mkdir(parents=True)
    for name in ("slotd.service", "slotd-migrate.service"):
        shutil.copy(ROOT / "systemd" / name, units / name)
    env = stage / "etc/slotd/slotd.env"
    env.parent.mkdir(parents=True)
    url = f"postgresql://{info['user']}@/{info['dbname']}?host={PG_SOCKET}&port={info['port']}"
    env.write_text(
        "SLOTD_APP=tests.apps.runtime:registry\n"
        f"SLOTD_DATABASE_URL={url}\n"
        "SLOTD_SLOTS=2\n"
        "SLOTD_POLL_INTERVAL=1s\n"
        "SLOTD_SHUTDOWN_GRACE=3s\n" + (f"LD_LIBRARY_PATH={PY_HOME}/lib\n" if HIDDEN else "")
        # The bound interpreter's own libpython, not the distribution's: its rpath points
        # into the hidden directory.
    )
    env.chmod(0o644)
    console = stage / "usr/local/bin/slotd"
    console.parent.mkdir(parents=True)
    # The console script pip would write, pointing at the bound checkout and interpreter.
    console.write_text(
        f"#!{PYTHON}\nimport sys\nsys.path.insert(0, '/opt/slotd')\n"
        "from slotd.cli import main\nsys.exit(main())\n"
    )
    console.chmod(0o755)
    socket_dir = str(info["host"])
    os.chmod(socket_dir, os.stat(socket_dir).st_mode | 0o005)  # the slotd user may connect
    binds = [
        f"--bind-ro={ROOT}:/opt/slotd",
        *([f"--bind-ro={sys.base_prefix}:{PY_HOME}"] if HIDDEN else []),
        f"--bind={socket_dir}:{PG_SOCKET}",
    ]
    box = Container(tmp_path, stage, binds)
    try:
        yield box.boot()
    finally:
        box.close()


def _started(conn: psycopg.Connection[Any], ids: list[int]) -> bool:
    found = conn.execute(
        "SELECT count(DISTINCT task_id) FROM executions WHERE task_id = ANY(%s)", (ids,)
    ).fetchone()
    return found == (len(ids),)


def test_units_under_a_real_systemd_ready_stop_and_watchdog(
    container: Container, qconn: psycopg.Connection[Any]
) -> None:
    container.run("systemctl", "start", "slotd-migrate.service")

    # Type=notify: `systemctl start` returns only once slotd sent READY=1, which goes out
    # with STATUS=serving... in the same datagram.
    began = time.monotonic()
    container.run("systemctl", "start", "slotd.service", timeout=150)
    to_ready = time.monotonic() - began
    state = container.show("slotd.service", "ActiveState", "StatusText", "MainPID")
    assert state["ActiveState"] == "active", container.journal("slotd.service")
    assert state["StatusText"].startswith("serving"), state

    # Tasks in flight, then `systemctl stop`: leases released, unit inactive, not failed.
    ids = slotd.enqueue_many(qconn, [("rt.polite", {}), ("rt.polite", {})])
    wait_for(lambda: _started(qconn, ids), timeout=30, what="two handlers in the container")
    began = time.monotonic()
    container.run("systemctl", "stop", "slotd.service", timeout=120)
    to_stop = time.monotonic() - began
    state = container.show("slotd.service", "ActiveState", "Result")
    assert (state["ActiveState"], state["Result"]) == ("inactive", "success"), container.journal(
        "slotd.service"
    )
    rows = qconn.execute(
        "SELECT lease_token, attempt_count FROM slotd_tasks WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert rows == [(None, 1), (None, 1)]

    # A supervisor stopped with SIGSTOP sends no WATCHDOG=1: systemd ends it. The unit's
    # WatchdogSec (30 s) is shortened by a drop-in so the test does not wait half a minute.
    container.run(
        "sh",
        "-c",
        "mkdir -p /etc/systemd/system/slotd.service.d && printf '[Service]\\nWatchdogSec=3s\\n'"
        " > /etc/systemd/system/slotd.service.d/watchdog.conf && systemctl daemon-reload",
    )
    container.run("systemctl", "start", "slotd.service", timeout=150)
    main_pid = container.show("slotd.service", "MainPID")["MainPID"]
    container.run("kill", "-STOP", main_pid)
    stopped = time.monotonic()
    wait_for(
        lambda: container.show("slotd.service", "Result")["Result"] == "watchdog",
        timeout=60,
        what="systemd's watchdog to end the stopped supervisor",
    )
    to_watchdog = time.monotonic() - stopped
    print(
        f"\nnspawn: container boot {container.booted_in:.2f}s; systemctl start -> READY "
        f"{to_ready:.2f}s; systemctl stop with 2 tasks in flight {to_stop:.2f}s; SIGSTOP -> "
        f"Result=watchdog {to_watchdog:.2f}s (WatchdogSec=3s)"
    )
