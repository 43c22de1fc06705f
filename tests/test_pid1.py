"""The Kubernetes shape: `slotd run` as PID 1 of its own PID namespace, started with exactly
the chart's container command and environment, stopped with SIGTERM as the kubelet does.

`unshare --pid --fork --mount-proc` is what a container runtime does to a pod's command: the
supervisor is pid 1, its slots see getppid() == 1, and every orphan in the namespace is
re-parented to it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
import yaml

import slotd
from tests.daemon import ROOT, Daemon, wait_for

CHART = ROOT / "helm" / "slotd"


def chart_command() -> list[str]:
    """The worker container's command, read from the chart's template itself."""
    template = (CHART / "templates" / "deployment.yaml").read_text()
    match = re.search(r"^\s*command:\s*(\[.*\])\s*$", template, re.M)
    assert match, "the deployment template has no one-line command"
    return list(json.loads(match.group(1)))


def chart_values() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def termination_grace_seconds(values: dict[str, Any]) -> int:
    """terminationGracePeriodSeconds as the chart derives it (slotd.graceSeconds + margin);
    tests/test_helm.py pins the template against a real helm."""
    grace = str(values["shutdownGrace"])
    seconds = int(grace[:-1]) * 60 if grace.endswith("m") else int(grace.rstrip("s"))
    return seconds + int(values["terminationGraceMarginSeconds"])


def chart_env(values: dict[str, Any], db_url: str) -> dict[str, str]:
    config = values["config"]
    return {
        "SLOTD_APP": "tests.apps.runtime:registry",
        "SLOTD_DATABASE_URL": db_url,
        "SLOTD_LOG_FORMAT": "text",  # the chart says json; the test reads text lines
        "SLOTD_SLOTS": "2",
        "SLOTD_SHUTDOWN_GRACE": str(values["shutdownGrace"]),
        "SLOTD_POLL_INTERVAL": config["pollInterval"],
        "SLOTD_LEASE_MARGIN": config["leaseMargin"],
        "SLOTD_MAX_ATTEMPTS": str(config["maxAttempts"]),
        "SLOTD_BACKOFF_BASE": config["backoffBase"],
        "SLOTD_BACKOFF_CAP": config["backoffCap"],
        "SLOTD_RETENTION": config["retention"],
        "SLOTD_METRICS_ADDR": "off",  # the chart binds 0.0.0.0:9464; tests run side by side
        "SLOTD_KILL_GRACE": "1s",  # keeps the watchdog kill below quick; the chart's is 5s
        # The test's virtualenv first, so `slotd` is this checkout's console script.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def _unshare_works() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"unshare --pid cannot make a PID namespace here: {probe.stderr.strip()}"
    return None


class ZombieWatch:
    """Samples the namespace's processes and remembers every zombie it saw, and for how long."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.first_seen: dict[int, float] = {}
        self.last_seen: dict[int, float] = {}
        self.most_at_once = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ZombieWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def zombies(self) -> list[int]:
        try:
            family = psutil.Process(self.root).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for p in family:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    found.append(p.pid)
            except psutil.NoSuchProcess:
                continue
        return found

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            now = time.monotonic()
            found = self.zombies()
            self.most_at_once = max(self.most_at_once, len(found))
            for pid in found:
                self.first_seen.setdefault(pid, now)
                self.last_seen[pid] = now

    def longest(self) -> float:
        return max((self.last_seen[p] - self.first_seen[p] for p in self.first_seen), default=0)


def inner_pids(root: int) -> set[int]:
    """The pids the namespace's own processes see (NSpid's last field), for matching the
    pids its handlers record."""
    found = set()
    try:
        family = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for p in family:
        try:
            status = Path(f"/proc/{p.pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^NSpid:\s*(.*)$", status, re.M)
        if match:
            found.add(int(match.group(1).split()[-1]))
    return found


@pytest.fixture(scope="module")
def unshare_ok() -> None:
    reason = _unshare_works()
    if reason:
        pytest.skip(reason)


def test_pid_1_serves_reaps_orphans_and_stops_cleanly_on_sigterm(
    unshare_ok: None, qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    values = chart_values()
    daemon = Daemon(db_url, env=chart_env(values, db_url))
    daemon.cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *chart_command()]
    daemons.append(daemon)
    daemon.start()  # "serving": both slots came up and READY would be sent
    [init] = wait_for(lambda: psutil.Process(daemon.pid).children(), what="the namespace's pid 1")

    with ZombieWatch(daemon.pid) as zombies:
        ids = slotd.enqueue_many(
            qconn,
            [("rt.orphans", {}) for _ in range(4)]
            + [("rt.noop", {}) for _ in range(6)]
            + [("rt.grandchild", {})],
        )
        *work, killed = ids
        wait_for(
            lambda: (
                qconn.execute(
                    "SELECT count(*) FROM slotd_tasks WHERE id = ANY(%s)", (work,)
                ).fetchone()
                == (0,)
            ),
            what="the tasks to run",
        )
        # The grandchild's runner is killed at its deadline; its `sleep` dies with the group
        # and is re-parented to pid 1, like the orphans' helpers.
        sleeper = int(
            wait_for(
                lambda: qconn.execute(
                    "SELECT note FROM executions WHERE task_id = %s", (killed,)
                ).fetchone(),
                what="the grandchild to start",
            )[0]
        )
        wait_for(
            lambda: qconn.execute(
                "SELECT 1 FROM slotd_tasks WHERE id = %s AND lease_token IS NULL"
                " AND last_error IS NOT NULL",
                (killed,),
            ).fetchone(),
            what="the watchdog to kill the grandchild's runner",
        )
        wait_for(
            lambda: sleeper not in inner_pids(daemon.pid), what="the killed sleep to be reaped"
        )
        # Supervisor, two slots, two runners: everything else has exited and been reaped.
        wait_for(lambda: len(init.children(recursive=True)) == 4, what="the orphans to go")
        wait_for(lambda: zombies.zombies() == [], what="no zombie in the namespace")

        polite = slotd.enqueue_many(qconn, [("rt.polite", {}), ("rt.polite", {})])
        wait_for(
            lambda: (
                qconn.execute(
                    "SELECT count(DISTINCT task_id) FROM executions WHERE task_id = ANY(%s)",
                    (polite,),
                ).fetchone()
                == (2,)
            ),
            what="two handlers in flight",
        )
        began = time.monotonic()
        init.send_signal(signal.SIGTERM)  # the kubelet signals the container's pid 1
        code = daemon.wait(termination_grace_seconds(values) + 30)
        took = time.monotonic() - began

    print(
        f"\npid 1: SIGTERM to exit {took:.2f}s (terminationGracePeriodSeconds "
        f"{termination_grace_seconds(values)}); zombies seen at once at most "
        f"{zombies.most_at_once}, longest-lived {zombies.longest():.2f}s"
    )
    assert code == 0
    assert took < termination_grace_seconds(values)
    rows = qconn.execute(
        "SELECT lease_token, attempt_count FROM slotd_tasks WHERE id = ANY(%s)", (polite,)
    ).fetchall()
    assert rows == [(None, 1), (None, 1)]  # both leases released, no attempt charged
    assert not [line for line in daemon.lines if "killed by SIGTERM" in line]
    assert zombies.zombies() == []
